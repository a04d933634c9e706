#!/usr/bin/env bash
# The main job: sets everything up, then a short DDP training benchmark
# (benchmarks/benchmark.py: ResNet-50 layout, PyTorch's DDP benchmark output)
# with roce and Gloo beside it on two local ranks via torchrun; about a minute
# on a 2-core machine. Arguments go to benchmark.py (--help lists them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/torchrun --standalone --nproc_per_node 2 benchmarks/benchmark.py "$@"
