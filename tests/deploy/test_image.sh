#!/usr/bin/env bash
# tests/deploy/test_image.sh LAZYKVD LAZYKV LAZYKV_WORKER: deploy.image. The container image cannot be built
# here (no registry is reachable), so this keeps deploy/Dockerfile true in the parts that can
# run: the Dockerfile builds with deploy/image/build.sh and bundles with
# deploy/image/bundle-libs.sh (checked below), and the bundle made from the binaries CI built is
# complete: with only the bundle first on the library path, every library the binaries load
# (but the C library and the CUDA/NVIDIA ones the base image and the node provide) resolves
# inside it, the bundled lazykvd starts and checks a config, and the bundled lazykv-worker
# (the sidecar's command) runs a request on the model files the image copies. With LKV_DEPLOY_FULL=1 it first
# runs deploy/image/build.sh itself (a Release build, minutes) and bundles that.
set -euo pipefail
lazykvd=${1:?usage: test_image.sh LAZYKVD LAZYKV LAZYKV_WORKER}
lazykv=${2:?usage: test_image.sh LAZYKVD LAZYKV LAZYKV_WORKER}
worker=${3:?usage: test_image.sh LAZYKVD LAZYKV LAZYKV_WORKER}
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
grep -q 'deploy/image/build.sh /src /build' "$root/deploy/Dockerfile"
grep -q 'deploy/image/bundle-libs.sh /opt/lazykv /build/bin/lazykvd /build/bin/lazykv /build/bin/lazykv-worker$' "$root/deploy/Dockerfile"
grep -q -- '--target lazykvd lazykv lazykv-worker$' "$root/deploy/image/build.sh"
grep -q '^COPY tests/data/models/stories260K.bin tests/data/models/tok512.bin /opt/lazykv/share/models/$' "$root/deploy/Dockerfile"
grep -q 'bash /tmp/setup-debian.sh' "$root/deploy/Dockerfile"
grep -q '^FROM nvidia/cuda:.*runtime' "$root/deploy/Dockerfile"
if [ "${LKV_DEPLOY_FULL:-0}" = 1 ]; then
    "$root/deploy/image/build.sh" "$root" "$tmp/build"
    lazykvd=$tmp/build/bin/lazykvd
    lazykv=$tmp/build/bin/lazykv
    worker=$tmp/build/bin/lazykv-worker
fi
"$root/deploy/image/bundle-libs.sh" "$tmp/opt" "$lazykvd" "$lazykv" "$worker"
mkdir -p "$tmp/opt/share/models" # What the Dockerfile's COPY of the model files makes.
cp "$root/tests/data/models/stories260K.bin" "$root/tests/data/models/tok512.bin" "$tmp/opt/share/models/"
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libcuda\.so|libcudart|libnccl|libnvidia)'
for b in "$tmp"/opt/bin/*; do
    LD_LIBRARY_PATH=$tmp/opt/lib ldd "$b" | awk '/=>/{print $1" "$3}' | while read -r name path; do
        if [[ $name =~ $skip ]]; then continue; fi
        if [[ $path != "$tmp/opt/lib/"* ]]; then
            echo "FAIL: $(basename "$b") loads $name from $path, outside the bundle"
            exit 1
        fi
    done
done
env -i LD_LIBRARY_PATH="$tmp/opt/lib" "$tmp/opt/bin/lazykvd" --version
env -i LD_LIBRARY_PATH="$tmp/opt/lib" "$tmp/opt/bin/lazykvd" --config "$root/daemon/lazykvd.conf" --check-config >/dev/null
env -i LD_LIBRARY_PATH="$tmp/opt/lib" "$tmp/opt/bin/lazykv" --help >/dev/null
env -i LD_LIBRARY_PATH="$tmp/opt/lib" "$tmp/opt/bin/lazykv-worker" --help >/dev/null
# The sidecar's model paths (deploy/k8s/lazykv.yaml) exist in the bundle and load: one local
# request (no daemon) decodes a few tokens.
for f in $(grep -o '/opt/lazykv/share/models/[^" ]*' "$root/deploy/k8s/lazykv.yaml" | sort -u); do
    test -f "$tmp/opt/${f#/opt/lazykv/}" || { echo "FAIL: $f is not in the image"; exit 1; }
done
env -i LD_LIBRARY_PATH="$tmp/opt/lib" "$tmp/opt/bin/lazykv-worker" \
    --model "$tmp/opt/share/models/stories260K.bin" --tokenizer "$tmp/opt/share/models/tok512.bin" \
    --doc "Once upon a time" --question "Who?" --max-tokens 4 --threads 1 >/dev/null
echo "ok: bundle of $(ls "$tmp/opt/lib" | wc -l) libraries is complete"
