#!/bin/sh
# Checks a candidate containerd configuration before it replaces the live one: containerd loads
# it (and the files it imports) as it would at start. The merged dump is not wanted: it is long
# and may carry registry credentials.
#   containerd-config.sh CONTAINERD CANDIDATE
set -u
"$1" --config "$2" config dump >/dev/null
