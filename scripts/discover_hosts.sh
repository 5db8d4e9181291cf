#!/usr/bin/env bash
# Host discovery for Horovod elastic training: prints "HOST:SLOTS" for every host of a hostfile
# whose sshd answers now, so the job follows which nodes are up (a node that is down or whose
# link is down drops out; it is taken in again once it answers).
#
# Usage: discover_hosts.sh [HOSTFILE]     (default: hostfiles/edge3, the three-node edge cluster)
#   horovodrun -np 3 --min-np 2 --max-np 3 --host-discovery-script scripts/discover_hosts.sh ...
#
# Horovod runs it about once a second; each host gets one second (HVD_GRADPART_DISCOVERY_TIMEOUT_S)
# to accept a TCP connection on port 22, all hosts at once.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
hostfile=${1:-$here/../hostfiles/edge3}
wait_s=${HVD_GRADPART_DISCOVERY_TIMEOUT_S:-1}
[[ -r $hostfile ]] || { echo "discover_hosts.sh: cannot read hostfile $hostfile" >&2; exit 2; }
[[ $wait_s =~ ^[0-9]+$ ]] || { echo "discover_hosts.sh: HVD_GRADPART_DISCOVERY_TIMEOUT_S must be whole seconds" >&2; exit 2; }

probe() {   # HOST SLOTS: prints HOST:SLOTS when HOST's sshd accepts a connection in time
  if timeout "$wait_s" bash -c 'exec 3<>"/dev/tcp/$0/22"' "$1" 2>/dev/null; then
    printf '%s:%s\n' "$1" "$2"
  fi
}

while read -r host slots _; do
  [[ $host =~ ^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$ && $slots =~ ^slots=([0-9]+)$ ]] || {
    echo "discover_hosts.sh: $hostfile: expected 'HOST slots=N', got '$host $slots'" >&2; exit 2; }
  probe "$host" "${BASH_REMATCH[1]}" &
done <"$hostfile"
wait
