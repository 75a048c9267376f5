"""integration.worker_serve: lazykvd + `lazykv-worker --serve` (the lazykv.v1.Worker service
over the serving engine), driven through the Python package's WorkerClient.

Checks, on the tiny model (stories260K, greedy unless said):
  1. solo: each request alone gives its tokens; they equal lazykv-worker's one-request-at-a-time
     path (`--requests`, no engine) for the same requests;
  2. batch: the same requests sent at once (threads) give each request exactly its solo tokens,
     with decode batches of more than one request observed (max_batch_seen > 1) and never more
     than --max-batch; the warm run hits the documents the first run stored;
  3. cancellation mid-stream: the client cancels after a few tokens; the worker frees the slot:
     a following request that needs the whole KV budget is admitted and completes;
  4. deadline: a generation longer than its deadline ends DEADLINE_EXCEEDED (typed), and the
     worker serves the next request normally;
  5. a request that needs more KV pages than the in-flight limit is RESOURCE_EXHAUSTED;
     bad input is INVALID_ARGUMENT.
Environment: LKV_DAEMON_BIN, LKV_WORKER_BIN, LKV_MODEL_DIR, LKV_PY_PACKAGE (build/python),
LKV_PROTO_PY.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.environ["LKV_PY_PACKAGE"])
try:
    import lazykv  # noqa: E402
except ImportError:
    sys.stderr.write("SKIP: no grpc module (run with /usr/bin/python3)\n")
    sys.exit(77)

SCALE = max(1.0, float(os.environ.get("LKV_TEST_TIMEOUT_SCALE", "1") or 1))


class harness:  # noqa: N801  (the two things of harness.py this test needs, without its stubs)
    @staticmethod
    def timeout(s):
        return s * SCALE

    class Daemon:
        """A real lazykvd on 127.0.0.1 port 0 in a temporary folder, host arena."""

        def __init__(self, extra=()):
            self.dir = tempfile.mkdtemp(prefix="lkv-it-serve-")
            self.extra = list(extra)
            self.proc = None

        def __enter__(self):
            return self

        def start(self):
            log = os.path.join(self.dir, "lazykvd.log")
            with open(log, "ab") as f:
                self.proc = subprocess.Popen(
                    [os.environ["LKV_DAEMON_BIN"], "--set", "listen=127.0.0.1:0", "--set",
                     "data_dir=" + os.path.join(self.dir, "data"), "--set", "hot_backend=host"]
                    + self.extra, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            end = time.monotonic() + harness.timeout(30)
            while time.monotonic() < end:
                for line in open(log, encoding="utf-8", errors="replace"):
                    if "lazykvd listening on " in line:
                        self.addr = line.split("lazykvd listening on ", 1)[1].split()[0]
                        return self
                time.sleep(0.02)
            raise RuntimeError("lazykvd did not start (log %s)" % log)

        def __exit__(self, *exc):
            if self.proc is not None and self.proc.poll() is None:
                self.proc.send_signal(signal.SIGTERM)
                try:
                    self.proc.wait(harness.timeout(15))
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()

WORKER = os.environ["LKV_WORKER_BIN"]
MODELS = os.environ["LKV_MODEL_DIR"]
FAILS = []


def check(cond, what):
    if not cond:
        FAILS.append(what)
        sys.stderr.write("FAIL: %s\n" % what)
    else:
        sys.stderr.write("ok: %s\n" % what)


DOCS = ["Lily had a big red ball. She liked to throw it high.",
        "Tom went to the park with his dog. The dog ran fast.",
        "The sun was hot and the sky was blue.",
        "Sue found a little box under the tree. It was shiny.",
        "Ben and Mia built a tall tower of blocks."]
REQS = [
    dict(docs=[DOCS[0], DOCS[1]], question="Once upon a time", max_tokens=24),
    dict(docs=[DOCS[2]], question="One day,", max_tokens=30),
    dict(docs=[DOCS[3], DOCS[0], DOCS[4]], question="Lily said", max_tokens=18),
    dict(docs=[DOCS[1], DOCS[2]], question="The dog", max_tokens=28),
    dict(docs=[DOCS[4]], question="They were happy", max_tokens=20),
    dict(docs=[DOCS[0]], question="She", max_tokens=26, temperature=0.9, seed=7),
]


class Worker:
    def __init__(self, daemon_addr, *extra):
        self.log = tempfile.NamedTemporaryFile(prefix="lkv-worker-", suffix=".log", delete=False)
        argv = [WORKER, "--serve", "127.0.0.1:0", "--daemon", daemon_addr,
                "--model", os.path.join(MODELS, "stories260K.bin"),
                "--tokenizer", os.path.join(MODELS, "tok512.bin"), "--threads", "1"] + list(extra)
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.log,
                                     stdin=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        if "serving lazykv.v1.Worker on " not in line:
            raise RuntimeError("worker did not start: %r (log %s)" % (line, self.log.name))
        self.addr = line.rsplit(" ", 1)[1].strip()

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(harness.timeout(20))
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return -9


def solo_reference(daemon_addr):
    """lazykv-worker's one-request-at-a-time path (no engine), local only (no cache)."""
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for i, r in enumerate(REQS):
            line = {"id": str(i), "docs": r["docs"], "question": r["question"],
                    "max_tokens": r["max_tokens"], "cache": False}
            if "temperature" in r:
                line.update(temperature=r["temperature"], seed=r["seed"])
            f.write(json.dumps(line) + "\n")
    out = subprocess.run([WORKER, "--requests", f.name, "--json",
                          "--model", os.path.join(MODELS, "stories260K.bin"),
                          "--tokenizer", os.path.join(MODELS, "tok512.bin")],
                         capture_output=True, text=True, timeout=harness.timeout(60))
    os.unlink(f.name)
    return [json.loads(l)["tokens"] for l in out.stdout.splitlines() if l.strip()]


