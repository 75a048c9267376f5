#!/usr/bin/env bash
# deploy/setup-debian.sh: installs the Debian 12 packages lazykv needs to build, run and test.
# Idempotent: installs only what is missing. Run as root (or with sudo available).
# The container recipe (deploy/Dockerfile) uses the same list.
set -euo pipefail
pkgs=(build-essential cmake pkg-config git
      libgrpc-dev libprotobuf-c-dev protobuf-c-compiler librocksdb-dev libsodium-dev
      protobuf-compiler protobuf-compiler-grpc grpc-proto python3 python3-grpcio
      gnuplot-nox procps clang-format libjansson-dev etcd-server etcd-client
      libmicrohttpd-dev libssl-dev prometheus openssl systemd libxxhash-dev
      clang libclang-rt-14-dev)  # clang + its runtime: the libFuzzer stage (tests/fuzz)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# npm (the offline Kubernetes manifest check, deploy/k8s/validate): Debian's, unless a node with
# its own npm is installed already (e.g. NodeSource's, which Debian's npm would conflict with).
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ ${#missing[@]} -eq 0 ]; then
    echo "setup-debian: all ${#pkgs[@]} packages present"
else
    echo "setup-debian: installing ${missing[*]}"
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    echo "setup-debian: done"
fi
# The validator's npm packages (skipped when offline: ctest deploy.k8s then skips, exit 77).
here=$(cd "$(dirname "$0")" && pwd)
if [ -f "$here/k8s/validate/package-lock.json" ] && [ ! -d "$here/k8s/validate/node_modules" ]; then
    "$here/k8s/validate/install.sh" || echo "setup-debian: npm packages of deploy/k8s/validate not installed"
fi
