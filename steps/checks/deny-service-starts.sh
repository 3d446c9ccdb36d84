#!/bin/sh
# Runs a Debian package install with the named services kept from starting: their packages'
# maintainer scripts start them through invoke-rc.d, which asks /usr/sbin/policy-rc.d first
# (Debian's policy-rc.d interface: exit 101 forbids the action). The step stops and disables
# those units right after the install anyway; a start would only take the port they listen on
# (Debian's nginx: 80, a node's ingress port) for a moment, and cost the install a restart.
#   deny-service-starts.sh SERVICE[,SERVICE...] COMMAND [ARG...]
# A policy-rc.d the machine has of its own is left alone (the install runs under it). The one
# this writes carries MARKER; it is removed when the command ends, however it ends, and one left
# by an install that was killed is replaced here and removed by the step's next plan.
set -u
services=$1
shift
policy=/usr/sbin/policy-rc.d
marker="# bashible: deny-service-starts"
if [ ! -e "$policy" ] && [ ! -L "$policy" ] || grep -qxF "$marker" "$policy" 2>/dev/null; then
  tmp="$policy.bashible.$$"
  trap 'rm -f "$tmp" "$policy"' EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  {
    echo '#!/bin/sh'
    echo "$marker"
    echo "# Written by bashible's package step for the length of one install; removed after it."
    echo 'while [ $# -gt 0 ]; do case "$1" in --*) shift ;; *) break ;; esac; done'
    echo 'case "${1%.service}" in'
    echo "  $(echo "$services" | sed 's/\.service//g; s/,/|/g')) exit 101 ;;"
    echo 'esac'
    echo 'exit 0'
  } >"$tmp" && chmod 0755 "$tmp" && mv -f "$tmp" "$policy" || exit 1
fi
"$@"
rc=$?
exit "$rc"
