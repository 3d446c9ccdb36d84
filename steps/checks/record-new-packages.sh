#!/bin/sh
# Runs a package manager's install and appends to RECORD the packages it newly installed, its
# dependencies included (`<manager> <package>` lines), so cleanup_static_node.sh removes exactly
# those and nothing the machine had before. (apt's autoremove cannot be trusted with that: it
# keeps whatever another package suggests, python3 for one.)
#   record-new-packages.sh RECORD MANAGER dpkg|rpm COMMAND [ARG...]
set -u
record=$1 manager=$2 db=$3
shift 3
installed() {
  case "$db" in
    dpkg) dpkg-query -W -f '${db:Status-Abbrev} ${Package}\n' 2>/dev/null | awk '$1 ~ /^.i/ { print $2 }' ;;
    rpm) rpm -qa --qf '%{NAME}\n' ;;
  esac | sed 's/:.*//' | sort -u
}
before=$(mktemp) || exit 1
after=$(mktemp) || exit 1
trap 'rm -f "$before" "$after"' EXIT
installed >"$before"
"$@"
rc=$?
installed >"$after"
comm -13 "$before" "$after" | while read -r p; do echo "$manager $p"; done >>"$record"
exit "$rc"
