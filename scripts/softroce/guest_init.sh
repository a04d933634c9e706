#!/bin/bash
# Runs INSIDE a Soft-RoCE VM (started by run_vm.sh / run_two_vms.sh via vng --exec).
# Usage: guest_init.sh WORKDIR
#   WORKDIR (shared read-write with the host) holds:
#     env      - sourced first: SOFTROCE_NETDEV_MODE (dummy|nic), NODE_ADDR, PEER_ADDR,
#                NODE_RANK, SOFTROCE_CWD, SOFTROCE_PREFIX (24), SOFTROCE_NIC_MAC,
#                SOFTROCE_SHARED_DIR (two VMs: a read-write directory both VMs see),
#                SOFTROCE_PEER_WAIT (600 s)
#     cmd      - the guest command line (run as a bash script)
#   and receives:
#     rc       - exit status of the guest command (written last)
#     setup_rc - 0 when the RDMA setup succeeded
#     t_*      - guest uptime stamps (boot-to-shell, setup done, command done)
set -u
W="$1"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:${PATH:-}
# shellcheck disable=SC1091
source "$W/env"
cut -d' ' -f1 /proc/uptime > "$W/t_shell"

log() { echo "[softroce-guest $(hostname)] $*" >&2; }
fail() { log "SETUP FAILED: $*"; echo 1 > "$W/setup_rc"; echo 86 > "$W/rc"; exit 86; }

ip link set lo up
modprobe rdma_rxe || fail "modprobe rdma_rxe"

case "$SOFTROCE_NETDEV_MODE" in
  dummy)
    NETDEV=dummy0
    ip link show dummy0 >/dev/null 2>&1 || ip link add dummy0 type dummy || fail "ip link add dummy0"
    ;;
  nic)
    # The virtio NIC: the interface whose MAC is the one we gave QEMU (no guessing of names).
    NETDEV=""
    for d in /sys/class/net/*; do
      [[ "$(cat "$d/address" 2>/dev/null)" == "${SOFTROCE_NIC_MAC,,}" ]] && NETDEV="$(basename "$d")"
    done
    [[ -n "$NETDEV" ]] || fail "no interface with MAC $SOFTROCE_NIC_MAC in /sys/class/net: $(ls /sys/class/net)"
    ;;
  *) fail "unknown SOFTROCE_NETDEV_MODE=$SOFTROCE_NETDEV_MODE" ;;
esac
ip link set "$NETDEV" up || fail "ip link set $NETDEV up"
ip addr replace "$NODE_ADDR/${SOFTROCE_PREFIX:-24}" dev "$NETDEV" || fail "ip addr add"
rdma link show rxe0/1 >/dev/null 2>&1 || rdma link add rxe0 type rxe netdev "$NETDEV" \
  || fail "rdma link add rxe0 type rxe netdev $NETDEV"

ok=0
for _ in $(seq 1 300); do
  if ibv_devinfo -d rxe0 2>/dev/null | grep -q PORT_ACTIVE; then ok=1; break; fi
  sleep 0.2
done
[[ $ok == 1 ]] || fail "rxe0 port not PORT_ACTIVE after 60 s: $(ibv_devinfo -d rxe0 2>&1)"

if [[ "$SOFTROCE_NETDEV_MODE" == nic && -n "${PEER_ADDR:-}" ]]; then
  # Wait until the peer answers (the other VM may still be booting), at most
  # SOFTROCE_PEER_WAIT seconds. The peer may also have finished its command and gone
  # already: it leaves done.<rank> in the directory both VMs share; stop waiting then.
  PEER_RANK=$((1 - NODE_RANK))
  deadline=$((SECONDS + ${SOFTROCE_PEER_WAIT:-600}))
  ok=0
  while ((SECONDS < deadline)); do
    if ping -c1 -W1 "$PEER_ADDR" >/dev/null 2>&1; then ok=1; break; fi
    if [[ -n "${SOFTROCE_SHARED_DIR:-}" && -e "$SOFTROCE_SHARED_DIR/done.$PEER_RANK" ]]; then
      ok=2; log "peer $PEER_ADDR already finished its command; not waiting for it"; break
    fi
    sleep 0.5
  done
  [[ $ok != 0 ]] || fail "peer $PEER_ADDR not reachable over $NETDEV within ${SOFTROCE_PEER_WAIT:-600}s"
fi
[[ -n "${SOFTROCE_SHARED_DIR:-}" ]] && touch "$SOFTROCE_SHARED_DIR/ready.$NODE_RANK"

ulimit -l unlimited || fail "ulimit -l unlimited"
export NODE_RANK NODE_ADDR PEER_ADDR SOFTROCE_NETDEV="$NETDEV" SOFTROCE_RDMA_DEV=rxe0
[[ -n "${SOFTROCE_SHARED_DIR:-}" ]] && export SOFTROCE_SHARED_DIR
echo 0 > "$W/setup_rc"
cut -d' ' -f1 /proc/uptime > "$W/t_setup"
log "rxe0 on $NETDEV ($NODE_ADDR) ACTIVE; running command"

cd "${SOFTROCE_CWD:-/}" || cd /
bash "$W/cmd"
rc=$?
cut -d' ' -f1 /proc/uptime > "$W/t_done"
echo "$rc" > "$W/rc"
[[ -n "${SOFTROCE_SHARED_DIR:-}" ]] && echo "$rc" > "$SOFTROCE_SHARED_DIR/done.$NODE_RANK"
sync
exit "$rc"
