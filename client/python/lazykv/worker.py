"""lazykv.WorkerClient: the Python client of the decode worker's lazykv.v1.Worker service.

    import lazykv
    with lazykv.WorkerClient("127.0.0.1:7080") as w:
        for tok in w.generate(["doc text", "another doc"], "Question?", max_tokens=32):
            print(tok.text, end="")
        print(w.last_summary.ttft_ms)
        res = w.run(["doc text"], "Question?")      # everything at once: a Generation

``generate`` streams Token objects (index, id, text) as the worker produces them and stores the
final Summary (timings, per-document hits) in ``last_summary`` of the returned stream object
(``GenerationStream``); ``run`` collects the whole generation. Documents are strings (text,
tokenized by the worker) or sequences of token ids. Every call takes ``timeout`` in seconds (the
gRPC deadline: the worker frees the request's batch slot and KV when it passes); a stream can be
cancelled (``stream.cancel()``), which frees them at once too. Errors are the typed
lazykv.errors classes (DeadlineExceeded, Cancelled, ResourceExhausted, InvalidArgument, ...),
mapped from the status and the exact "lkv-code" (proto/lazykv/v1/worker.proto lists them).
"""

import dataclasses

import grpc

from .errors import from_rpc_error

try:
    from lazykv.v1 import cache_pb2, worker_pb2, worker_pb2_grpc
except ImportError as e:  # pragma: no cover - a packaging problem
    raise ImportError("lazykv: the generated gRPC stubs are missing (worker_pb2); build the "
                      f"lazykv_python target ({e})") from e

__all__ = ["WorkerClient", "Token", "DocResult", "Summary", "Generation", "GenerationStream"]

_TIER = {
    cache_pb2.TIER_UNSPECIFIED: "local",
    cache_pb2.TIER_HOT: "hot",
    cache_pb2.TIER_COLD: "cold",
    cache_pb2.TIER_ABSENT: "absent",
}


@dataclasses.dataclass(frozen=True)
class Token:
    index: int
    id: int
    text: str


@dataclasses.dataclass(frozen=True)
class DocResult:
    hit: bool  # Read in place from lazykvd's arena.
    tier: str  # "hot", "cold", "absent" at Lookup, or "local".
    n_tokens: int
    start: int  # Its first token's position in the prompt.
    n_blocks: int
    stored: int  # Miss: 1 stored by Put, 0 not tried, < 0 the Put's error code.
    key_hex: str


@dataclasses.dataclass(frozen=True)
class Summary:
    id: str
    n_out: int
    stop_eos: bool
    n_prompt: int
    queue_ms: float
    ttft_ms: float
    tpot_ms: float
    total_ms: float
    lookup_ms: float
    attach_ms: float
    miss_ms: float
    put_ms: float
    docs: tuple
    hit_docs: int
    miss_docs: int
    hit_tokens: int
    miss_tokens: int
    zero_copy_blocks: int
    local_only: bool
    max_batch_seen: int  # Largest decode batch this request was part of.
    kv_pages: int  # Worker KV pages reserved for it.
    note: str
    text: str


@dataclasses.dataclass(frozen=True)
class Generation:
    tokens: tuple  # Token ids.
    text: str
    summary: Summary


def _summary(s):
    docs = tuple(DocResult(d.hit, _TIER.get(d.tier, str(d.tier)), d.n_tokens, d.start, d.n_blocks,
                           d.stored, d.key_hex) for d in s.docs)
    return Summary(s.id, s.n_out, s.stop_eos, s.n_prompt, s.queue_ms, s.ttft_ms, s.tpot_ms,
                   s.total_ms, s.lookup_ms, s.attach_ms, s.miss_ms, s.put_ms, docs, s.hit_docs,
                   s.miss_docs, s.hit_tokens, s.miss_tokens, s.zero_copy_blocks, s.local_only,
                   s.max_batch_seen, s.kv_pages, s.note, s.text)


class GenerationStream:
    """Iterates the Tokens of one Generate call; ``summary`` is set once the stream ended."""

    def __init__(self, call):
        self._call = call
        self.summary = None

    def __iter__(self):
        try:
            for rep in self._call:
                kind = rep.WhichOneof("kind")
                if kind == "token":
                    yield Token(rep.token.index, rep.token.id, rep.token.text)
                elif kind == "summary":
                    self.summary = _summary(rep.summary)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def cancel(self):
        """Cancels the generation (the worker frees its slot and KV at once)."""
        self._call.cancel()


def _doc(d):
    if isinstance(d, str):
        return worker_pb2.Document(text=d)
    return worker_pb2.Document(tokens=list(d))


class WorkerClient:
    """One channel to a lazykv-worker --serve; thread-safe (share it)."""

    def __init__(self, target, timeout=60.0, options=()):
        self.timeout = timeout
        self._channel = grpc.insecure_channel(target, options=list(options))
        self._generate = self._channel.unary_stream(
            "/lazykv.v1.Worker/Generate",
            request_serializer=worker_pb2.GenerateRequest.SerializeToString,
            response_deserializer=worker_pb2.GenerateReply.FromString)

    def close(self):
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @staticmethod
    def request(docs, question, max_tokens=0, temperature=0.0, top_p=0.0, seed=0,
                stop_at_eos=True, bos=True, mode="lazy", cache=True, id=""):
        """The GenerateRequest message of these arguments."""
        q = {"question": question} if isinstance(question, str) else {
            "question_tokens": list(question)}
        if mode not in ("lazy", "materialise"):
            raise ValueError(f"mode must be 'lazy' or 'materialise', not {mode!r}")
        return worker_pb2.GenerateRequest(
            id=id, docs=[_doc(d) for d in docs], max_tokens=max_tokens,
            sampling=worker_pb2.Sampling(temperature=temperature, top_p=top_p, seed=seed),
            ignore_eos=not stop_at_eos, no_bos=not bos,
            mode=worker_pb2.MODE_MATERIALISE if mode == "materialise" else worker_pb2.MODE_LAZY,
            no_cache=not cache, **q)

    def generate(self, docs, question, timeout=None, **kw):
        """Starts a generation; returns a GenerationStream of Tokens (see the module doc)."""
        call = self._generate(self.request(docs, question, **kw),
                              timeout=self.timeout if timeout is None else timeout)
        return GenerationStream(call)

    def run(self, docs, question, timeout=None, **kw):
        """The whole generation: a Generation (token ids, text, summary)."""
        st = self.generate(docs, question, timeout=timeout, **kw)
        toks = [t.id for t in st]
        return Generation(tuple(toks), st.summary.text if st.summary else "", st.summary)
