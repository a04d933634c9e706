#!/usr/bin/env bash
# The main job: sets everything up, then a short DDP training benchmark with
# roce (and Gloo beside it for comparison) on two local ranks via torchrun.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/torchrun --standalone --nproc_per_node 2 examples/ddp_benchmark.py "$@"
