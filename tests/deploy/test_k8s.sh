#!/usr/bin/env bash
# tests/deploy/test_k8s.sh LAZYKVD: deploy.k8s. Validates deploy/k8s/*.yaml offline
# (deploy/k8s/validate/validate.mjs: Kubernetes schemas, unknown fields, cross-references,
# lazykvd --check-config of the ConfigMap), then checks that the validator is not a rubber
# stamp: each mutation below of lazykv.yaml must be rejected. Skips (77) when node or the
# validator's packages are missing (deploy/k8s/validate/install.sh; deploy/setup-debian.sh runs
# it).
set -uo pipefail
lazykvd=${1:?usage: test_k8s.sh LAZYKVD}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
val=$root/deploy/k8s/validate
if ! command -v node >/dev/null || [ ! -d "$val/node_modules/kubernetes-models" ]; then
    echo "SKIP: node or deploy/k8s/validate/node_modules missing (run deploy/k8s/validate/install.sh)"
    exit 77
fi
node "$val/validate.mjs" --lazykvd "$lazykvd" "$root"/deploy/k8s/*.yaml || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mutations=(
    's/imagePullPolicy: IfNotPresent/imagePullPolcy: IfNotPresent/'            # typo field
    's/serviceName: lazykv-peers/serviceName: lazykv-nope/'                    # no such Service
    's/  clusterIP: None/  clusterIP: 10.0.0.9/'                                # peers not headless
    's/replicas: 3/replicas: three/'                                           # schema type
    '0,/nvidia.com\/gpu: 1/s//nvidia.com\/gpux: 1/;0,/nvidia.com\/gpu: 1/s//nvidia.com\/gpux: 1/' # daemon without GPU
    's/medium: Memory/medium: ""/'                                             # arena not in RAM
    's/shareProcessNamespace: true/shareProcessNamespace: false/'              # no CUDA IPC
    's/mountPath: \/var\/lib\/lazykv/mountPath: \/var\/lib\/lazykv\n              name2: x/' # unknown mount field
    '0,/name: secrets$/s//name: secretz/'                                     # mount of a missing volume
    's/key: worker.token/key: worker.tokn/'                                    # Secret key missing
    's/cluster_down_after = 2s/cluster_down_after = soon/'                     # bad daemon option
    's/cluster_mode = etcd/cluster_mode = zookeeper/'                          # bad daemon option
    '0,/exec:/s//grpc: {port: 7070}\n            x-exec:/'                       # gRPC probe
    's/targetPort: grpc/targetPort: grpcx/'                                    # named port missing
    '0,/image: lazykv:0.1.0/!s/image: lazykv:0.1.0/image: lazykv-worker:0.1.0/' # worker's own image
    's/- 127.0.0.1:7070$/- lazykv:7070/'                                       # worker not on loopback
    's/- --serve$/- --verbose/'                                                # worker serves nothing
    's/name: LAZYKV_TLS_CA$/name: LAZYKV_TLS_CAFILE/'                          # probes without TLS env
    's/secretName: lazykv-tls$/secretName: lazykv-tlz/;s/optional: true$/optional: false/' # required Secret missing
)
n=0
for m in "${mutations[@]}"; do
    n=$((n + 1))
    sed -e "$m" "$root/deploy/k8s/lazykv.yaml" > "$tmp/m$n.yaml"
    if cmp -s "$tmp/m$n.yaml" "$root/deploy/k8s/lazykv.yaml"; then
        echo "FAIL: mutation $n ($m) changed nothing"
        exit 1
    fi
    if node "$val/validate.mjs" --lazykvd "$lazykvd" "$tmp/m$n.yaml" > "$tmp/out" 2>&1; then
        echo "FAIL: mutation $n was accepted: $m"
        cat "$tmp/out"
        exit 1
    fi
    echo "rejected mutation $n: $(grep -m1 -v '^FAIL' "$tmp/out" | sed 's/^ *//' | cut -c1-150)"
done
echo "ok: deploy/k8s valid, $n mutations rejected"
