#!/usr/bin/env bash
# Repeats tests on a quiet machine and beside one busy process per core and
# prints each test's pass count (scripts/flaky.py has the options):
#   bash scripts/flaky.sh -n 10 tests/test_small_ops.py
# Needs the environment scripts/setup.sh makes (.venv, the extension built).
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/flaky.py "$@"
