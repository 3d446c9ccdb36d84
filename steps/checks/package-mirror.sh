#!/bin/sh
# Runs a package manager's command (refresh the lists, install); when it fails because a
# package source cannot be reached, its last line names the mirror and what to check, so the
# step's error says it (the engine reports a failed command by its last line).
#   package-mirror.sh SOURCES COMMAND [ARG...]
# SOURCES: where the node's package sources are configured (for the message).
set -u
sources=$1
shift
out=$(mktemp) || exit 1
trap 'rm -f "$out"' EXIT
"$@" >"$out" 2>&1
rc=$?
cat "$out"
[ "$rc" -eq 0 ] && exit 0
# Lines about fetching: apt's "Err:"/"Failed to fetch", dnf's "Cannot download"/"Curl error",
# zypper's "Download (curl) error"/"Problem retrieving".
fetch=$(grep -iE "err:|failed to fetch|cannot download|curl error|problem retrieving|failed to download|could not resolve|could not connect|connection (refused|timed out)|unable to connect" "$out")
mirrors=$(printf '%s\n' "$fetch" | grep -oE "(https?|ftp)://[^ ]+" | sed -E 's|[^/]*$||' | sort -u | tr '\n' ' ' | sed 's/ *$//')
if [ -z "$mirrors" ]; then
  exit "$rc"
fi
why=$(printf '%s\n' "$fetch" | grep -ioE "(could not (connect|resolve)[^.]*|connection (refused|timed out)|connection failed|[0-9]{3} +(not found|forbidden)|timed out|no route to host|temporary failure resolving[^.]*)" | head -n1)
echo "cannot reach the package mirror ${mirrors}${why:+ (${why})}: check the node's package sources (${sources}) and that this machine reaches them" >&2
exit "$rc"
