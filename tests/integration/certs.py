"""certs.py: test certificates made with Debian's openssl, for the TLS integration tests.

make_ca(dir, name) writes NAME.key / NAME.pem (a self-signed CA); make_cert(dir, name, ca, ...)
writes NAME.key / NAME.pem signed by that CA, with subjectAltName DNS:localhost and
IP:127.0.0.1 (plus any extra SANs) so a client connecting to 127.0.0.1 verifies it. Keys are
EC P-256 (fast to make: the whole set takes a few tens of milliseconds). Exits 77 (skip) when
openssl is absent.
"""
import os
import shutil
import subprocess
import sys

OPENSSL = shutil.which("openssl")
if OPENSSL is None:
    sys.stderr.write("SKIP: no openssl (Debian: apt-get install openssl)\n")
    sys.exit(77)


def _run(args, cwd):
    subprocess.run([OPENSSL] + args, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE)


def make_ca(d, name):
    _run(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
          "-keyout", name + ".key", "-out", name + ".pem", "-days", "2", "-subj",
          "/CN=" + name, "-addext", "basicConstraints=critical,CA:TRUE",
          "-addext", "keyUsage=critical,keyCertSign,cRLSign"], d)
    return os.path.join(d, name + ".pem"), os.path.join(d, name + ".key")


_CA_CNF = """[ ca ]
default_ca = CA_default
[ CA_default ]
database = %(db)s
new_certs_dir = %(dir)s
serial = %(serial)s
default_md = sha256
policy = policy_any
copy_extensions = copy
unique_subject = no
[ policy_any ]
commonName = supplied
"""


def make_cert(d, name, ca, client=False, sans=(), expired=False):
    """Returns (cert path, key path) of a leaf signed by ca (the basename given to make_ca).
    expired: valid only on 2020-01-01 (made with `openssl ca -startdate/-enddate`)."""
    ext = os.path.join(d, name + ".ext")
    alt = ",".join(["DNS:localhost", "IP:127.0.0.1"] + list(sans))
    with open(ext, "w") as f:
        f.write("subjectAltName=%s\n" % alt)
        f.write("extendedKeyUsage=%s\n" % ("clientAuth" if client else "serverAuth"))
        f.write("basicConstraints=CA:FALSE\n")
    _run(["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout",
          name + ".key", "-out", name + ".csr", "-subj", "/CN=" + name], d)
    if expired:
        cnf = os.path.join(d, name + ".cnf")
        db, serial = os.path.join(d, name + ".index"), os.path.join(d, name + ".serial")
        open(db, "w").close()
        with open(serial, "w") as f:
            f.write("01\n")
        with open(cnf, "w") as f:
            f.write(_CA_CNF % {"db": db, "dir": d, "serial": serial})
        _run(["ca", "-batch", "-config", cnf, "-cert", ca + ".pem", "-keyfile", ca + ".key",
              "-in", name + ".csr", "-out", name + ".pem", "-startdate", "20200101000000Z",
              "-enddate", "20200102000000Z", "-extfile", ext, "-notext"], d)
    else:
        _run(["x509", "-req", "-in", name + ".csr", "-CA", ca + ".pem", "-CAkey", ca + ".key",
              "-CAcreateserial", "-out", name + ".pem", "-days", "1", "-extfile", ext], d)
    return os.path.join(d, name + ".pem"), os.path.join(d, name + ".key")


def replace(src, dst):
    """Atomically puts a copy of src at dst (write a temp file, rename over), as cert tools do."""
    tmp = dst + ".tmp"
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def read(path):
    with open(path, "rb") as f:
        return f.read()
