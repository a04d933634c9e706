#!/usr/bin/env bash
# Builds roce_pg._C with AddressSanitizer + UndefinedBehaviorSanitizer into
# .asan/ (the in-place build used by everything else is left alone) and runs
# the given pytest arguments against it:
#   bash scripts/sanitize.sh tests/test_faults.py -k kill
# Python and torch are not instrumented, so the GCC runtimes are preloaded into
# every process (ranks inherit LD_PRELOAD); each report lands in
# .asan/logs/<tool>.<pid> and any report fails the run (exit 66), as does UBSan,
# which aborts on its first finding (-fno-sanitize-recover=all).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.asan
PY=.venv/bin/python
mkdir -p "$OUT/logs"
rm -f "$OUT"/logs/*

# Never build under the preload (the compiler would run instrumented).
ROCE_PG_SANITIZE=address,undefined MAX_JOBS="${MAX_JOBS:-$(nproc)}" \
  "$PY" setup.py -q build_ext --build-temp "$OUT/tmp" --build-lib "$OUT/lib" >"$OUT/build.log" 2>&1 ||
  { tail -40 "$OUT/build.log"; echo "sanitize.sh: the sanitizer build failed (log: $OUT/build.log)" >&2; exit 1; }
# The package = this checkout's Python files + the instrumented extension,
# run from a directory where it is the roce_pg found first (pytest and
# `python -m` put the working directory ahead of PYTHONPATH).
cp roce_pg/*.py "$OUT/lib/roce_pg/"
RUN="$OUT/run"
mkdir -p "$RUN"
ln -sfn "$PWD/tests" "$RUN/tests"
ln -sfn "$PWD/$OUT/lib/roce_pg" "$RUN/roce_pg"
ROOT="$PWD"

ASAN_RT="$(gcc -print-file-name=libasan.so)"
UBSAN_RT="$(gcc -print-file-name=libubsan.so)"
export LD_PRELOAD="$ASAN_RT $UBSAN_RT"
# detect_leaks=0: CPython and torch keep allocations until exit.
# detect_container_overflow=0: libtorch's containers are not instrumented.
export ASAN_OPTIONS="detect_leaks=0:detect_container_overflow=0:detect_odr_violation=0:abort_on_error=1:log_path=$PWD/$OUT/logs/asan:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:log_path=$PWD/$OUT/logs/ubsan"
export ROCE_PG_EXPECT_SANITIZED=1  # tests check that the instrumented build is the one imported
# The doctor's settings table, from this build (the copy above may be missing or older).
SO="$OUT/lib/roce_pg/_C$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"
"$PY" scripts/settings_table.py "$SO" "$OUT/lib/roce_pg" ||
  { head -60 "$OUT"/logs/* 2>/dev/null
    echo "sanitize.sh: loading the instrumented extension ($SO) to list its settings failed" >&2; exit 1; }
set +e
(cd "$RUN" && "$ROOT/$PY" -m pytest -p no:cacheprovider "$@") 2>&1 | tee "$OUT/pytest.log"
rc=${PIPESTATUS[0]}
set -e
unset LD_PRELOAD
# Reports go to the log files, but a runtime may also print to a rank's stderr
# (which pytest shows with the failing test): look in both places.
if compgen -G "$OUT/logs/*" >/dev/null || grep -qE "runtime error:|ERROR: AddressSanitizer|ERROR: LeakSanitizer" "$OUT/pytest.log"; then
  echo "sanitize.sh: sanitizer reports:" >&2
  grep -E -A3 "runtime error:|ERROR: AddressSanitizer" "$OUT/pytest.log" | head -40 >&2 || true
  for f in "$OUT"/logs/*; do [[ -e "$f" ]] && { echo "==== $f" >&2; head -60 "$f" >&2; }; done
  exit 66
fi
echo "sanitize.sh: zero sanitizer reports (pytest exit $rc)"
exit "$rc"
