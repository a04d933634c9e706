#!/usr/bin/env bash
# Sets everything up (including the Soft-RoCE VM tooling), then runs the whole
# test suite: host tests and the Soft-RoCE VM suite (tests/test_softroce.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The test device's extension (tests/testdev: ~3 CPU-minutes to compile)
# builds while the VM tooling installs, which is mostly downloads and apt;
# the tests then find it built (a failure here only costs them the build).
mkdir -p build
.venv/bin/python -c "from tests.testdev import load; load()" > build/testdev-prebuild.log 2>&1 &
prebuild=$!
trap 'wait "$prebuild" 2>/dev/null || true' EXIT  # never leave it half-built behind us
bash scripts/softroce/setup.sh
wait "$prebuild" ||
  echo "test.sh: building the test device beforehand failed; the tests build it (build/testdev-prebuild.log)" >&2
exec .venv/bin/python -m pytest tests "$@"
