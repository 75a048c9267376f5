#!/usr/bin/env bash
# deploy/image/build.sh SRC BUILD: builds lazykvd and the lazykv CLI the way the container image
# does (deploy/Dockerfile runs exactly this), and CI runs it too (tests/deploy: deploy.image),
# so the recipe cannot drift from what is tested. Release build; CUDA when nvcc is present
# (LKV_CUDA_ARCH, default 90: H100/H200), else the host-memory hot tier only.
set -euo pipefail
src=${1:?usage: build.sh SRC BUILD}
out=${2:?usage: build.sh SRC BUILD}
jobs=${LKV_BUILD_JOBS:-2}
cuda=OFF
if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
    cuda=ON
fi
cmake -S "$src" -B "$out" -DCMAKE_BUILD_TYPE=Release -DLKV_CUDA="$cuda" \
      -DCMAKE_CUDA_ARCHITECTURES="${LKV_CUDA_ARCH:-90}" \
      -DCMAKE_CUDA_COMPILER="$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)" >/dev/null
cmake --build "$out" -j"$jobs" --target lazykvd lazykv lazykv-worker
echo "image build: $out/bin/lazykvd $out/bin/lazykv $out/bin/lazykv-worker (CUDA $cuda)"
