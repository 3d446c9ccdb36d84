#!/usr/bin/env bash
# npm test: lint, type-check, then every tap suite (unit and integration, real parts).
# Extra arguments go to tap, e.g. `npm test -- test/integration/kube-client.test.ts`.
set -euo pipefail
cd "$(dirname "$0")/.."
# The upstream Kubernetes binaries the integration tests run (built once, cached).
bash scripts/test-binaries.sh >/dev/null
biome check .
tsc -p tsconfig.json
if [[ $EUID -ne 0 ]]; then
  echo "test: not root; suites that need root (users, mounts, namespaces) will skip" >&2
fi
exec tap "$@"
