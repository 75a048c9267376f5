#!/usr/bin/env bash
# deploy/image/bundle-libs.sh OUT BIN...: copies BIN... into OUT/bin and every shared library
# they load (ldd) into OUT/lib, except the C library and the loader (the runtime image's own,
# glibc 2.39 in Ubuntu 24.04, runs binaries built against Debian 12's 2.36) and the CUDA/NVIDIA
# driver libraries (libcuda comes from the node's driver through the NVIDIA container runtime,
# libcudart/libnccl from the CUDA base image). The runtime stage of deploy/Dockerfile copies
# OUT and sets LD_LIBRARY_PATH=OUT/lib; CI (deploy.image) runs the bundle with only OUT/lib on
# the library path to prove it is complete.
set -euo pipefail
out=${1:?usage: bundle-libs.sh OUT BIN...}
shift
mkdir -p "$out/bin" "$out/lib"
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libcuda\.so|libcudart|libnccl|libnvidia)'
for b in "$@"; do
    cp -L "$b" "$out/bin/"
    ldd "$b" | awk '/=> \//{print $1" "$3}' | while read -r name path; do
        if ! [[ $name =~ $skip ]]; then
            cp -Ln "$path" "$out/lib/$name" 2>/dev/null || true
        fi
    done
done
echo "bundle: $(ls "$out/bin" | wc -l) binaries, $(ls "$out/lib" | wc -l) libraries, $(du -sh "$out" | cut -f1)"
