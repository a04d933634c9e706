#!/usr/bin/env bash
# One bounded pass over everything roce has to prove on a GPU: environment,
# build, the CUDA tests, the probe tests, the staging benchmark and the
# many-core host table. GPU time is lent rarely and briefly, so the whole run
# fits one device call: every step has a cap, the caps add up to 9 minutes
# (540 s, inside the 600 s of a call), and a failed step does not stop the next.
#
# Through the device tool: carry `.debs` and run `bash scripts/gpu_check.sh`
# with timeout_s 600. The GPU machine has no libibverbs and no network, so the
# .deb files in $DEBS (default .debs/, prepared beforehand on a Debian/Ubuntu
# machine with `apt-get download libibverbs1 libibverbs-dev ibverbs-providers
# rdma-core ibverbs-utils libnl-3-200 libnl-route-3-200`) are unpacked into a
# private prefix and the build is pointed at it. Without that folder the
# system's libibverbs is used.
#
# Writes $OUT/report.md, $OUT/results.json and $OUT/log.txt (OUT defaults to
# out/gpu_check) and exits 0 once they are written: the steps' outcomes are in
# them. Without a CUDA device it stops after the build and says so.
# PYTHON (default python3) must have torch; MAX_JOBS defaults to nproc.
# To check this script on a CPU machine: GPU_CHECK_FORCE=1 runs every step
# anyway (the results then mean nothing); GPU_CHECK_BUILD=0 uses the existing
# build instead of rebuilding in place (beside someone else's build there).
# GPU_CHECK_ONLY="tests probes" runs only the named steps after the build
# (a rerun spends less of the lease).
set -uo pipefail
LC_NUMERIC=C  # EPOCHREALTIME with a decimal point, whatever the locale
cd "$(dirname "$0")/.." || exit 1

OUT="${OUT:-out/gpu_check}"
PYTHON="${PYTHON:-python3}"
DEBS="${DEBS:-.debs}"
PREFIX="${DEB_PREFIX:-/tmp/roce-debs}"
export MAX_JOBS="${MAX_JOBS:-$(nproc)}"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # the in-place build of roce_pg
HELPER=scripts/gpu_check_report.py
mkdir -p "$OUT"
WORK=$(mktemp -d /tmp/gpu_check.XXXXXX)
LOG="$OUT/log.txt"
: >"$LOG"
START=$SECONDS
PLANNED=0     # sum of the caps of the steps so far
BUILD_OK=1

# step NAME CAP CMD...: runs CMD with its output in $WORK/NAME.out and the log.
# A step may also use what the steps before it left of their caps (a quick
# build leaves time to the benchmarks), never more: the run as a whole stays
# within the sum of the caps. pytest's exit 5 (nothing collected) is a skip.
step() {
  local name=$1 cap=$2 rc status t0
  shift 2
  if [[ -n ${GPU_CHECK_ONLY:-} && ! " debs env build $GPU_CHECK_ONLY " =~ " $name " ]]; then
    skip "$name" "not in GPU_CHECK_ONLY"
    return 0
  fi
  PLANNED=$((PLANNED + cap))
  local limit=$((PLANNED - (SECONDS - START)))
  if ((limit < 5)); then
    skip "$name" "no time left of its cap"
    return 1
  fi
  echo "=== $name (limit ${limit}s of cap ${cap}s): $*" >>"$LOG"
  t0=$EPOCHREALTIME
  timeout -k 5 "$limit" "$@" >"$WORK/$name.out" 2>&1
  rc=$?
  case $rc in
    0) status=ok ;;
    124 | 137) status="timed out after ${limit}s" ;;
    5) if [[ "$*" == *pytest* ]]; then status="skipped: no tests collected"; else status="failed rc=5"; fi ;;
    *) status="failed rc=$rc" ;;
  esac
  cat "$WORK/$name.out" >>"$LOG"
  echo "=== $name: $status" >>"$LOG"
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$t0" "$EPOCHREALTIME" "$cap" "$*" >>"$WORK/steps.tsv"
  return $rc
}

skip() {  # skip NAME WHY
  echo "=== $1: skipped: $2" >>"$LOG"
  printf '%s\tskipped: %s\t%s\t%s\t0\t\n' "$1" "$2" "$EPOCHREALTIME" "$EPOCHREALTIME" >>"$WORK/steps.tsv"
}

finish() {
  "$PYTHON" "$HELPER" report "$WORK" "$OUT" >>"$LOG" 2>&1 || echo "gpu_check: the report failed, see $LOG" >&2
  echo "gpu_check: $OUT/report.md ($((SECONDS - START)) s)"
  rm -rf "$WORK"
  exit 0
}

