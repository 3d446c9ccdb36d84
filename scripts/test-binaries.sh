#!/usr/bin/env bash
# Build (once) the upstream binaries the tests run: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet and kubectl, from the Go module proxy at one
# pinned release. The result is cached outside the repository and reused.
#
#   scripts/test-binaries.sh          build if missing, print the directory
#
# KUBEBUILDER_ASSETS, when set and holding etcd + kube-apiserver, wins: nothing
# is built and that directory is printed.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.34.4}"   # kubelet 1.34 still runs on cgroup v1 (failCgroupV1 defaults to false)
ETCD_VERSION="${ETCD_VERSION:-v3.6.5}"  # the etcd release kubernetes ${K8S_VERSION} is tested with
CACHE_ROOT="${BASHIBLE_TEST_CACHE:-/var/cache/bashible-test}"
OUT="$CACHE_ROOT/k8s-$K8S_VERSION"
BINARIES=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl)

if [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "$KUBEBUILDER_ASSETS/kube-apiserver" && -x "$KUBEBUILDER_ASSETS/etcd" ]]; then
  echo "$KUBEBUILDER_ASSETS"
  exit 0
fi

missing=()
for b in "${BINARIES[@]}"; do [[ -x "$OUT/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then echo "$OUT"; exit 0; fi

mkdir -p "$CACHE_ROOT"
# Parallel test files may all ask at once: one builds, the others wait and reuse.
exec 9>"$CACHE_ROOT/.build.lock"
flock 9
missing=()
for b in "${BINARIES[@]}"; do [[ -x "$OUT/$b" ]] || missing+=("$b"); done
if [[ ${#missing[@]} -eq 0 ]]; then echo "$OUT"; exit 0; fi

[[ -x /usr/local/go/bin/go ]] && PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null || { echo "test-binaries: Go is needed to build ${missing[*]}" >&2; exit 1; }
mkdir -p "$OUT"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export CGO_ENABLED=0 GOFLAGS=-mod=mod

log() { echo "test-binaries: $*" >&2; }

if [[ ! -x "$OUT/etcd" ]]; then
  log "building etcd $ETCD_VERSION"
  mkdir -p "$work/etcd" && cd "$work/etcd"
  go mod init local/etcd >/dev/null 2>&1
  go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >&2
  go build -trimpath -ldflags=-s -o "$OUT/etcd.tmp" go.etcd.io/etcd/server/v3 >&2
  mv "$OUT/etcd.tmp" "$OUT/etcd"
fi

k8s_missing=()
for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do [[ -x "$OUT/$b" ]] || k8s_missing+=("$b"); done
if [[ ${#k8s_missing[@]} -gt 0 ]]; then
  log "building ${k8s_missing[*]} from k8s.io/kubernetes $K8S_VERSION"
  mkdir -p "$work/k8s" && cd "$work/k8s"
  go mod init local/k8s >/dev/null 2>&1
  modfile=$(go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  staging_version="v0.${K8S_VERSION#v1.}"
  # k8s.io/kubernetes replaces its staging modules with local paths; pin each to the matching release.
  grep -E '^\s+k8s.io/[a-z0-9-]+ => \./staging/' "$modfile" | awk '{print $1}' | while read -r m; do
    go mod edit -replace "$m=$m@$staging_version"
  done
  # Resolve only what the commands import (tidy would chase test-only packages that staging lacks).
  go get "k8s.io/kubernetes@$K8S_VERSION" >&2
  for b in "${k8s_missing[@]}"; do
    ver_flags="-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$K8S_VERSION" | cut -d. -f2)"
    go build -trimpath -ldflags "-s -w $ver_flags" -o "$OUT/$b.tmp" "k8s.io/kubernetes/cmd/$b" >&2
    mv "$OUT/$b.tmp" "$OUT/$b"
    log "built $b"
  done
fi
echo "$OUT"
