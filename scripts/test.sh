#!/usr/bin/env bash
# npm test: lint, type-check, then every tap suite (unit and integration, real parts).
# Extra arguments go to tap, e.g. `npm test -- test/integration/kube-client.test.ts`.
#
# Without arguments the suites run in two lanes at once, each lane one file after another: the
# machines lane (the end-to-end scenarios and the VM files, minutes each, mostly waiting for
# machines to boot, install and join) beside every other file. Two machine files never run at
# once (each takes both cores in bursts); the other files run beside one of them as they run on
# any busy machine. Serially the suites took 47 minutes of the 2-core machine's CI run; the
# longer lane ~27. Every line says its lane (`machines |`, `suites |`); each lane ends with
# tap's own summary, and the last line says how each lane ended.
set -euo pipefail
cd "$(dirname "$0")/.."
# The upstream Kubernetes binaries the integration tests run (built once, cached).
bash scripts/test-binaries.sh >/dev/null
biome check .
tsc -p tsconfig.json
if [[ $EUID -ne 0 ]]; then
  echo "test: not root; suites that need root (users, mounts, namespaces) will skip" >&2
fi
if (($#)); then exec tap "$@"; fi

shopt -s nullglob
machines=(test/e2e/*.test.ts test/integration/vm-*.test.ts)
suites=()
for f in test/unit/*.test.ts test/integration/*.test.ts; do
  [[ $f == test/integration/vm-* ]] || suites+=("$f")
done
# tap's own include is test/**/*.test.ts: a file in neither lane would silently never run.
mapfile -t all < <(find test -name '*.test.ts' | sort)
if ((${#all[@]} != ${#machines[@]} + ${#suites[@]})); then
  echo "test: these test files are in no lane (scripts/test.sh):" >&2
  comm -23 <(printf '%s\n' "${all[@]}") <(printf '%s\n' "${machines[@]}" "${suites[@]}" | sort) >&2
  exit 1
fi

# tap builds its runner with the configured plugins (node_modules/@tapjs/test/test-built) when
# that build is missing or stale, as after `npm ci`; two taps starting at once would both rebuild
# it and one would load it half-written ("Cannot find module .../test-built/..."). Build it once
# first (~8 s).
tap build >/dev/null

lane() {
  local name=$1
  shift
  tap "$@" 2>&1 | sed -u "s/^/$name | /"
}
lane machines "${machines[@]}" &
machines_pid=$!
trap 'kill "$machines_pid" 2>/dev/null || true' INT TERM
suites_rc=0
lane "suites  " "${suites[@]}" || suites_rc=$?
machines_rc=0
wait "$machines_pid" || machines_rc=$?
echo "test: machines lane exit $machines_rc (${#machines[@]} files), suites lane exit $suites_rc (${#suites[@]} files)"
((machines_rc == 0 && suites_rc == 0))
