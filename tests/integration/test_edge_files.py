"""test_edge_files.py: integration.edge_files. Issue 12, item 4 (files) and item 2 (limits):
  - an existing 0755 data dir is tightened to 0700 (with a warning in the log), and after a
    write-through Put and a clean stop every file and folder RocksDB (and lazykvd) wrote in it is
    private: no group or other permission bit, checked by stat;
  - a data dir that belongs to another user is refused (exit 2, the message names the uid;
    only when the test runs as root, which can chown);
  - the soft RLIMIT_NOFILE is raised to the hard one at start and both are logged (the daemon is
    started with soft 256 and this process's hard limit; /proc/PID/limits shows the result).
"""
import os
import resource
import signal
import stat
import subprocess
import sys

import harness as h  # first: it exits 77 (skip) without grpc

from harness import cache_pb2_grpc  # noqa: E402


def main():
    with h.Daemon(h.ITEST_ARGS + ["--set", "durability=write-through"]) as d:
        os.makedirs(d.data_dir, mode=0o755)
        os.chmod(d.data_dir, 0o755)
        # Start with a low soft descriptor limit: the daemon inherits this process's.
        old = resource.getrlimit(resource.RLIMIT_NOFILE)
        hard = old[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        try:
            d.start()
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, old)
        log = open(d.log_path, encoding="utf-8", errors="replace").read()
        h.check("was mode 0755" in log and "tightened to 0700" in log, "no tightening warning")
        want = "descriptors: soft limit %d (was 256), hard limit %d" % (hard, hard)
        h.check(want in log,
                "rlimit line missing: %s" % [x for x in log.splitlines() if "descriptors" in x])
        with open("/proc/%d/limits" % d.proc.pid) as f:
            line = [x for x in f if x.startswith("Max open files")][0].split()
        h.check(line[3] == str(hard) and line[4] == str(hard), "daemon limits: %s" % line)

        ch = d.channel()
        toks, blocks = h.make_doc(h.ITEST, 7, 40)
        r = cache_pb2_grpc.CacheStub(ch).Put(iter(h.put_requests(h.ITEST, toks, blocks)),
                                             timeout=h.timeout(20))
        h.check(len(r.key) == 32, "Put failed")
        ch.close()
        h.check(d.stop(signal.SIGTERM) == 0, "lazykvd did not exit cleanly")

        n = 0
        for root, dirs, files in os.walk(d.data_dir):
            for name in [""] + dirs + files:
                p = os.path.join(root, name) if name else root
                st = os.lstat(p)
                n += 1
                h.check(st.st_mode & 0o077 == 0, "%s is mode %o: readable by others"
                        % (p, stat.S_IMODE(st.st_mode)))
        names = sorted(os.listdir(d.data_dir))
        h.check(any(x.endswith(".log") for x in names) or any(x.endswith(".sst") for x in names),
                "no RocksDB files in %s: %s" % (d.data_dir, names))
        print("  %d entries under the data dir, all private: %s" % (n, " ".join(names[:12])))

        # Restart on the private dir: no warning this time.
        size = os.path.getsize(d.log_path)
        d.start()
        h.check(d.stop() == 0, "restart failed")
        with open(d.log_path, encoding="utf-8", errors="replace") as f:
            f.seek(size)
            h.check("tightened" not in f.read(), "warned about a private data dir")

        if os.geteuid() == 0:
            os.chown(d.data_dir, 65534, 65534)
            p = subprocess.run([d.bin, "--set", "listen=127.0.0.1:0", "--set",
                                "data_dir=" + d.data_dir, "--set", "hot_backend=host"]
                               + h.ITEST_ARGS, capture_output=True, text=True,
                               timeout=h.timeout(30))
            out = p.stdout + p.stderr
            h.check(p.returncode == 2 and "belongs to uid 65534" in out,
                    "another user's data dir: status %d, %s" % (p.returncode, out[-500:]))
            print("  another user's data dir refused: exit 2")
            os.chown(d.data_dir, 0, 0)
        else:
            print("  (not root: the other-owner case is skipped)")
    print("edge_files: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
