"""Bearer tokens for lazykv tenants: make a token and the config section that admits it.

The daemon stores only ``BLAKE2b-256(key=auth_key or none, "lazykv-token-v1:" || token)``
(daemon/lkv_auth.h); this module computes the same hash with hashlib, so an operator can
provision a tenant without the daemon binary::

    python3 -m lazykv.tenant new alice --roles data
    # prints the token (give it to the tenant) and the [tenant alice] section for lazykvd.conf
"""

import argparse
import base64
import hashlib
import secrets
import sys

__all__ = ["hash_token", "new_token", "tenant_section", "main"]

TOKEN_DOMAIN = b"lazykv-token-v1:"
HASH_PREFIX = "blake2b:"
TOKEN_MAX = 512
ROLES = ("data", "worker", "admin")


def hash_token(token, key=None):
    """Returns the config value ``blake2b:<64 hex>`` for token (str or bytes).

    key: the daemon's optional 32-byte auth key (bytes), or None.
    """
    raw = token.encode() if isinstance(token, str) else bytes(token)
    if not 1 <= len(raw) <= TOKEN_MAX:
        raise ValueError(f"a token is 1..{TOKEN_MAX} bytes, got {len(raw)}")
    if key is not None and len(key) != 32:
        raise ValueError(f"the auth key is 32 bytes, got {len(key)}")
    h = hashlib.blake2b(TOKEN_DOMAIN + raw, digest_size=32, key=key or b"")
    return HASH_PREFIX + h.hexdigest()


def new_token():
    """Returns a fresh token: "lkv_" and base64url of 32 random bytes (47 characters)."""
    return "lkv_" + base64.urlsafe_b64encode(secrets.token_bytes(32)).decode().rstrip("=")


LIMITS = ("max_hot_bytes", "max_cold_bytes", "max_docs", "rate_calls", "rate_bytes")


def tenant_section(name, token, roles=("data",), key=None, **limits):
    """Returns the ``[tenant NAME]`` config section that admits token with roles, plus any
    quotas and rates given as keywords (max_hot_bytes="1GiB", rate_calls=500, ...: see
    daemon/lazykvd.conf)."""
    bad = [r for r in roles if r not in ROLES]
    if bad or not roles:
        raise ValueError(f"roles must be a non-empty subset of {', '.join(ROLES)}; got {roles}")
    unknown = [k for k in limits if k not in LIMITS]
    if unknown:
        raise ValueError(f"unknown limits {unknown}; known: {', '.join(LIMITS)}")
    extra = "".join(f"{k} = {v}\n" for k, v in limits.items() if v is not None)
    return (f"[tenant {name}]\n"
            f"token_hash = {hash_token(token, key)}\n"
            f"roles = {','.join(roles)}\n" + extra)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m lazykv.tenant",
                                 description="Make lazykv bearer tokens and tenant sections.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("new", help="make a new token and its [tenant NAME] section")
    n.add_argument("name")
    n.add_argument("--roles", default="data", help="comma list of data, worker, admin")
    for lim in LIMITS:
        n.add_argument("--" + lim.replace("_", "-"), default=None, dest=lim,
                       help="quota or rate (see lazykvd.conf), e.g. 1GiB or 500")
    h = sub.add_parser("hash", help="print the token_hash line of an existing token (stdin)")
    for p in (n, h):
        p.add_argument("--key-hex", default=None,
                       help="the daemon's auth_key option (64 hex digits), if it sets one")
    args = ap.parse_args(argv)
    key = bytes.fromhex(args.key_hex) if args.key_hex else None
    if args.cmd == "new":
        token = new_token()
        roles = tuple(r.strip() for r in args.roles.split(",") if r.strip())
        print(f"# token for tenant {args.name} (give it to the tenant; it is not stored):")
        print(f"# {token}")
        limits = {k: getattr(args, k) for k in LIMITS if getattr(args, k) is not None}
        print(tenant_section(args.name, token, roles, key, **limits), end="")
        return 0
    token = sys.stdin.readline().strip()
    print(f"token_hash = {hash_token(token, key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
