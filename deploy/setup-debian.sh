#!/usr/bin/env bash
# deploy/setup-debian.sh: installs the Debian 12 packages lazykv needs to build, run and test.
# Idempotent: installs only what is missing. Run as root (or with sudo available).
# The container recipe (deploy/Dockerfile) uses the same list.
set -euo pipefail
pkgs=(build-essential cmake pkg-config git
      libgrpc-dev libprotobuf-c-dev protobuf-c-compiler librocksdb-dev libsodium-dev
      protobuf-compiler protobuf-compiler-grpc grpc-proto python3 python3-grpcio
      gnuplot-nox procps clang-format libjansson-dev
      clang libclang-rt-14-dev)  # clang + its runtime: the libFuzzer stage (tests/fuzz)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
    echo "setup-debian: all ${#pkgs[@]} packages present"
    exit 0
fi
echo "setup-debian: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup-debian: done"
