#!/usr/bin/env bash
# Multi-machine DDP benchmark over roce, launched the way cluster guides do it:
# the same command on every machine, only NODE_RANK differs.
#
#   machine 0:  MASTER_ADDR=10.0.0.1 bash examples/train.sh 2 0
#   machine 1:  MASTER_ADDR=10.0.0.1 bash examples/train.sh 2 1
#
# Extra arguments go to benchmarks/benchmark.py, e.g.
#   bash examples/train.sh 2 0 --model transformer --backend roce,gloo --json /tmp/e2e.json
set -euo pipefail
NNODES=${1:?usage: train.sh NNODES NODE_RANK [benchmark.py flags]}
NODE_RANK=${2:?usage: train.sh NNODES NODE_RANK [benchmark.py flags]}
shift 2
cd "$(dirname "$0")/.."

# Rendezvous: machine 0's address, reachable from every machine, and a free port there.
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
MASTER_PORT=${MASTER_PORT:-29500}

# One process per GPU when there are GPUs, otherwise 2 CPU processes per machine
# (they talk over shared memory; machines talk over RDMA).
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  NPROC_PER_NODE=${NPROC_PER_NODE:-$(nvidia-smi -L | wc -l)}
  DEVICE=${DEVICE:-cuda}
else
  NPROC_PER_NODE=${NPROC_PER_NODE:-2}
  DEVICE=${DEVICE:-cpu}
fi

# RDMA settings (README "Configuration"); set them the same on every machine.
# RDMA device and port to use, NCCL syntax; `ibv_devinfo` lists devices, pick
# the one whose port is PORT_ACTIVE on the network the machines share:
# export ROCE_PG_IB_HCA=mlx5_0:1
# RoCE v2 GID index of that port (`bash scripts/softroce/show_gids.sh`: the
# RoCE v2 line with the interface's IPv4 address; 3 on many mlx5 setups, 1 on
# eRDMA/rxe). Unset = picked automatically:
# export ROCE_PG_IB_GID_INDEX=3
# Network interface whose IPv4 address the other machines reach (bootstrap
# and the TCP transport), e.g. the RDMA NIC's netdev:
# export ROCE_PG_SOCKET_IFNAME=eth0
# The benchmark's bookkeeping group is Gloo; point it at the same interface:
# export GLOO_SOCKET_IFNAME=$ROCE_PG_SOCKET_IFNAME
# Print the device, port, GID, MTU and traffic class each group uses (rank 0):
# export ROCE_PG_DEBUG=INFO

TORCHRUN=${TORCHRUN:-$( [[ -x .venv/bin/torchrun ]] && echo .venv/bin/torchrun || echo torchrun )}
exec "$TORCHRUN" --nnodes "$NNODES" --node_rank "$NODE_RANK" --nproc_per_node "$NPROC_PER_NODE" \
  --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \
  benchmarks/benchmark.py --device "$DEVICE" "$@"
