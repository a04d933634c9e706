#!/usr/bin/env bash
# Installs everything roce needs on a fresh Debian/Ubuntu machine, then builds the
# extension in place. Idempotent: a second run only checks and rebuilds what changed.
#   apt: compiler, rdma-core userspace (libibverbs headers + providers), libssl3
#   (libcrypto: the job secret's HMAC, loaded at run time)
#   .venv/: torch (from PyPI), pytest, numpy, expecttest (torch.testing._internal,
#   which tests/test_conformance.py runs, imports it), and roce_pg installed in editable mode
set -euo pipefail
cd "$(dirname "$0")/.."

TORCH_SPEC="${ROCE_PG_TORCH_SPEC:-torch==2.15.0}"
APT_PACKAGES=(g++ make python3-venv python3-dev libibverbs-dev rdma-core ibverbs-providers ibverbs-utils libssl3)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# apt needs root: through sudo when we are not root (sudo resets the environment,
# hence `env DEBIAN_FRONTEND=...` after it). The rest runs as the calling user:
# .venv/ and the build belong to whoever owns the checkout.
if ((${#missing[@]})); then
  SUDO=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "setup.sh: installing ${missing[*]} needs root or sudo" >&2; exit 1; }
    SUDO=(sudo)
  fi
  echo "setup.sh: ${SUDO[*]:+sudo }apt-get install ${missing[*]}" >&2
  "${SUDO[@]}" apt-get update -qq
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi

PY="${PYTHON:-python3}"
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
VPY=.venv/bin/python
if ! "$VPY" -c "import torch, pytest, numpy, ninja, matplotlib, expecttest" 2>/dev/null; then
  "$VPY" -m pip install -q --upgrade pip setuptools wheel
  "$VPY" -m pip install -q "$TORCH_SPEC" pytest numpy ninja matplotlib expecttest
fi

# Build the C++ extension in place (fast no-op when nothing changed).
MAX_JOBS="${MAX_JOBS:-$(nproc)}" "$VPY" -m pip install -q --no-build-isolation -e . 
