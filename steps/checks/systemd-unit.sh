#!/bin/sh
# Checks a candidate unit file with `systemd-analyze verify` before it replaces the live one.
#   systemd-unit.sh UNIT-NAME ROOT CANDIDATE
# The candidate's temporary name is not a unit name, so it is verified as a copy named UNIT-NAME.
# Under a sandbox ROOT (not "/"), programs of Exec*= lines that exist under ROOT are verified
# there (the tree's binaries, not the machine's). Fails on any complaint about the unit itself,
# warnings included ("Unknown key ... ignoring" is a bug in what we wrote, not a detail).
set -u
name=$1 root=$2 candidate=$3
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT
if [ "$root" = / ]; then
  cp "$candidate" "$dir/$name" || exit 1
else
  awk -v root="$root" '
    /^Exec[A-Za-z]*=/ {
      eq = index($0, "="); key = substr($0, 1, eq); rest = substr($0, eq + 1)
      match(rest, /^[-@:+!]*/); pre = substr(rest, 1, RLENGTH); cmd = substr(rest, RLENGTH + 1)
      split(cmd, w, " ")
      if (substr(w[1], 1, 1) == "/" && system("test -e \"" root w[1] "\"") == 0) $0 = key pre root cmd
    }
    { print }' "$candidate" >"$dir/$name" || exit 1
fi
out=$(systemd-analyze verify --man=no "$dir/$name" 2>&1)
rc=$?
mine=$(printf '%s\n' "$out" | grep -F "$name" | sed "s|$dir/||g")
if [ "$rc" -ne 0 ] || [ -n "$mine" ]; then
  echo "systemd-analyze verify refused $name:" >&2
  printf '%s\n' "${mine:-$out}" | sed "s|$dir/||g" >&2
  exit 1
fi
