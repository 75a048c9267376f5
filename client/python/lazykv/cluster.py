"""lazykv.cluster: a client for a cluster of lazykvd that sends each call to its document's owner.

The owner of a document is chosen exactly as the daemons choose it (proto/lkv_route.h): the
routing hash of (profile fingerprint, token ids), free of the tenant's salt, and weighted
rendezvous hashing over the members that are "up", weighted by hot capacity. ClusterClient reads
the members and the profiles' fingerprints from lazykv.v1.Cache/Cluster of any member, keeps one
lazykv.Client per member, and on NotOwner (a member's view moved on) or Unavailable (the owner
died and is not marked down yet) re-reads the cluster and tries again every 0.1 s until the
call's timeout: no call outlives its timeout; once the dead owner is marked down its documents
have a new owner, where they are misses until re-put.

    import lazykv.cluster
    with lazykv.cluster.ClusterClient("10.0.0.5:7070,10.0.0.6:7070", token=TOKEN) as kv:
        kv.put("llama-3.1-8b", tokens, blocks)
        kv.lookup([lazykv.Doc("llama-3.1-8b", tokens)])
"""

import hashlib
import math
import struct
import threading
import time

from . import errors
from .client import Client, Doc

__all__ = ["route_hash", "member_seed", "score", "pick_owner", "ClusterClient"]

_MASK = (1 << 64) - 1


def route_hash(fingerprint, tokens):
    """The routing hash (int, 64 bits) of a document: proto/lkv_route.h."""
    if len(fingerprint) != 32:
        raise errors.InvalidArgument("a profile fingerprint is 32 bytes")
    h = hashlib.blake2b(digest_size=16)
    h.update(b"lazykv-route-v1")
    h.update(bytes(fingerprint))
    h.update(struct.pack("<%dI" % len(tokens), *tokens))
    return int.from_bytes(h.digest()[:8], "little")


def member_seed(member_id):
    """The rendezvous seed of a member id."""
    h = hashlib.blake2b(digest_size=16)
    h.update(b"lazykv-member-v1")
    h.update(member_id.encode())
    return int.from_bytes(h.digest()[:8], "little")


def _splitmix64(x):
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def score(seed, weight, route):
    """Weighted rendezvous score of a member (seed, weight) for a routing hash."""
    x = _splitmix64(seed ^ route)
    u = ((x >> 11) + 0.5) / 9007199254740992.0
    return float(weight or 1) / -math.log(u)


def pick_owner(members, route):
    """members: iterable of (id, weight). Returns the owner's id (None if empty)."""
    best, best_s = None, 0.0
    for mid, w in members:
        s = score(member_seed(mid), w, route)
        if best is None or s > best_s or (s == best_s and mid < best):
            best, best_s = mid, s
    return best


class ClusterClient:
    """Routes every call to the document's owner; see the module docstring.

    seeds: "host:port[,host:port]" or a list of addresses; token, timeout and max_message_bytes
    as for lazykv.Client (used for every member).
    """

    def __init__(self, seeds, token=None, timeout=30.0, **client_kw):
        self.seeds = seeds.split(",") if isinstance(seeds, str) else list(seeds)
        self.timeout = timeout
        self._kw = dict(client_kw, token=token, timeout=timeout)
        self._mu = threading.Lock()
        self._clients = {}
        self.members = []  # lazykv.v1 ClusterMember messages of the last view.
        self.profiles = {}  # name -> fingerprint
        self.mode = None
        self.refresh()

    def close(self):
        with self._mu:
            for c in self._clients.values():
                c.close()
            self._clients.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def member(self, addr):
        """The lazykv.Client of member addr (created on first use)."""
        with self._mu:
            c = self._clients.get(addr)
            if c is None:
                c = self._clients[addr] = Client(addr, **self._kw)
            return c

    def refresh(self, timeout=None):
        """Re-reads the cluster from an up member (else a seed)."""
        cands = [m.addr for m in self.members if m.state == "up"] + self.seeds
        last = errors.Unavailable("no member answered")
        end = time.monotonic() + (timeout or self.timeout)
        for addr in cands:
            left = end - time.monotonic()
            if left <= 0:
                break
            try:
                r = self.member(addr).cluster(timeout=min(left, 0.5))
            except errors.LazyKVError as e:
                last = e
                continue
            with self._mu:
                self.members = list(r.members)
                self.profiles = {p.name: bytes(p.fingerprint) for p in r.profiles}
                self.mode = r.mode
            return r
        raise last

    def route(self, profile, tokens):
        fp = self.profiles.get(profile)
        return None if fp is None else route_hash(fp, list(tokens))

    def owner(self, profile, tokens):
        """Address of the owner of (profile, tokens) now, or None if it cannot be routed."""
        r = self.route(profile, tokens)
        if r is None:
            return None
        with self._mu:
            up = [(m.id, m.hot_bytes) for m in self.members if m.state == "up"]
            by_id = {m.id: m.addr for m in self.members}
        owner = pick_owner(up, r)
        return by_id.get(owner)

    def _any(self):
        with self._mu:
            for m in self.members:
                if m.state == "up":
                    return m.addr
        return self.seeds[0]

    def _routed(self, profile, tokens, fn, timeout):
        end = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            addr = self.owner(profile, tokens) or self._any()
            try:
                return fn(self.member(addr), max(0.001, end - time.monotonic()))
            except (errors.Unavailable, errors.LazyKVError) as e:
                retry = isinstance(e, errors.Unavailable) or e.lkv_code == "LKV_ENOTOWNER"
                if not retry:
                    raise
                if end - time.monotonic() <= 0.1:
                    if isinstance(e, errors.Unavailable):
                        raise errors.DeadlineExceeded(f"owner {addr} unreachable: {e}") from None
                    raise
                time.sleep(0.1)
                try:
                    self.refresh(timeout=min(1.0, max(0.01, end - time.monotonic())))
                except errors.LazyKVError:
                    pass

    def put(self, profile, tokens, blocks, *, timeout=None):
        blocks = list(blocks)  # A retry sends them again.
        return self._routed(profile, tokens,
                            lambda c, t: c.put(profile, tokens, blocks, timeout=t), timeout)

    def get(self, *, profile, tokens, timeout=None):
        return self._routed(profile, tokens,
                            lambda c, t: c.get(profile=profile, tokens=tokens, timeout=t),
                            timeout)

    def delete(self, *, profile, tokens, timeout=None):
        return self._routed(profile, tokens,
                            lambda c, t: c.delete(profile=profile, tokens=tokens, timeout=t),
                            timeout)

    def lookup(self, docs, *, timeout=None):
        """Lookup of Doc / (profile, tokens) items, one call per owner, in request order."""
        docs = [d if isinstance(d, Doc) else Doc(*d) for d in docs]
        out = [None] * len(docs)
        groups = {}
        for i, d in enumerate(docs):
            groups.setdefault(self.owner(d.profile, d.tokens), []).append(i)
        for _, idx in groups.items():
            d0 = docs[idx[0]]
            res = self._routed(d0.profile, d0.tokens,
                               lambda c, t, idx=idx: c.lookup([docs[i] for i in idx], timeout=t),
                               timeout)
            for i, s in zip(idx, res):
                out[i] = s
        return out
