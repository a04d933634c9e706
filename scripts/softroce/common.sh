# Shared helpers for the Soft-RoCE VM scripts (sourced, not executed).
SOFTROCE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$SOFTROCE_DIR/../.." && pwd)"
VNG_VENV="${VNG_VENV:-$SOFTROCE_DIR/.venv-vng}"
VNG="$VNG_VENV/bin/vng"

# Kernel image to boot: $SOFTROCE_KERNEL, else the newest Debian /boot/vmlinuz-*-amd64.
softroce_kernel() {
  if [[ -n "${SOFTROCE_KERNEL:-}" ]]; then echo "$SOFTROCE_KERNEL"; return; fi
  local k
  k="$(ls -1 /boot/vmlinuz-*-amd64 2>/dev/null | sort -V | tail -1)"
  [[ -n "$k" ]] && echo "$k"
}
softroce_kver() { basename "$1" | sed 's/^vmlinuz-//'; }

# softroce_prepare_workdir NAME MODE NODE_ADDR PEER_ADDR NODE_RANK MAC CMD
# Creates a host directory shared read-write with the guest, holding env + cmd.
softroce_prepare_workdir() {
  local name="$1" mode="$2" addr="$3" peer="$4" rank="$5" mac="$6" cmd="$7" w
  w="$(mktemp -d "${SOFTROCE_TMP:-/tmp}/softroce-$name.XXXXXX")"
  {
    printf 'SOFTROCE_NETDEV_MODE=%q\n' "$mode"
    printf 'NODE_ADDR=%q\n' "$addr"
    printf 'PEER_ADDR=%q\n' "$peer"
    printf 'NODE_RANK=%q\n' "$rank"
    printf 'SOFTROCE_NIC_MAC=%q\n' "$mac"
    printf 'SOFTROCE_CWD=%q\n' "${SOFTROCE_CWD:-$PWD}"
    printf 'SOFTROCE_HOSTNAME=%q\n' "$name"
    [[ -n "${SOFTROCE_SHARED_DIR:-}" ]] && printf 'SOFTROCE_SHARED_DIR=%q\n' "$SOFTROCE_SHARED_DIR"
    [[ -n "${SOFTROCE_PEER_WAIT:-}" ]] && printf 'SOFTROCE_PEER_WAIT=%q\n' "$SOFTROCE_PEER_WAIT"
    # Extra variables to forward to the guest: SOFTROCE_PASS_ENV="VAR1 VAR2"
    local v
    for v in ${SOFTROCE_PASS_ENV:-}; do
      [[ -n "${!v+x}" ]] && printf 'export %s=%q\n' "$v" "${!v}"
    done
  } > "$w/env"
  printf '%s\n' "$cmd" > "$w/cmd"
  date +%s.%N > "$w/t_launch_host"
  echo "$w"
}

# softroce_vng_args NAME WORKDIR [extra vng args...]: sets the array VNG_ARGS
softroce_vng_args() {
  local name="$1" w="$2"; shift 2
  VNG_ARGS=(--run "$(softroce_kernel)" --user root --disable-kvm
            --name "$name"
            --cpus "${SOFTROCE_CPUS:-2}" --memory "${SOFTROCE_MEM:-4G}"
            --rwdir "${SOFTROCE_RWDIR:-$REPO_ROOT}" --rwdir "$w"
            "$@"
            --exec "bash $SOFTROCE_DIR/guest_init.sh $w")
  [[ -n "${SOFTROCE_VERBOSE:-}" ]] && VNG_ARGS=(--verbose "${VNG_ARGS[@]}")
  return 0
}

# softroce_result WORKDIR VNG_RC -> exit status to report
#   the guest command's status if it ran; 124 on timeout; 86 if the VM/setup failed.
softroce_result() {
  local w="$1" vrc="$2" name; name="$(basename "$w")"
  local t_shell t_setup t_done
  t_shell="$(cat "$w/t_shell" 2>/dev/null || echo '?')"
  t_setup="$(cat "$w/t_setup" 2>/dev/null || echo '?')"
  t_done="$(cat "$w/t_done" 2>/dev/null || echo '?')"
  # Host wall clock from launch to the guest's shell: mtime of t_shell (written by the guest
  # over 9p) minus the launch time.
  local l h_shell="?" h_end
  l="$(cat "$w/t_launch_host" 2>/dev/null || echo 0)"
  [[ -e "$w/t_shell" ]] && h_shell="$(awk "BEGIN{printf \"%.1f\", $(stat -c %.3Y "$w/t_shell") - $l}")"
  h_end="$(awk "BEGIN{printf \"%.1f\", $(cat "$w/t_end_host" 2>/dev/null || date +%s.%N) - $l}")"
  echo "softroce[$name]: host wall: launch->guest shell ${h_shell}s, launch->VM gone ${h_end}s; guest uptime at shell=${t_shell}s rdma-ready=${t_setup}s command-done=${t_done}s; vng rc=$vrc" >&2
  if [[ "$vrc" == 124 || "$vrc" == 137 ]]; then
    echo "softroce[$name]: TIMEOUT after ${SOFTROCE_TIMEOUT:-1800}s" >&2; echo 124; return
  fi
  if [[ -s "$w/rc" ]]; then cat "$w/rc"; return; fi
  echo "softroce[$name]: VM ended without the guest command finishing (vng rc=$vrc)" >&2
  if [[ "$vrc" != 0 ]]; then echo "$vrc"; else echo 86; fi
}

softroce_check() {
  [[ -x "$VNG" ]] || { echo "softroce: $VNG missing: run scripts/softroce/setup.sh" >&2; exit 2; }
  [[ -n "$(softroce_kernel)" ]] || { echo "softroce: no /boot/vmlinuz-*-amd64: run setup.sh" >&2; exit 2; }
  export PATH="$VNG_VENV/bin:$PATH"   # vng calls virtme-run through PATH
}

# If this script is stopped (CI cancels the job), stop the VMs too: `timeout` runs vng and
# QEMU in a process group of their own, so a signal to our group would not reach them.
SOFTROCE_PIDS=()
SOFTROCE_WORKDIRS=()
softroce_stop_all() {
  local sig="$1" p
  trap - INT TERM HUP
  echo "softroce: got SIG$sig, stopping the VM(s)" >&2
  for p in "${SOFTROCE_PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; done
  for p in "${SOFTROCE_PIDS[@]}"; do wait "$p" 2>/dev/null; done
  [[ -n "${SOFTROCE_KEEP:-}" ]] || rm -rf "${SOFTROCE_WORKDIRS[@]}"
  exit 143
}
softroce_trap_signals() {
  trap 'softroce_stop_all INT' INT
  trap 'softroce_stop_all TERM' TERM
  trap 'softroce_stop_all HUP' HUP
}