# Steps that are functions run through `bash -c NAME` (timeout needs a command).
# shellcheck disable=SC2317
unpack_debs() {
  rm -rf "$PREFIX" && mkdir -p "$PREFIX" || return
  local f n=0
  for f in "$DEBS"/*.deb; do
    dpkg -x "$f" "$PREFIX" || return
    n=$((n + 1))
  done
  echo "unpacked $n packages into $PREFIX"
}
# shellcheck disable=SC2317
build() {
  "$PYTHON" setup.py build_ext --inplace && "$PYTHON" -c 'import roce_pg; print(roce_pg.__file__)'
}
export -f unpack_debs build
export PYTHON DEBS PREFIX

# 1. libibverbs from the carried .deb files: unpacked, not installed (no root
# needed, nothing on the machine changed). With no NIC no provider is loaded,
# so the library only has to link and load.
if compgen -G "$DEBS/*.deb" >/dev/null; then
  if step debs 20 bash -c unpack_debs; then
    libdirs=$(find "$PREFIX" -name 'lib*.so*' ! -path '*/libibverbs/*' -printf '%h\n' | sort -u | paste -sd:)
    # Not CPATH: these are searched like system headers (-isystem), so the
    # headers' own warnings stay quiet as with an installed libibverbs-dev.
    export CPLUS_INCLUDE_PATH="$PREFIX/usr/include${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
    export LIBRARY_PATH="$libdirs${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    export PATH="$PREFIX/usr/bin:$PATH"  # ibv_devices, when ibverbs-utils was carried
  fi
else
  skip debs "no .deb files in $DEBS: the system's libibverbs"
fi

# 2. The machine: GPUs and their topology, torch, CUDA, cores, RDMA devices.
step env 30 "$PYTHON" "$HELPER" env "$WORK"
cuda=$("$PYTHON" -c 'import json, sys; print(int(json.load(open(sys.argv[1]))["cuda_available"]))' \
  "$WORK/env.json" 2>/dev/null || echo 0)

# 3. Build in place (a few CPU-minutes, so well inside the cap with 16 jobs),
# then import it: a library that does not load shows here, not in every test.
if [[ ${GPU_CHECK_BUILD:-1} == 0 ]]; then
  skip build "GPU_CHECK_BUILD=0: the existing build"
  PLANNED=$((PLANNED + 150))
else
  step build 150 bash -c build || BUILD_OK=0
fi

LATER=(tests probes waits staging workers-2r workers-4r workers-8r)
if [[ $cuda != 1 && ${GPU_CHECK_FORCE:-0} != 1 ]]; then
  why="no CUDA device (torch.cuda.is_available() is False)"
  [[ -s $WORK/env.json ]] || why="the environment step failed, so no CUDA device was found"
  echo "$why" >"$WORK/stopped"
  for s in "${LATER[@]}"; do skip "$s" "${why%% (*}"; done
  finish
fi
if ((!BUILD_OK)); then
  for s in "${LATER[@]}"; do skip "$s" "the build failed"; done
  finish
fi

# 4. The CUDA cases of the test files (the [cuda] parameters), without the
# probes, which get a step of their own. pytest-timeout is not assumed: the
# step's cap bounds it.
PROBES="device_use or ordering or overlap or capture or guard or multi_gpu or stale"
step tests 130 "$PYTHON" -m pytest tests -k "cuda and not ($PROBES)" -q -rs -p no:cacheprovider

# 5. The probes: stream ordering, overlap, graph capture, device guard / second
# GPU, stale registrations (test_device_use holds several of them). Those
# needing 2 GPUs or an RDMA device skip themselves; env.json's
# probe_conditions says which could run.
step probes 40 "$PYTHON" -m pytest tests -k "cuda and ($PROBES)" -q -rs -p no:cacheprovider

# 5b. Which CUDA calls wait for the whole device (page-locked allocation,
# lazy kernel loading): the facts behind the probes above.
step waits 40 "$PYTHON" benchmarks/cuda_waits.py --json "$WORK/cuda_waits.json"

# 6. roce host-reduce / device-reduce vs Gloo's CUDA path vs the pinned copy
# rate, 1-256 MiB, 2 ranks (on two GPUs where there are two).
step staging 70 "$PYTHON" benchmarks/cuda_staging.py --sizes-mib 1 4 16 64 256 --json "$WORK/staging.json"

# 7. The many-core host table: 1-8 worker threads per rank at 2, 4 and 8
# ranks beside the concurrent memcpy rate it prints. Gloo is left out and the
# rounds cut to fit the cap; the worker counts are what this table compares.
# The caps: 20 + 30 + 150 + 130 + 40 + 40 + 70 + 3 x 20 = 540 s.
for r in 2 4 8; do
  step "workers-${r}r" 20 "$PYTHON" benchmarks/workers.py --ranks "$r" --workers 1 2 4 8 --sizes 4 64 256 \
    --rounds 2 --total-mib 512 --no-gloo --timeout 300 --json "$WORK/workers-${r}r.json"
done

finish
