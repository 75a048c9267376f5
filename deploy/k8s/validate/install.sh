#!/usr/bin/env bash
# deploy/k8s/validate/install.sh: installs the validator's pinned npm packages (package-lock.json:
# kubernetes-models 4.5.1, which runs on Debian 12's nodejs 18, and yaml) into
# deploy/k8s/validate/node_modules (git-ignored, ~33 MiB). Needs npm and the npm registry.
set -euo pipefail
cd "$(dirname "$0")"
npm ci --no-audit --no-fund --loglevel=error
echo "k8s validator: $(node -e 'console.log(require("kubernetes-models/package.json").version)' 2>/dev/null || echo installed)"