def main():
    with harness.Daemon(["--set", "hot_bytes=64MiB"]) as d:
        d.start()
        ref = solo_reference(d.addr)
        check(len(ref) == len(REQS), "reference path served every request")
        w = Worker(d.addr, "--max-batch", "4", "--local-pages", "40")
        try:
            with lazykv.WorkerClient(w.addr, timeout=harness.timeout(60)) as c:
                # 1. Solo through the service (cold: misses computed and stored).
                solo = []
                for r in REQS:
                    g = c.run(**r)
                    solo.append(list(g.tokens))
                check(solo == ref, "solo Generate == lazykv-worker's one-at-a-time tokens")
                g0 = c.run(**REQS[0])
                check(g0.summary.hit_docs == 2 and g0.summary.docs[0].hit,
                      "warm request reads its documents from lazykvd (hits)")
                check(g0.summary.max_batch_seen == 1, "a lone request decodes in batches of 1")
                # 2. All at once.
                got = [None] * len(REQS)
                sums = [None] * len(REQS)

                def one(i):
                    g = c.run(**REQS[i])
                    got[i] = list(g.tokens)
                    sums[i] = g.summary
                # A long companion keeps the engine busy, so the six overlap with it (and with
                # each other) however the threads are scheduled.
                comp = c.generate([DOCS[3]], "Once upon a time", max_tokens=400,
                                  stop_at_eos=False, cache=False)
                it = iter(comp)
                next(it)
                ths = [threading.Thread(target=one, args=(i,)) for i in range(len(REQS))]
                for t in ths:
                    t.start()
                for t in ths:
                    t.join()
                rest = sum(1 for _ in it)
                check(rest == 399 and comp.summary.max_batch_seen > 1,
                      "the companion ran to the end in batches (max %d)"
                      % comp.summary.max_batch_seen)
                check(got == solo, "a batch of different requests gives each its solo tokens")
                mb = max(s.max_batch_seen for s in sums if s is not None)
                check(1 < mb <= 4, "decode steps were batched (max batch seen %d, limit 4)" % mb)
                check(all(s.kv_pages > 0 for s in sums), "each request reserved KV pages")
                # 3. Cancellation mid-stream frees the slot and the pages.
                st = c.generate([DOCS[2]], "Once upon a time", max_tokens=200,
                                stop_at_eos=False, cache=False)
                n = 0
                try:
                    for _ in st:
                        n += 1
                        if n == 3:
                            st.cancel()
                    check(False, "cancelled stream raises")
                except lazykv.Cancelled:
                    check(n >= 3, "cancelled after %d tokens: lazykv.Cancelled" % n)
                # A request needing most of the 40 pages (the cancelled one holds 14): admitted
                # only once the cancelled one gave its pages back.
                big = c.run([DOCS[0]], "One day,", max_tokens=470, stop_at_eos=False,
                            cache=False, timeout=harness.timeout(120))
                check(len(big.tokens) == 470 and big.summary.kv_pages >= 31,
                      "after the cancel, a request of %d pages runs to the end"
                      % big.summary.kv_pages)
                # 4. Deadline mid-generation.
                t0 = time.monotonic()
                try:
                    c.run([DOCS[1]], "The dog", max_tokens=470, stop_at_eos=False,
                          cache=False, timeout=0.02)
                    check(False, "a generation past its deadline fails")
                except lazykv.DeadlineExceeded:
                    check(time.monotonic() - t0 < 5, "DEADLINE_EXCEEDED at the deadline")
                g = c.run(**REQS[1])
                check(list(g.tokens) == solo[1], "the worker serves normally after a deadline")
                # 5. Limits and bad input.
                try:
                    c.run(DOCS * 2, "x", max_tokens=340, stop_at_eos=False, cache=False,
                          mode="materialise")
                    check(False, "a request larger than the KV limit is refused")
                except lazykv.ResourceExhausted as e:
                    check("KV pages" in str(e), "RESOURCE_EXHAUSTED names the KV limit")
                try:
                    c.run([[100000]], "x")
                    check(False, "a token outside the vocabulary is refused")
                except lazykv.InvalidArgument:
                    check(True, "INVALID_ARGUMENT for a token outside the vocabulary")
                try:
                    c.run(["a"], "")
                    check(False, "an empty question is refused")
                except lazykv.InvalidArgument:
                    check(True, "INVALID_ARGUMENT for an empty question")
        finally:
            rc = w.stop()
            check(rc == 0, "lazykv-worker --serve drains on SIGTERM (status %s)" % rc)
    if FAILS:
        sys.stderr.write("%d check(s) failed\n" % len(FAILS))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
