#!/usr/bin/env bash
# Emulated hosts on one machine: one network namespace per host, joined by a bridge,
# every link shaped with tc tbf in both directions (see shared/BENCHMARKING.md).
#
#   netns_hosts.sh verify [--hosts N] [--rate 1gbit]
#       build, send one TCP stream host0 -> host1, print the delivered Gbit/s, tear down.
#   netns_hosts.sh run [--hosts N] [--rate 10gbit] [--procs-per-host P] -- SCRIPT ARGS...
#       build, verify the link, then launch `torchrun SCRIPT ARGS` in every host with
#       --nnodes N --node-rank i, rendezvous on host0 (10.77.0.1); tear down.
#   netns_hosts.sh commands [--hosts N] [--rate none] -- 'CMD0' 'CMD1' ...
#       build, then run shell command CMDi in host i (one per host; e.g. the README's
#       multi-host torchrun commands with host0's address 10.77.0.1); tear down.
#   netns_hosts.sh clean
#       remove leftovers of an earlier run (namespaces named rdbench-*).
#
# Layout (no interface or address is added to the root namespace; everything lives in
# namespaces this script creates, so no traffic can leave the machine; the only files
# outside /tmp/rdbench-tmp are /etc/netns/rdbench-h*/hosts, which `ip netns exec` shows
# as /etc/hosts inside each host so the emulated hostnames resolve):
#
#   rdbench-h0 [eth0 10.77.0.1] --veth-- [rdb-s0] \
#   rdbench-h1 [eth0 10.77.0.2] --veth-- [rdb-s1] -- br0 in rdbench-sw
#   ...                                            /
#
# tbf on eth0 caps a host's upload, tbf on its rdb-sI caps its download. Each host also
# gets its own hostname (UTS namespace) and its own /dev/shm, so a backend that decides
# "same host" from the hostname, or meets peers through /dev/shm, sees separate hosts.
# /tmp stays shared (results are written there); TMPDIR points at a per-host directory.
#
# Run as root. Safe to run twice: a lock serialises runs, and each run first removes
# rdbench-* leftovers. Bounded: --timeout caps the whole run.

set -euo pipefail

PREFIX=rdbench
SUBNET=10.77.0        # /24 used only inside the namespaces created here
HOSTS=2
RATE=10gbit           # per direction per host; "none" leaves links unshaped
BURST=""              # tbf bucket bytes; default: 200 us of line rate, at least 128 KiB
QLATENCY=2ms          # tbf queue: packets waiting longer than this are dropped
PROCS=1
TIMEOUT=900
VERIFY_SECONDS=2
NO_VERIFY=0
PORT=29500
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PYTHON="${PYTHON:-$(python3 -c 'import sys; print(sys.executable)')}"

usage() { sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
log() { echo "[netns_hosts] $*" >&2; }
die() { log "error: $*"; exit 2; }

CMD="${1:-}"; [[ -n "$CMD" ]] || usage 2
shift
while [[ $# -gt 0 ]]; do
    case "$1" in
        --hosts) HOSTS="$2"; shift 2 ;;
        --rate) RATE="$2"; shift 2 ;;
        --burst) BURST="$2"; shift 2 ;;
        --queue) QLATENCY="$2"; shift 2 ;;
        --procs-per-host) PROCS="$2"; shift 2 ;;
        --timeout) TIMEOUT="$2"; shift 2 ;;
        --verify-seconds) VERIFY_SECONDS="$2"; shift 2 ;;
        --no-verify) NO_VERIFY=1; shift ;;
        --port) PORT="$2"; shift 2 ;;
        -h|--help) usage 0 ;;
        --) shift; break ;;
        *) die "unknown option $1 (see --help)" ;;
    esac
done
[[ $EUID -eq 0 ]] || die "needs root (network namespaces, tc)"
command -v ip >/dev/null || die "ip missing: apt-get update && apt-get install -y iproute2"
command -v tc >/dev/null || die "tc missing: apt-get update && apt-get install -y iproute2"
[[ "$HOSTS" =~ ^[0-9]+$ && "$HOSTS" -ge 2 && "$HOSTS" -le 200 ]] || die "--hosts must be 2..200"

ns_host() { echo "${PREFIX}-h$1"; }
NS_SW="${PREFIX}-sw"
addr_of() { echo "${SUBNET}.$(( $1 + 1 ))"; }

