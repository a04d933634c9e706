#!/usr/bin/env bash
# Sets everything up (including the Soft-RoCE VM tooling), then runs the whole
# test suite: host tests and the Soft-RoCE VM suite (tests/test_softroce.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/softroce/setup.sh
exec .venv/bin/python -m pytest tests "$@"
