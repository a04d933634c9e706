#!/usr/bin/env bash
# Idempotently installs what the Soft-RoCE VM scripts need (as root, or as a user with sudo; no stdin):
#   apt: QEMU, Debian's own kernel (ships rdma_rxe), rdma-core userspace, perftest, ...
#   pip: virtme-ng (`vng`) into its own venv ($VNG_VENV, default scripts/softroce/.venv-vng)
# Prints the kernel image the VM scripts will boot (last line: KERNEL=<path>).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
VNG_VENV="${VNG_VENV:-$HERE/.venv-vng}"
VNG_SPEC="${VNG_SPEC:-virtme-ng}"

APT_PACKAGES=(qemu-system-x86 linux-image-amd64 rdma-core ibverbs-providers ibverbs-utils
              perftest iproute2 iputils-ping busybox-static udev kmod procps coreutils python3-venv)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# apt needs root: sudo for a non-root user (with `env`, as sudo resets the environment).
# The rest (the vng venv, the VMs: QEMU in pure emulation) runs as the calling user.
[[ $(id -u) -eq 0 ]] && AS_ROOT=() || AS_ROOT=(sudo)
if ((${#missing[@]})); then
  echo "softroce/setup: ${AS_ROOT[*]:+sudo }apt-get install ${missing[*]}" >&2
  "${AS_ROOT[@]}" apt-get update -qq </dev/null
  "${AS_ROOT[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null
fi

# virtme-ng in its own venv, built from Debian's python3 (not tied to pyenv).
if ! "$VNG_VENV/bin/vng" --version >/dev/null 2>&1; then
  echo "softroce/setup: creating $VNG_VENV with $VNG_SPEC" >&2
  rm -rf "$VNG_VENV"
  /usr/bin/python3 -m venv "$VNG_VENV"
  "$VNG_VENV/bin/python" -m pip install -q --upgrade pip </dev/null
  "$VNG_VENV/bin/python" -m pip install -q "$VNG_SPEC" </dev/null
fi

# shellcheck source=common.sh
source "$HERE/common.sh"
KERNEL="$(softroce_kernel)"
[[ -n "$KERNEL" && -e "$KERNEL" ]] || { echo "softroce/setup: no kernel image /boot/vmlinuz-*-amd64 found" >&2; exit 1; }
if [[ ! -r "$KERNEL" ]]; then
  # Debian installs kernel images world-readable; Ubuntu makes them root-only, which
  # stops QEMU run by a non-root user.
  echo "softroce/setup: $KERNEL is not readable by $(id -un); the VMs boot it as this user. Fix:" >&2
  echo "  sudo dpkg-statoverride --update --add root root 0644 $KERNEL   (or sudo chmod 0644 $KERNEL)" >&2
  exit 1
fi
KVER="$(softroce_kver "$KERNEL")"
if ! find "/lib/modules/$KVER" -name 'rdma_rxe.ko*' | grep -q .; then
  echo "softroce/setup: rdma_rxe module missing under /lib/modules/$KVER" >&2; exit 1
fi
echo "softroce/setup: vng $("$VNG_VENV/bin/vng" --version 2>&1 | head -1)" >&2
echo "KERNEL=$KERNEL"