# Everything this script may have made: namespaces with our prefix. Processes still inside
# them (started by an earlier run of this script) are ended first, by pid, or the
# namespace would outlive `ip netns del`.
clean_all() {
    local ns pids
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${PREFIX}-" || true); do
        pids="$(ip netns pids "$ns" 2>/dev/null || true)"
        if [[ -n "$pids" ]]; then
            kill -TERM $pids 2>/dev/null || true
            sleep 1
            pids="$(ip netns pids "$ns" 2>/dev/null || true)"
            [[ -z "$pids" ]] || kill -KILL $pids 2>/dev/null || true
        fi
        ip netns del "$ns" 2>/dev/null || true
    done
    rm -rf "/tmp/${PREFIX}-tmp" 2>/dev/null || true
    rm -rf /etc/netns/"${PREFIX}"-* 2>/dev/null || true
    if [[ -e "/etc/netns/.${PREFIX}-created" ]]; then  # /etc/netns was ours: remove it too
        rm -f "/etc/netns/.${PREFIX}-created"; rmdir /etc/netns 2>/dev/null || true
    fi
}

# One run at a time (clean too): a second run would delete the first one's namespaces.
exec 9>"/run/${PREFIX}.lock"
flock -w 60 9 || die "another netns_hosts.sh run holds /run/${PREFIX}.lock"

if [[ "$CMD" == clean ]]; then
    clean_all; log "removed ${PREFIX}-* namespaces"; exit 0
fi
[[ "$CMD" == verify || "$CMD" == run || "$CMD" == commands ]] || usage 2
[[ "$CMD" == verify || $# -gt 0 ]] || die "$CMD needs -- SCRIPT [ARGS...] (run) or one command per host (commands)"

CHILD_PIDS=()
on_exit() {
    local rc=$?
    trap - EXIT INT TERM
    local p
    for p in "${CHILD_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    clean_all
    exit "$rc"
}
trap on_exit EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Bound the whole run: a watchdog signals this shell, whose trap tears everything down.
# It ends its own sleep when told to stop, so no stray sleep outlives the run.
(
    trap 'kill "$s" 2>/dev/null; wait "$s"; exit 0' TERM
    sleep "$TIMEOUT" & s=$!
    wait "$s"
    log "timeout after ${TIMEOUT}s"
    kill -TERM $$ 2>/dev/null
) &
WATCHDOG=$!
CHILD_PIDS+=("$WATCHDOG")

# tbf's bucket must hold a whole 64 KiB GSO packet plus headers (else tbf segments it, and
# at 1gbit a 64 KiB bucket delivered 72-94%), and cover the qdisc watchdog's wake-up delay
# on a busy 2-core VM (100 us worth delivered 66% of 5gbit). 200 us worth, at least
# 128 KiB, delivered 91-96% at 1, 5 and 10gbit. Larger buckets would let more of each
# message through unshaped after an idle gap.
burst_for() {
    local rate="$1" bits
    bits=$("$PYTHON" - "$rate" <<'EOF'
import re, sys
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", sys.argv[1].lower())
if not m:
    sys.exit("bad rate " + sys.argv[1])
print(int(float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)]))
EOF
)
    local bytes=$(( bits / 8 / 5000 ))      # 200 us worth
    (( bytes >= 131072 )) || bytes=131072
    echo "$bytes"
}

shape() {  # shape NS IFACE
    [[ "$RATE" == none ]] && return 0
    ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$RATE" \
        burst "${BURST:-$(burst_for "$RATE")}" latency "$QLATENCY"
}

build() {
    clean_all
    ip netns add "$NS_SW"
    ip -n "$NS_SW" link set lo up
    ip -n "$NS_SW" link add br0 type bridge
    ip -n "$NS_SW" link set br0 up
    local i ns
    for (( i = 0; i < HOSTS; i++ )); do
        ns="$(ns_host "$i")"
        ip netns add "$ns"
        ip -n "$ns" link set lo up
        # Created inside the switch namespace, peer moved straight into the host's.
        ip -n "$NS_SW" link add "rdb-s$i" type veth peer name eth0 netns "$ns"
        ip -n "$NS_SW" link set "rdb-s$i" master br0 up
        ip -n "$ns" addr add "$(addr_of "$i")/24" dev eth0
        ip -n "$ns" link set eth0 up
        shape "$ns" eth0
        shape "$NS_SW" "rdb-s$i"
    done
    # ip netns exec bind-mounts /etc/netns/NS/hosts over /etc/hosts: the emulated hostnames
    # resolve to their addresses inside the namespaces (c10d looks peers' names up).
    local hosts_file="/tmp/${PREFIX}-tmp/hosts"
    mkdir -p "/tmp/${PREFIX}-tmp"
    { echo "127.0.0.1 localhost"
      for (( i = 0; i < HOSTS; i++ )); do echo "$(addr_of "$i") $(ns_host "$i")"; done
    } >"$hosts_file"
    if [[ ! -d /etc/netns ]]; then mkdir /etc/netns; touch "/etc/netns/.${PREFIX}-created"; fi
    for (( i = 0; i < HOSTS; i++ )); do
        mkdir -p "/etc/netns/$(ns_host "$i")"
        cp "$hosts_file" "/etc/netns/$(ns_host "$i")/hosts"
    done
    log "built $HOSTS hosts ${SUBNET}.1..$(addr_of $((HOSTS - 1))) on a bridge, rate $RATE" \
        "burst ${BURST:-$( [[ $RATE == none ]] && echo - || burst_for "$RATE")} B"
}

