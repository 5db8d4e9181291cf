#!/usr/bin/env bash
# A real N-node cluster on one machine: one network namespace per edge node, each with a veth
# into a bridge in the root namespace, a shaped (tc tbf) uplink, names in /etc/hosts and an sshd,
# so that `horovodrun -np 2 -H edge-a:1,edge-b:1 ...` launches over real ssh and real TCP.
#
# Usage (as root):
#   edge_cluster.sh up [--nodes N] [--rate RATE] [--delay MS]   build (or repair) the cluster
#   edge_cluster.sh rate RATE [--delay MS]                       re-shape every node's uplink
#   edge_cluster.sh status                                       nodes, sshd, rate, byte counters
#   edge_cluster.sh counters                                     JSON byte counters per node
#   edge_cluster.sh down                                         remove what `up` created
#
# Everything `up` creates is listed in the state dir (/run/hvd_gradpart_edge/state); `down`
# removes exactly those objects. Objects of the same name that this script did not create are
# never reused or deleted: `up` refuses instead.
#
# Exit codes: 0 ok; 1 failure (or no cluster is up); 2 usage error; 3 the cluster cannot be built
# on this machine (not root, network namespaces / veth / bridge / tbf not permitted, no sshd):
# callers fall back to hostfiles/localhost; 4 netem (for --delay) is not available; 5 refused:
# a namespace, link, address or hosts entry of the same name exists that this script did not create.
set -euo pipefail
shopt -s inherit_errexit

