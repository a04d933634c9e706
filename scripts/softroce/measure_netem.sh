#!/bin/bash
# Guest-side: ib_write_bw between the TWO VMs of run_two_vms.sh (node 0 = server)
# under several netem settings on the RoCE packets only (UDP port 4791; the TCP
# that perftest uses to exchange QP numbers is left alone). Both VMs shape their
# own egress. Prints bandwidth, netem drops and rxe's retransmission counters.
#   scripts/softroce/run_two_vms.sh 'bash scripts/softroce/measure_netem.sh'
# SIZE (default 65536 bytes per message), N (default 300 messages),
# SETTINGS: netem arguments per step, separated by ';' (an empty step = no netem).
set -u
HC=/sys/class/infiniband/rxe0/ports/1/hw_counters
DEV="$SOFTROCE_NETDEV"; S="$SOFTROCE_SHARED_DIR"; PEER=$((1 - NODE_RANK))
SIZE="${SIZE:-65536}"; N="${N:-300}"
IFS=';' read -r -a STEPS <<< "${SETTINGS:-;loss 1%;loss 1% delay 1ms reorder 25% 50%;loss 1% delay 1ms reorder 5%}"
counters() { for f in sent_pkts out_of_seq_request duplicate_request rcvd_seq_err completer_retry_err retry_exceeded_err; do printf '%s=%s ' $f "$(cat $HC/$f)"; done; }
sync_peer() {  # sync_peer NAME: both nodes reach this point
  touch "$S/$1.$NODE_RANK"
  for _ in $(seq 1 600); do [[ -e "$S/$1.$PEER" ]] && return 0; sleep 0.2; done
  echo "== peer never reached $1"; return 1
}
i=0; port=18800
for step in "${STEPS[@]}"; do
  i=$((i + 1)); port=$((port + 1))
  tc qdisc del dev "$DEV" root 2>/dev/null
  if [[ -n "${step// /}" ]]; then
    tc qdisc add dev "$DEV" root handle 1: prio
    tc qdisc add dev "$DEV" parent 1:3 handle 30: netem limit 10000 $step
    tc filter add dev "$DEV" parent 1:0 protocol ip u32 match ip dport 4791 0xffff flowid 1:3
  fi
  sync_peer "set$i" || exit 1
  before="$(counters)"; t0="$(date +%s.%N)"
  args=(-d rxe0 -x 1 -F -p "$port" -s "$SIZE" -n "$N")
  if [[ $NODE_RANK == 0 ]]; then
    timeout 300 ib_write_bw "${args[@]}" > /tmp/bw.log 2>&1; rc=$?
  else
    for _ in $(seq 1 60); do
      timeout 300 ib_write_bw "${args[@]}" "$PEER_ADDR" > /tmp/bw.log 2>&1; rc=$?
      grep -q "Couldn't connect" /tmp/bw.log || break
      sleep 1
    done
  fi
  t1="$(date +%s.%N)"
  res="$(grep -A1 '#bytes' /tmp/bw.log | tail -1 | awk '{print "avg=" $4 " MB/s"}')"
  echo "== step $i netem '${step}': rc=$rc $res wall=$(awk "BEGIN{print $t1-$t0}")s"
  echo "   before: $before"
  echo "   after:  $(counters)"
  tc -s qdisc show dev "$DEV" | sed 's/^/   /'
  [[ $rc == 0 ]] || tail -8 /tmp/bw.log
  sync_peer "done$i" || exit 1
done
tc qdisc del dev "$DEV" root 2>/dev/null
exit 0