# One TCP stream host0 -> host1; prints the receiver's JSON result line.
stream_once() {
    local out="/tmp/${PREFIX}-tmp/verify.out"
    local to; to="$(addr_of 1)"
    ip netns exec "$(ns_host 1)" timeout $(( VERIFY_SECONDS + 30 )) "$PYTHON" \
        "$HERE/memcpy_ceiling.py" tcp-recv --bind "$to" --port 5201 \
        --timeout $(( VERIFY_SECONDS + 20 )) >"$out" &
    local rpid=$!
    CHILD_PIDS+=("$rpid")
    ip netns exec "$(ns_host 0)" timeout $(( VERIFY_SECONDS + 30 )) "$PYTHON" \
        "$HERE/memcpy_ceiling.py" tcp-send --to "$to" --port 5201 \
        --seconds "$VERIFY_SECONDS" --timeout 20
    wait "$rpid"
    tail -n 1 "$out"
}

# Every host sends to the next one and receives from the previous one at once (a ring
# step's traffic pattern): prints the per-stream Gbit/s, one per line. This is the ceiling
# a ring collective can reach here: on 2 cores, N concurrent shaped streams through the
# bridge cost CPU that one stream does not.
ring_once() {
    local i to rpids=() out
    for (( i = 0; i < HOSTS; i++ )); do
        ip netns exec "$(ns_host "$i")" timeout $(( VERIFY_SECONDS + 30 )) "$PYTHON" \
            "$HERE/memcpy_ceiling.py" tcp-recv --bind "$(addr_of "$i")" --port 5202 \
            --timeout $(( VERIFY_SECONDS + 20 )) >"/tmp/${PREFIX}-tmp/ring$i.out" &
        rpids+=($!); CHILD_PIDS+=($!)
    done
    for (( i = 0; i < HOSTS; i++ )); do
        to="$(addr_of $(( (i + 1) % HOSTS )))"
        ip netns exec "$(ns_host "$i")" timeout $(( VERIFY_SECONDS + 30 )) "$PYTHON" \
            "$HERE/memcpy_ceiling.py" tcp-send --to "$to" --port 5202 \
            --seconds "$VERIFY_SECONDS" --timeout 20 &
        CHILD_PIDS+=($!)
    done
    wait
    for (( i = 0; i < HOSTS; i++ )); do tail -n 1 "/tmp/${PREFIX}-tmp/ring$i.out"; done
}

ring_report() {
    "$PYTHON" - "$RATE" "$@" <<'EOF2'
import json, re, sys
rate, streams = sys.argv[1], [json.loads(a)["Gbitps"] for a in sys.argv[2:]]
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate.lower())
want = float(m.group(1)) * {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1}[m.group(2)] if m else None
low, mean = min(streams), sum(streams) / len(streams)
msg = (f"verify: ring of {len(streams)} concurrent streams (host i -> i+1): "
       f"slowest {low:.3f}, mean {mean:.3f} Gbit/s per stream")
if want:
    msg += f" = {100 * low / want:.1f}% / {100 * mean / want:.1f}% of {rate}"
print(f"{low:.3f}")
print(msg, file=sys.stderr)
EOF2
}