readonly PROG=${0##*/}
readonly STATE_DIR=/run/hvd_gradpart_edge
readonly STATE="$STATE_DIR/state"
readonly BRIDGE=gpbr0
readonly NET=10.213.57            # a private /24 used only by this cluster
readonly SUBNET="$NET.0/24"
# Interface name inside each node: the bridge's name, so that the launcher (root namespace) and
# every node share one interface name. Horovod needs that: it takes the common interface of the
# nodes and uses the launcher's address on the interface of that name for its rendezvous server.
readonly INNER_IF=$BRIDGE
readonly MARK_BEGIN='# hvd_gradpart edge cluster BEGIN'
readonly MARK_END='# hvd_gradpart edge cluster END'
readonly KEY_COMMENT=hvd_gradpart-edge-cluster
readonly SSHD=/usr/sbin/sshd
readonly LETTERS=(a b c d e f g h)
readonly MAX_NODES=${#LETTERS[@]}
readonly DEFAULT_NODES=2
readonly DEFAULT_RATE=100mbit
readonly LATENCY=400ms
readonly HOSTS_FILE=/etc/hosts

readonly E_FAIL=1 E_USAGE=2 E_UNAVAILABLE=3 E_NETEM=4 E_FOREIGN=5

ROOT_HOME=$(getent passwd 0 | cut -d: -f6)
readonly ROOT_HOME=${ROOT_HOME:-/root}
readonly SSH_DIR="$ROOT_HOME/.ssh"
readonly KEY="$SSH_DIR/hvd_gradpart_edge"
readonly AUTH_KEYS="$SSH_DIR/authorized_keys"
readonly SSH_CONFIG="$SSH_DIR/config"
readonly HOST_KEY="$STATE_DIR/ssh_host_ed25519_key"
readonly SSHD_CONFIG="$STATE_DIR/sshd_config"
# Our authorized_keys line: only usable from the cluster's own subnet, marked by its comment.
readonly AUTH_LINE_RE="^from=\"${NET//./\\.}\\.0/24\" ssh-ed25519 [A-Za-z0-9+/=]+ ${KEY_COMMENT}\$"

die() { local code=$1; shift; printf '%s: %s\n' "$PROG" "$*" >&2; exit "$code"; }
log() { printf '%s: %s\n' "$PROG" "$*" >&2; }

usage() {
  sed -n '6,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# ---------------------------------------------------------------- names and addresses

node_name() { printf 'edge-%s' "${LETTERS[$(($1 - 1))]}"; }
node_addr() { printf '%s.%d' "$NET" $((10 + $1)); }
node_veth() { printf 'gpv-%s' "$(node_name "$1")"; }   # root-side end of the node's veth

# ---------------------------------------------------------------- state file

state_has() { [[ -f $STATE ]] && grep -qxF -- "$1" "$STATE"; }
state_add() { state_has "$1" || printf '%s\n' "$1" >>"$STATE"; }
state_del_prefix() {   # removes every line starting with "$1"
  [[ -f $STATE ]] || return 0
  awk -v p="$1" 'index($0, p) != 1' "$STATE" >"$STATE.tmp"
  mv -f -- "$STATE.tmp" "$STATE"
}
state_get() { [[ -f $STATE ]] && awk -v k="$1" '$1 == k { print $2; exit }' "$STATE"; }
state_set() {   # KEY VALUE: replaces the KEY line in place (keeps the file's order), or appends it
  if awk -v k="$1" '$1 == k { found = 1 } END { exit !found }' "$STATE"; then
    awk -v k="$1" -v v="$2" '$1 == k { print k, v; next } { print }' "$STATE" >"$STATE.tmp"
    mv -f -- "$STATE.tmp" "$STATE"
  else
    printf '%s %s\n' "$1" "$2" >>"$STATE"
  fi
}
state_list() { [[ -f $STATE ]] && awk -v k="$1" '$1 == k { print $2 }' "$STATE"; }

# ---------------------------------------------------------------- probes

netns_exists() { ip netns list 2>/dev/null | awk -v n="$1" '$1 == n { found = 1 } END { exit !found }'; }
link_exists() { ip link show dev "$1" >/dev/null 2>&1; }

proc_starttime() {   # field 22 of /proc/PID/stat (comm may contain spaces, so cut after ')')
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  awk '{ print $20 }' <<<"$stat"
}

# True when PID is still the sshd this script started at STARTTIME (pid, start time and binary
# must all match, so a recycled pid is never taken for ours).
sshd_is_ours() {
  local pid=$1 start=$2
  [[ $pid =~ ^[0-9]+$ && -d /proc/$pid ]] || return 1
  [[ $(proc_starttime "$pid") == "$start" ]] || return 1
  [[ $(readlink "/proc/$pid/exe" 2>/dev/null) == "$SSHD" ]]
}

# True when our sshd for node NAME (PID, STARTTIME) runs in NAME's namespace and answers on ADDR.
sshd_healthy() {
  local name=$1 addr=$2 pid=$3 start=$4
  sshd_is_ours "$pid" "$start" || return 1
  [[ $(ip netns identify "$pid" 2>/dev/null) == "$name" ]] || return 1
  sshd_answers "$addr"
}

sshd_record() {   # NAME -> "PID STARTTIME" of our sshd for NAME, or an empty line
  awk -v n="$1" '$1 == "sshd" && $2 == n { print $3, $4; found = 1; exit } END { if (!found) print "" }' "$STATE"
}

sshd_answers() {   # an SSH banner on ADDR:22 within 2 s
  local banner
  # shellcheck disable=SC2016  # $1 is expanded by the inner bash
  banner=$(timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/22" && head -c 8 <&3' _ "$1" 2>/dev/null) || return 1
  [[ $banner == SSH-2.0* ]]
}

# Checks, in a throwaway namespace, that this machine allows what the cluster needs.
probe_capabilities() {   # $1 = 1 when netem is needed
  local want_netem=$1 probe="hvdgp-probe-$$" err
  if ! err=$(ip netns add "$probe" 2>&1); then
    die "$E_UNAVAILABLE" "network namespaces are not permitted here (ip netns add: ${err:-failed}); use hostfiles/localhost"
  fi
  local why=""
  if ! err=$(ip -n "$probe" link add name p0 type veth peer name p1 2>&1); then
    why="veth pairs are not permitted (${err})"
  elif ! err=$(ip -n "$probe" link add name pbr type bridge 2>&1); then
    why="bridges are not permitted (${err})"
  elif ! err=$(tc -n "$probe" qdisc add dev p0 root tbf rate 1mbit burst 32kbit latency "$LATENCY" 2>&1); then
    why="tc tbf is not available (${err})"
   elif ! err=$(ip netns exec "$probe" unshare --uts hostname hvdgp-probe 2>&1); then
    why="UTS namespaces are not permitted (unshare --uts: ${err})"
  fi
  local netem_ok=1
  if [[ -z $why && $want_netem == 1 ]] \
      && ! tc -n "$probe" qdisc add dev p1 root netem delay 1ms >/dev/null 2>&1; then
    netem_ok=0
  fi
  ip netns del "$probe" 2>/dev/null || true
  [[ -z $why ]] || die "$E_UNAVAILABLE" "$why; use hostfiles/localhost"
  [[ $netem_ok == 1 ]] || die "$E_NETEM" "netem is not available in this kernel; --delay cannot be applied"
}

require_root() {
  [[ $EUID -eq 0 ]] || die "$E_UNAVAILABLE" "must run as root (network namespaces need CAP_SYS_ADMIN); use hostfiles/localhost"
}

take_lock() {   # serialises concurrent runs of this script; the lock is the script file itself
  exec 9<"${BASH_SOURCE[0]}"
  flock -w 120 9 || die "$E_FAIL" "another edge_cluster.sh run holds the lock"
}

# ---------------------------------------------------------------- marked blocks in files

# Prints FILE without our marked block; fails when the markers are unbalanced.
strip_block() {
  local file=$1
  [[ -f $file ]] || return 0
  awk -v b="$MARK_BEGIN" -v e="$MARK_END" '
    $0 == b { if (skip) exit 3; skip = 1; next }
    $0 == e { if (!skip) exit 3; skip = 0; next }
    !skip { print }
    END { if (skip) exit 3 }' "$file" \
    || die "$E_FAIL" "unbalanced '$MARK_BEGIN'/'END' markers in $file; fix it by hand"
}

# Replaces FILE's content in place (keeps owner, mode and bind mounts), only if it changes.
rewrite_file() {
  local file=$1 new=$2
  if [[ -f $file ]] && cmp -s -- "$new" "$file"; then rm -f -- "$new"; return 0; fi
  cat -- "$new" >"$file"
  rm -f -- "$new"
}

# put_block FILE prepend|append TEXT
put_block() {
  local file=$1 where=$2 text=$3 tmp
  tmp=$(mktemp)
  strip_block "$file" >"$tmp.rest"
  {
    if [[ $where == prepend ]]; then
      printf '%s\n%s\n%s\n' "$MARK_BEGIN" "$text" "$MARK_END"
      cat -- "$tmp.rest"
    else
      cat -- "$tmp.rest"
      printf '%s\n%s\n%s\n' "$MARK_BEGIN" "$text" "$MARK_END"
    fi
  } >"$tmp"
  rm -f -- "$tmp.rest"
  rewrite_file "$file" "$tmp"
}

drop_block() {
  local file=$1 tmp
  [[ -f $file ]] || return 0
  grep -qxF -- "$MARK_BEGIN" "$file" || return 0
  tmp=$(mktemp)
  strip_block "$file" >"$tmp"
  rewrite_file "$file" "$tmp"
}

drop_auth_line() {
  local tmp
  [[ -f $AUTH_KEYS ]] || return 0
  grep -qE -- "$AUTH_LINE_RE" "$AUTH_KEYS" || return 0
  tmp=$(mktemp)
  grep -vE -- "$AUTH_LINE_RE" "$AUTH_KEYS" >"$tmp" || true
  rewrite_file "$AUTH_KEYS" "$tmp"
}

# Creates FILE (mode 600) when absent and records that, so `down` can remove it again if empty.
ensure_file() {
  local file=$1
  [[ -e $file ]] && return 0
  (umask 077 && : >"$file")
  state_add "created-file $file"
}

# ---------------------------------------------------------------- pre-flight (refusals)

# Lists, one per line, the objects named like ours that this script did not create.
foreign_objects() {
  local n=$1 i name veth dev
  link_exists "$BRIDGE" && ! state_has "link $BRIDGE" && echo "link $BRIDGE"
  for ((i = 1; i <= n; i++)); do
    name=$(node_name "$i"); veth=$(node_veth "$i")
    netns_exists "$name" && ! state_has "netns $name" && echo "network namespace $name"
    link_exists "$veth" && ! state_has "link $veth" && echo "link $veth"
  done
  # Addresses of our subnet on any root-namespace interface other than our bridge.
  while read -r _ dev _; do
    [[ $dev == "$BRIDGE" && -f $STATE ]] && state_has "link $BRIDGE" && continue
    echo "address in $SUBNET on $dev"
  done < <(ip -4 -o addr show to "$SUBNET" 2>/dev/null)
  # /etc/hosts entries for our names outside our marked block.
  local names=""
  for ((i = 1; i <= n; i++)); do names+=" $(node_name "$i")"; done
  strip_block "$HOSTS_FILE" | awk -v names="$names" '
    BEGIN { split(names, a, " "); for (k in a) want[a[k]] = 1 }
    /^[[:space:]]*#/ { next }
    { for (f = 2; f <= NF; f++) { if ($f ~ /^#/) break; if ($f in want) print "/etc/hosts entry for " $f ": " $0 } }'
  return 0
}

# ---------------------------------------------------------------- building blocks of `up`

burst_for() {   # tbf bucket: 32kbit, or 1 ms worth of RATE when that is larger
  local rate=$1 num unit bits
  num=${rate%%[a-z]*}; unit=${rate#"$num"}
  case $unit in kbit) bits=$((num * 1000)) ;; mbit) bits=$((num * 1000000)) ;; gbit) bits=$((num * 1000000000)) ;; esac
  if ((bits / 1000 > 32000)); then printf '%db' $((bits / 8000)); else printf '32kbit'; fi
}

apply_shaping() {   # NAME RATE DELAY_MS: egress of the node's interface, inside its namespace
  local name=$1 rate=$2 delay=$3 burst now
  burst=$(burst_for "$rate")
  now=$(tc -n "$name" qdisc show dev "$INNER_IF")
  if [[ $delay != 0 || $now == *netem* ]]; then
    tc -n "$name" qdisc del dev "$INNER_IF" root 2>/dev/null || true
  fi
  tc -n "$name" qdisc replace dev "$INNER_IF" root handle 1: tbf rate "$rate" burst "$burst" latency "$LATENCY"
  if [[ $delay != 0 ]]; then
    tc -n "$name" qdisc add dev "$INNER_IF" parent 1:1 handle 10: netem delay "${delay}ms"
  fi
}

disable_ipv6() {   # keeps the link silent (no IPv6 autoconf chatter in the byte counters)
  local ns=$1 dev=$2
  if [[ -z $ns ]]; then
    [[ -w /proc/sys/net/ipv6/conf/$dev/disable_ipv6 ]] && echo 1 >"/proc/sys/net/ipv6/conf/$dev/disable_ipv6"
  else
    # shellcheck disable=SC2016  # $1 is expanded by the inner sh
    ip netns exec "$ns" sh -c '[ ! -w "$1" ] || echo 1 > "$1"' _ "/proc/sys/net/ipv6/conf/$dev/disable_ipv6"
  fi
  return 0
}

ensure_bridge() {
  if ! link_exists "$BRIDGE"; then
    ip link add name "$BRIDGE" type bridge
  fi
  state_add "link $BRIDGE"
  disable_ipv6 "" "$BRIDGE"
  ip addr replace "$NET.1/24" dev "$BRIDGE"
  ip link set dev "$BRIDGE" up
}

ensure_node() {
  local i=$1 name addr veth
  name=$(node_name "$i"); addr=$(node_addr "$i"); veth=$(node_veth "$i")
  if ! netns_exists "$name"; then
    ip netns add "$name"
  fi
  state_add "netns $name"
  ip -n "$name" link set dev lo up
  if link_exists "$veth" && ! ip -n "$name" link show dev "$INNER_IF" >/dev/null 2>&1; then
    ip link del dev "$veth"   # ours, but its other end is not in the node (namespace recreated)
  fi
  if ! link_exists "$veth"; then
    if ip -n "$name" link show dev "$INNER_IF" >/dev/null 2>&1; then
      ip -n "$name" link del dev "$INNER_IF"   # a stray end inside our own namespace
    fi
    ip link add name "$veth" type veth peer name "gpi-$name" netns "$name"
    ip -n "$name" link set dev "gpi-$name" name "$INNER_IF"
  fi
  state_add "link $veth"
  disable_ipv6 "" "$veth"
  disable_ipv6 "$name" "$INNER_IF"
  ip link set dev "$veth" master "$BRIDGE" up
  ip -n "$name" addr replace "$addr/24" dev "$INNER_IF"
  ip -n "$name" link set dev "$INNER_IF" up
}

ensure_ssh_files() {
  local n=$1 i names="" hosts="" pub
  [[ -d /run/sshd ]] || mkdir -m 0755 /run/sshd   # sshd's privilege-separation directory
  if [[ ! -d $SSH_DIR ]]; then install -d -m 0700 "$SSH_DIR"; fi
  if [[ ! -f $KEY ]]; then
    ssh-keygen -q -t ed25519 -N '' -C "$KEY_COMMENT" -f "$KEY"
  fi
  [[ -f $KEY.pub ]] || ssh-keygen -y -f "$KEY" >"$KEY.pub"
  if [[ ! -f $HOST_KEY ]]; then
    ssh-keygen -q -t ed25519 -N '' -C hvd_gradpart-edge-host -f "$HOST_KEY"
  fi
  cat >"$SSHD_CONFIG" <<EOF
# sshd for the hvd_gradpart edge cluster (one per node namespace); written by edge_cluster.sh.
# ListenAddress and PidFile are given per node on the command line.
Port 22
HostKey $HOST_KEY
PermitRootLogin prohibit-password
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
X11Forwarding no
PrintMotd no
PrintLastLog no
UseDNS no
AcceptEnv LANG LC_*
MaxStartups 64:30:128
MaxSessions 64
Subsystem sftp /usr/lib/openssh/sftp-server
EOF
  "$SSHD" -t -f "$SSHD_CONFIG" -o "ListenAddress=$(node_addr 1):22" \
    || die "$E_FAIL" "sshd rejects $SSHD_CONFIG"

  # authorized_keys: our key, usable only from the cluster subnet, exactly once.
  pub=$(awk '{ print $1, $2 }' "$KEY.pub")
  ensure_file "$AUTH_KEYS"
  local want="from=\"$SUBNET\" $pub $KEY_COMMENT" tmp
  if ! grep -qxF -- "$want" "$AUTH_KEYS" || (($(grep -cE -- "$AUTH_LINE_RE" "$AUTH_KEYS") != 1)); then
    tmp=$(mktemp)
    grep -vE -- "$AUTH_LINE_RE" "$AUTH_KEYS" >"$tmp" || true
    printf '%s\n' "$want" >>"$tmp"
    rewrite_file "$AUTH_KEYS" "$tmp"
  fi
  state_add "authkey $AUTH_KEYS"

  for ((i = 1; i <= n; i++)); do
    names+=" $(node_name "$i")"
    hosts+="$(node_addr "$i")	$(node_name "$i")"$'\n'
  done
  put_block "$HOSTS_FILE" append "${hosts%$'\n'}"
  state_add "block $HOSTS_FILE"

  # ssh client settings for the cluster's nodes only. Prepended, because ssh takes the first
  # value it finds; the closing `Match all` returns to global scope for the rest of the file.
  ensure_file "$SSH_CONFIG"
  put_block "$SSH_CONFIG" prepend "# Written by scripts/edge_cluster.sh up; removed by edge_cluster.sh down.
# Relaxed host-key checking for these throwaway local nodes only (their host keys are new on every up).
# A session to a node that stops answering (its link cut) ends after 15 s: Horovod's elastic driver
# waits for that to let the other ranks go on.
Host${names}
    User root
    IdentityFile $KEY
    IdentitiesOnly yes
    StrictHostKeyChecking no
    UserKnownHostsFile /dev/null
    LogLevel ERROR
    ServerAliveInterval 5
    ServerAliveCountMax 3
# End of the cluster's Host block: what follows applies to every host, as before.
Match all"
  state_add "block $SSH_CONFIG"
}

ensure_sshd() {
  local i=$1 name addr pidfile pid start t
  name=$(node_name "$i"); addr=$(node_addr "$i")
  pidfile="$STATE_DIR/sshd-$name.pid"
  read -r pid start < <(sshd_record "$name")
  if [[ -n $pid ]]; then
    sshd_healthy "$name" "$addr" "$pid" "$start" && return 0
    stop_sshd "$name" "$pid" "$start"   # dead, deaf, or left in a deleted namespace: restart it
  fi
  state_del_prefix "sshd $name "
  rm -f -- "$pidfile"
  # Its own UTS namespace too, with the node's name as hostname: sessions then see `hostname`
  # = edge-X (resolving to the node's address). With the machine's shared hostname (often
  # mapped to 127.0.0.1) Gloo's rendezvous hands out a loopback address and Horovod fails.
  # shellcheck disable=SC2016  # $1 and $@ are expanded by the inner sh
  ip netns exec "$name" unshare --uts sh -c 'hostname "$1" && shift && exec "$@"' _ "$name" \
    "$SSHD" -f "$SSHD_CONFIG" -o "ListenAddress=$addr:22" \
    -o "PidFile=$pidfile" -E "$STATE_DIR/sshd-$name.log"
  for ((t = 0; t < 50; t++)); do [[ -s $pidfile ]] && break; sleep 0.1; done
  [[ -s $pidfile ]] || die "$E_FAIL" "sshd for $name wrote no pid file; see $STATE_DIR/sshd-$name.log"
  pid=$(<"$pidfile")
  start=$(proc_starttime "$pid") || die "$E_FAIL" "sshd for $name (pid $pid) exited; see $STATE_DIR/sshd-$name.log"
  state_add "sshd $name $pid $start"
  for ((t = 0; t < 50; t++)); do sshd_answers "$addr" && return 0; sleep 0.1; done
  die "$E_FAIL" "sshd for $name does not answer on $addr:22; see $STATE_DIR/sshd-$name.log"
}

# Stops our sshd for NAME (listener PID started at START) and its per-connection children.
stop_sshd() {
  local name=$1 pid=$2 start=$3 kids=() k t
  if ! sshd_is_ours "$pid" "$start"; then return 0; fi
  for k in $(grep -lx "PPid:[[:space:]]*$pid" /proc/[0-9]*/status 2>/dev/null | cut -d/ -f3 || true); do
    [[ $(readlink "/proc/$k/exe" 2>/dev/null) == "$SSHD" ]] && kids+=("$k")
  done
  kill -TERM "$pid" 2>/dev/null || true
  for k in "${kids[@]}"; do kill -TERM "$k" 2>/dev/null || true; done
  for ((t = 0; t < 50; t++)); do sshd_is_ours "$pid" "$start" || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}

# ---------------------------------------------------------------- teardown (down, failed up)

teardown() {
  local line name pid start leftover
  if [[ -f $STATE ]]; then
    while read -r _ name pid start; do
      stop_sshd "$name" "$pid" "$start"
    done < <(awk '$1 == "sshd"' "$STATE")
    # Node veths first (deleting one end deletes its peer), then the bridge.
    while read -r line; do
      [[ $line == "$BRIDGE" ]] && continue
      link_exists "$line" && ip link del dev "$line"
    done < <(state_list link)
    while read -r name; do
      netns_exists "$name" || continue
      leftover=$(ip netns pids "$name" 2>/dev/null | tr '\n' ' ')
      [[ -z ${leftover// /} ]] || log "warning: processes still in namespace $name (not started by this script, left alone): $leftover"
      ip netns del "$name"
    done < <(state_list netns)
    if state_has "link $BRIDGE" && link_exists "$BRIDGE"; then ip link del dev "$BRIDGE"; fi
  fi
  # The marked blocks and the marked key line are ours wherever they are found.
  drop_block "$HOSTS_FILE"
  drop_block "$SSH_CONFIG"
  drop_auth_line
  if [[ -f $STATE ]]; then
    while read -r line; do
      [[ -f $line && ! -s $line ]] && rm -f -- "$line"
    done < <(state_list created-file)
  fi
  rm -rf -- "$STATE_DIR"
}

# ---------------------------------------------------------------- commands

UP_ROLLBACK=0
on_exit_up() {
  local rc=$?
  if [[ $UP_ROLLBACK == 1 && $rc != 0 ]]; then
    log "up failed (exit $rc); removing what it created"
    UP_ROLLBACK=0
    teardown || true
  fi
  exit "$rc"
}

cmd_up() {
  local n rate delay i foreign
  require_root
  command -v "$SSHD" >/dev/null 2>&1 && [[ -x $SSHD ]] \
    || die "$E_UNAVAILABLE" "$SSHD not found (apt-get install openssh-server); use hostfiles/localhost"
  local tool
  for tool in ip tc ssh ssh-keygen flock unshare timeout; do
    command -v "$tool" >/dev/null 2>&1 || die "$E_UNAVAILABLE" "$tool not found; use hostfiles/localhost"
  done
  take_lock
  local fresh=1
  [[ -f $STATE ]] && fresh=0
  n=${OPT_NODES:-$(state_get nodes || true)}; n=${n:-$DEFAULT_NODES}
  rate=${OPT_RATE:-$(state_get rate || true)}; rate=${rate:-$DEFAULT_RATE}
  delay=${OPT_DELAY:-$(state_get delay || true)}; delay=${delay:-0}
  if [[ $fresh == 0 ]]; then
    local have; have=$(state_get nodes || true)
    if [[ -n $have && $have != "$n" ]]; then
      die "$E_FOREIGN" "the edge cluster is up with $have nodes; run '$PROG down' before 'up --nodes $n'"
    fi
  fi
  foreign=$(foreign_objects "$n")
  if [[ -n $foreign ]]; then
    die "$E_FOREIGN" "refusing to build the edge cluster: not created by this script (remove them or pick other names): $(tr '\n' ';' <<<"$foreign" | sed 's/;$//; s/;/; /g')"
  fi
  probe_capabilities "$([[ $delay != 0 ]] && echo 1 || echo 0)"

  [[ $fresh == 1 ]] && UP_ROLLBACK=1
  trap on_exit_up EXIT
  [[ -d $STATE_DIR ]] || mkdir -m 0700 "$STATE_DIR"
  touch "$STATE"
  state_set nodes "$n"; state_set rate "$rate"; state_set delay "$delay"
  ensure_bridge
  for ((i = 1; i <= n; i++)); do
    ensure_node "$i"
    apply_shaping "$(node_name "$i")" "$rate" "$delay"
  done
  ensure_ssh_files "$n"
  for ((i = 1; i <= n; i++)); do ensure_sshd "$i"; done
  UP_ROLLBACK=0
  trap - EXIT
  print_status
}

cmd_rate() {
  local rate=$1 delay name
  require_root
  take_lock
  [[ -f $STATE ]] || die "$E_FAIL" "no edge cluster is up (no $STATE); run '$PROG up' first"
  delay=${OPT_DELAY:-$(state_get delay || true)}; delay=${delay:-0}
  [[ $delay == 0 ]] || probe_capabilities 1
  while read -r name; do
    netns_exists "$name" || die "$E_FAIL" "namespace $name is gone; run '$PROG up' to repair"
    apply_shaping "$name" "$rate" "$delay"
  done < <(state_list netns)
  state_set rate "$rate"; state_set delay "$delay"
  printf 'edge cluster: rate %s%s on every node\n' "$rate" "$([[ $delay == 0 ]] || echo ", delay ${delay}ms")"
}

read_counters() {   # NAME -> "TX RX" of the node's own interface (0 0 when unreadable)
  local out
  out=$(ip netns exec "$1" cat "/sys/class/net/$INNER_IF/statistics/tx_bytes" \
        "/sys/class/net/$INNER_IF/statistics/rx_bytes" 2>/dev/null | tr '\n' ' ') || out=""
  [[ $out =~ ^[0-9]+\ [0-9]+\ $ ]] || out="0 0 "
  printf '%s' "${out% }"
}

print_status() {
  local i n name addr pid start sshd rate tx rx
  n=$(state_get nodes || true)
  printf 'edge cluster: up, %s node(s), bridge %s (%s.1), state in %s\n' "$n" "$BRIDGE" "$NET" "$STATE_DIR"
  printf '%-8s %-14s %-18s %-12s %14s %14s\n' NODE ADDRESS SSHD RATE TX_BYTES RX_BYTES
  local healthy=0
  for ((i = 1; i <= n; i++)); do
    name=$(node_name "$i"); addr=$(node_addr "$i")
    read -r pid start < <(sshd_record "$name")
    if [[ -n $pid ]] && sshd_healthy "$name" "$addr" "$pid" "$start"; then
      sshd="up (pid $pid)"
    else
      sshd="DOWN"; healthy=1
    fi
    rate=$(tc -n "$name" qdisc show dev "$INNER_IF" 2>/dev/null | grep -o 'rate [^ ]*' | head -n1 | cut -d' ' -f2 || true)
    read -r tx rx <<<"$(read_counters "$name")"
    printf '%-8s %-14s %-18s %-12s %14s %14s\n' "$name" "$addr" "$sshd" "${rate:-none}" "$tx" "$rx"
  done
  return "$healthy"
}

cmd_status() {
  require_root
  if [[ ! -f $STATE ]]; then
    echo "edge cluster: down (no $STATE)"
    return "$E_FAIL"
  fi
  print_status
}

cmd_counters() {
  local name tx rx sep=""
  require_root
  [[ -f $STATE ]] || die "$E_FAIL" "no edge cluster is up (no $STATE)"
  printf '{'
  while read -r name; do
    read -r tx rx <<<"$(read_counters "$name")"
    printf '%s"%s": {"tx_bytes": %s, "rx_bytes": %s}' "$sep" "$name" "$tx" "$rx"
    sep=", "
  done < <(state_list netns)
  printf '}\n'
}

cmd_down() {
  require_root
  take_lock
  if [[ ! -f $STATE ]]; then
    teardown
    echo "edge cluster: nothing to remove (no $STATE); left-over marked blocks, if any, removed"
    return 0
  fi
  teardown
  echo "edge cluster: down"
}

# ---------------------------------------------------------------- arguments

OPT_NODES="" OPT_RATE="" OPT_DELAY=""
validate_rate() {
  [[ $1 =~ ^[1-9][0-9]{0,5}(kbit|mbit|gbit)$ ]] \
    || die "$E_USAGE" "invalid rate '$1': expected a positive integer followed by kbit, mbit or gbit (e.g. 100mbit)"
}

main() {
  [[ $# -gt 0 ]] || { usage >&2; exit "$E_USAGE"; }
  local cmd=$1 positional=() arg
  shift
  case $cmd in
    -h | --help | help) usage; exit 0 ;;
    up | down | status | counters | rate) ;;
    *) die "$E_USAGE" "unknown command '$cmd' (expected up, down, status, counters or rate)" ;;
  esac
  while [[ $# -gt 0 ]]; do
    arg=$1; shift
    case $arg in
      --nodes | --rate | --delay)
        [[ $# -gt 0 ]] || die "$E_USAGE" "$arg needs a value"
        set -- "$arg=$1" "${@:2}"; continue ;;
      --nodes=*) OPT_NODES=${arg#*=} ;;
      --rate=*) OPT_RATE=${arg#*=} ;;
      --delay=*) OPT_DELAY=${arg#*=} ;;
      -h | --help) usage; exit 0 ;;
      -*) die "$E_USAGE" "unknown option '$arg'" ;;
      *) positional+=("$arg") ;;
    esac
  done
  if [[ -n $OPT_NODES ]]; then
    if ! [[ $OPT_NODES =~ ^[0-9]{1,3}$ ]] || ((10#$OPT_NODES < 1 || 10#$OPT_NODES > MAX_NODES)); then
      die "$E_USAGE" "invalid --nodes '$OPT_NODES': expected an integer from 1 to $MAX_NODES"
    fi
    OPT_NODES=$((10#$OPT_NODES))
  fi
  [[ -z $OPT_RATE ]] || validate_rate "$OPT_RATE"
  if [[ -n $OPT_DELAY ]]; then
    if ! [[ $OPT_DELAY =~ ^[0-9]{1,5}$ ]] || ((10#$OPT_DELAY > 10000)); then
      die "$E_USAGE" "invalid --delay '$OPT_DELAY': expected milliseconds, an integer from 0 to 10000"
    fi
    OPT_DELAY=$((10#$OPT_DELAY))
  fi
  case $cmd in
    up)
      [[ ${#positional[@]} -eq 0 ]] || die "$E_USAGE" "up takes no arguments besides options (got '${positional[*]}')"
      cmd_up ;;
    rate)
      [[ -z $OPT_NODES ]] || die "$E_USAGE" "--nodes is only valid with up"
      if [[ ${#positional[@]} -eq 1 && -z $OPT_RATE ]]; then
        validate_rate "${positional[0]}"; OPT_RATE=${positional[0]}
      elif [[ ${#positional[@]} -ne 0 || -z $OPT_RATE ]]; then
        die "$E_USAGE" "usage: $PROG rate RATE [--delay MS]  (e.g. $PROG rate 20mbit)"
      fi
      cmd_rate "$OPT_RATE" ;;
    down | status | counters)
      [[ -z $OPT_NODES && -z $OPT_RATE && -z $OPT_DELAY ]] || die "$E_USAGE" "$cmd takes no options"
      [[ ${#positional[@]} -eq 0 ]] || die "$E_USAGE" "$cmd takes no arguments (got '${positional[*]}')"
      "cmd_$cmd" ;;
  esac
}

main "$@"
