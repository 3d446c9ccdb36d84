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
fetch=$(grep -iE "failed to fetch|cannot download|curl error|problem retrieving|failed to download|download \(curl\) error" "$out")
# The mirror: each URL cut before apt's dists/ or dnf's repodata/ (else at its last slash),
# apt's flat-repository "/./" folded.
mirrors=$(printf '%s\n' "$fetch" | grep -oE "(https?|ftp)://[A-Za-z0-9.:@_[-]+[^ ]*" |
  sed -E 's#/\./#/#g; s#/(dists|repodata)/.*$#/#; s#/[^/]*$#/#' | sort -u | tr '\n' ' ' | sed 's/ *$//')
if [ -z "$mirrors" ]; then
  exit "$rc"
fi
# Why, as the package manager said it: the first such line without its prefix and URL.
why=$(printf '%s\n' "$fetch" | head -n1 |
  sed -E 's#^[EW]: ##; s#(failed to fetch|cannot download [^:]*:)##I; s#(https?|ftp)://[^ ]*##g; s#^[-: ]+##; s#[ ]+# #g' |
  cut -c1-200)
echo "cannot reach the package mirror ${mirrors}${why:+ (${why})}: check the node's package sources (${sources}) and that this machine reaches them" >&2
exit "$rc"