# Delivered rate on the shaped path, then on the same path with shaping lifted for a moment:
# if the unshaped path cannot reach the rate either, the shortfall is CPU (a busy 2-core
# machine), not the shaping. Prints the shaped Gbit/s on stdout, a report on stderr.
verify_link() {
    local shaped unshaped=""
    shaped="$(stream_once)"
    if [[ "$RATE" != none ]]; then
        ip netns exec "$(ns_host 0)" tc qdisc del dev eth0 root
        ip netns exec "$NS_SW" tc qdisc del dev rdb-s1 root
        unshaped="$(stream_once)"
        shape "$(ns_host 0)" eth0
        shape "$NS_SW" rdb-s1
    fi
    "$PYTHON" - "$RATE" "$shaped" "$unshaped" <<'EOF'
import json, re, sys
rate, shaped = sys.argv[1], json.loads(sys.argv[2])
unshaped = json.loads(sys.argv[3]) if sys.argv[3] else None
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate.lower())
want = float(m.group(1)) * {"": 1e-9, "k": 1e-6, "m": 1e-3, "g": 1}[m.group(2)] if m else None
got = shaped["Gbitps"]
msg = (f"verify: host0 -> host1, one TCP stream: {got:.3f} Gbit/s "
       f"({shaped['bytes'] / 1e6:.0f} MB in {shaped['seconds']:.2f} s)")
if want:
    msg += f" = {100 * got / want:.1f}% of {rate}"
    msg += f"; same path unshaped: {unshaped['Gbitps']:.3f} Gbit/s" if unshaped else ""
print(f"{got:.3f}")
print(msg, file=sys.stderr)
if want and got < 0.8 * want:
    why = ("the unshaped path is not much faster either: CPU-bound (busy machine?)"
           if unshaped and unshaped["Gbitps"] < 1.3 * want else "check the tbf settings")
    print(f"WARNING: link delivers under 80% of {rate}; {why}", file=sys.stderr)
EOF
}

build
GBITS=""
RING_GBITS=""
if [[ "$CMD" == verify || $NO_VERIFY -eq 0 ]]; then
    GBITS="$(verify_link)"
    mapfile -t ring_lines < <(ring_once)
    RING_GBITS="$(ring_report "${ring_lines[@]}")"
fi
[[ "$CMD" == verify ]] && exit 0

# run: one torchrun per host, in that host's namespace, hostname and /dev/shm.
export RDBENCH_HOSTS="$HOSTS" RDBENCH_RATE="$RATE" RDBENCH_PROCS_PER_HOST="$PROCS"
export RDBENCH_VERIFIED_GBITPS="$GBITS" RDBENCH_RING_GBITPS="$RING_GBITS" OMP_NUM_THREADS=1
if [[ "$CMD" == commands ]]; then
    (( $# == HOSTS )) || die "commands: $# commands given for $HOSTS hosts"
    HOST_CMDS=("$@")
fi
LAUNCH=()
for (( i = 0; i < HOSTS; i++ )); do
    ns="$(ns_host "$i")"
    mkdir -p "/tmp/${PREFIX}-tmp/h$i"
    log_file="/tmp/${PREFIX}-tmp/h$i.log"
    # Host 0 prints (it holds rank 0); the others log to a file shown on failure.
    [[ $i -eq 0 ]] && log_file=/dev/stdout
    if [[ "$CMD" == commands ]]; then
        argv=(bash -c "${HOST_CMDS[$i]}")
    else
        argv=("$PYTHON" -m torch.distributed.run --nnodes "$HOSTS" --node-rank "$i"
              --nproc-per-node "$PROCS" --master-addr "$(addr_of 0)" --master-port "$PORT" "$@")
    fi
    ip netns exec "$ns" unshare --uts --mount --propagation private -- \
        env TMPDIR="/tmp/${PREFIX}-tmp/h$i" RDBENCH_HOST="$i" \
        bash -c 'hostname "$1"; mount -t tmpfs -o size=50% rdbench-shm /dev/shm; shift; exec "$@"' \
        _ "$ns" "${argv[@]}" >"$log_file" 2>&1 &
    LAUNCH+=($!)
    CHILD_PIDS+=($!)
done

# Wait for all; the first failure ends the others so nobody waits on a dead peer.
rc=0
pending=("${LAUNCH[@]}")
while (( ${#pending[@]} > 0 )); do
    finished=""
    wait -n -p finished "${pending[@]}" || rc=$?
    pending=($(printf '%s\n' "${pending[@]}" | grep -vx "$finished" || true))
    if (( rc != 0 )); then
        log "host launch pid $finished failed (rc $rc); stopping the others"
        for (( i = 1; i < HOSTS; i++ )); do
            log "---- host $i log tail"; tail -n 15 "/tmp/${PREFIX}-tmp/h$i.log" >&2 || true
        done
        break
    fi
done
exit "$rc"
