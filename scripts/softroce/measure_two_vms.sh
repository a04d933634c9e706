#!/bin/bash
# Guest-side ib_write_bw between the TWO VMs of run_two_vms.sh (node 0 = server).
#   scripts/softroce/run_two_vms.sh 'bash scripts/softroce/measure_two_vms.sh'
# MB (default 64): MiB moved per direction per test; SIZES (default "1 4 8", MiB).
set -u
HC=/sys/class/infiniband/rxe0/ports/1/hw_counters
MB="${MB:-64}"; SIZES="${SIZES:-1 4 8}"
echo "== $(hostname) rank=$NODE_RANK addr=$NODE_ADDR peer=$PEER_ADDR netdev=$SOFTROCE_NETDEV nproc=$(nproc) uptime=$(cut -d' ' -f1 /proc/uptime)"
echo "== /sys/class/net: $(ls /sys/class/net | tr '\n' ' ')  driver of $SOFTROCE_NETDEV: $(basename "$(readlink /sys/class/net/$SOFTROCE_NETDEV/device/driver)")"
ibv_devinfo -d rxe0 | grep -E 'state|active_mtu|link_layer'
P=/sys/class/infiniband/rxe0/ports/1
for i in 0 1; do echo "  gid $i: $(cat $P/gids/$i) $(cat $P/gid_attrs/types/$i) $(cat $P/gid_attrs/ndevs/$i)"; done
ping -c 3 -q "$PEER_ADDR" | tail -2

rc_all=0
port=18700
for mode in uni bi; do
  for s in $SIZES; do
    port=$((port + 1))
    n=$(( MB / s )); (( n < 5 )) && n=5
    extra=(); [[ $mode == bi ]] && extra=(-b)
    args=(-d rxe0 -x 1 -F -p "$port" -s $((s * 1048576)) -n "$n" "${extra[@]}")
    before="$(cat $HC/sent_pkts)"
    t0="$(date +%s.%N)"
    if [[ $NODE_RANK == 0 ]]; then
      timeout 600 ib_write_bw "${args[@]}" > /tmp/bw.log 2>&1; rc=$?
    else
      for _ in $(seq 1 60); do   # the server may not listen yet
        timeout 600 ib_write_bw "${args[@]}" "$PEER_ADDR" > /tmp/bw.log 2>&1; rc=$?
        grep -q "Couldn't connect" /tmp/bw.log || break
        sleep 1
      done
    fi
    t1="$(date +%s.%N)"
    after="$(cat $HC/sent_pkts)"
    res="$(grep -A1 '#bytes' /tmp/bw.log | tail -1 | awk '{print "size=" $1 " iters=" $2 " peak=" $3 " avg=" $4 " MB/s"}')"
    echo "== $mode ${s}MiB x$n: rc=$rc $res wall=$(awk "BEGIN{print $t1-$t0}")s sent_pkts +$((after - before)) (payload/1024 = $(( (s * 1048576 * n) / 1024 )))"
    [[ $rc == 0 ]] || { tail -15 /tmp/bw.log; rc_all=1; }
  done
done
echo "== hw_counters: $(for f in sent_pkts rcvd_pkts rdma_sends rdma_recvs retry_exceeded_err rcvd_seq_err out_of_seq_request duplicate_request; do printf '%s=%s ' $f "$(cat $HC/$f)"; done)"
exit $rc_all
