#!/bin/sh
# Checks a candidate KubeletConfiguration with the kubelet itself, before it replaces the live one.
#   kubelet-config.sh KUBELET ROOT CANDIDATE
# The kubelet has no "validate" command. Started with --exit-on-lock-contention and no lock file,
# it decodes the file, validates it (feature gates, ranges, cgroup settings) and then stops with
# "cannot exit on lock file contention: no lock file specified" before it touches the node (its
# self-signed serving certificate, when it wants one, goes to a temporary --cert-dir). Any other
# end is a refusal. Unknown fields, which the kubelet only logs ("strict decoding error"), are a
# refusal too. Seen with kubelet v1.34.
# Under a sandbox ROOT (not "/") the files the configuration names that the kubelet opens while
# validating (clientCAFile) are the tree's.
set -u
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
config=$3
if [ "$2" != / ]; then
  config=$dir/config.yaml
  sed "s|^\( *clientCAFile: \)/|\1$2/|" "$3" >"$config" || exit 1
fi
out=$("$1" --config="$config" --cert-dir="$dir/pki" --exit-on-lock-contention 2>&1)
strict=$(printf '%s\n' "$out" | grep -m 1 'strict decoding error' | sed 's/.*err="//; s/"$//; s/\\"/"/g')
if [ -n "$strict" ]; then
  printf '%s\n' "$out" | tail -n 5 >&2
  echo "kubelet refused the configuration: $strict" >&2
  exit 1
fi
case $out in
*"cannot exit on lock file contention: no lock file specified"*) exit 0 ;;
esac
printf '%s\n' "$out" | grep -v '^[[:space:]]' | tail -n 20 >&2
why=$(printf '%s\n' "$out" | sed -n 's/.*err="\(.*\)".*/\1/p' | tail -n 1 | sed 's/\\"/"/g')
[ -n "$why" ] || why=$(printf '%s\n' "$out" | grep -m 1 '^panic: ')
echo "kubelet refused the configuration: ${why:-see the output above}" >&2
exit 1
