#!/bin/sh
# Checks a candidate nginx configuration before it replaces the live one.
#   nginx-config.sh NGINX CANDIDATE
# On failure the last line printed is nginx's reason (not its "test failed" trailer).
set -u
out=$("$1" -t -q -e stderr -c "$2" 2>&1) && exit 0
printf '%s\n' "$out" | grep -v 'test failed$' >&2
exit 1
