#!/usr/bin/env bash
# The whole GPU check in one go, on the GPU machine (H100/H200, no network):
#   bash harness/scripts/gpu-check.sh OUTDIR
# configure + build (build-gpu/, all cores) → ctest (every test, GPU ones included) →
# compute-sanitizer memcheck + racecheck on the Small* GPU cases (one of each kind) →
# `hybridtb run --backend cuda` vs `--backend reference` on every datasets/examples/*.h5 →
# the attention benchmark (JSON). Writes build.log, ctest.log, sanitizer.log, examples.log,
# bench.log, bench.json and summary.txt into OUTDIR and prints the summary table last.
# Exit status: 0 if every stage passed, 1 otherwise (later stages still run).
set -uo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: bash harness/scripts/gpu-check.sh OUTDIR" >&2
  exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
BUILD=build-gpu
JOBS=$(nproc)
export PATH="$PATH:/usr/local/cuda/bin"
SUMMARY="$OUT/summary.txt"
: >"$SUMMARY"
FAILED=0
START=$(date +%s)

record() {  # record STAGE STATUS DETAIL
  printf '%-12s %-5s %s\n' "$1" "$2" "$3" >>"$SUMMARY"
  [[ "$2" == "ok" ]] || FAILED=1
}

# --- build --------------------------------------------------------------------------------------
t0=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DHYBRIDTB_CUDA=ON &&
    cmake --build "$BUILD" -j"$JOBS"
} >"$OUT/build.log" 2>&1
if [[ $? -ne 0 ]]; then
  record build FAIL "see build.log ($(( $(date +%s) - t0 )) s)"
  tail -30 "$OUT/build.log"
  cat "$SUMMARY"
  exit 1
fi
record build ok "$(( $(date +%s) - t0 )) s, $(grep -ci 'warning' "$OUT/build.log") lines mentioning warnings"

# --- tests --------------------------------------------------------------------------------------
t0=$(date +%s)
ctest --test-dir "$BUILD" --output-on-failure -j"$JOBS" --timeout 600 >"$OUT/ctest.log" 2>&1
rc=$?
line=$(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)
gpu_skipped=$(grep -c 'Skipped' "$OUT/ctest.log")
record ctest "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "$line; $gpu_skipped skipped ($(( $(date +%s) - t0 )) s)"

# --- compute-sanitizer ---------------------------------------------------------------------------
t0=$(date +%s)
: >"$OUT/sanitizer.log"
san_rc=0
for tool in memcheck racecheck; do
  echo "=== compute-sanitizer --tool $tool (Small* cases) ===" >>"$OUT/sanitizer.log"
  compute-sanitizer --tool "$tool" --error-exitcode 3 \
    "$BUILD/tests/cuda/cuda_backend_test" --gtest_filter='*Small*' >>"$OUT/sanitizer.log" 2>&1 || san_rc=1
done
record sanitizer "$([[ $san_rc -eq 0 ]] && echo ok || echo FAIL)" \
  "$(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitizer.log" | tr '\n' ';') ($(( $(date +%s) - t0 )) s)"

# --- example batches through the CLI -------------------------------------------------------------
t0=$(date +%s)
: >"$OUT/examples.log"
tmp=$(mktemp -d)
ex_ok=0
ex_fail=0
ex_ns=0
for f in datasets/examples/*.h5; do
  name=$(basename "$f" .h5)
  echo "=== $name ===" >>"$OUT/examples.log"
  if ! "$BUILD/harness/cli/hybridtb" run --quiet --backend reference --batch "$f" --out "$tmp/$name.ref.h5" \
      >>"$OUT/examples.log" 2>&1; then
    echo "reference run failed" >>"$OUT/examples.log"
    ex_fail=$((ex_fail + 1))
    continue
  fi
  if ! "$BUILD/harness/cli/hybridtb" run --quiet --backend cuda --batch "$f" --out "$tmp/$name.cuda.h5" \
      >>"$OUT/examples.log" 2>&1; then
    if grep -q "not supported\|NotSupported\|CUDA backend II" "$OUT/examples.log"; then
      echo "NOT SUPPORTED (see above)" >>"$OUT/examples.log"
      ex_ns=$((ex_ns + 1))
    else
      ex_fail=$((ex_fail + 1))
    fi
    continue
  fi
  if "$BUILD/optimized/hybridtb_compare" "$tmp/$name.ref.h5" "$tmp/$name.cuda.h5" >>"$OUT/examples.log" 2>&1; then
    ex_ok=$((ex_ok + 1))
  else
    ex_fail=$((ex_fail + 1))
  fi
done
rm -rf "$tmp"
record examples "$([[ $ex_fail -eq 0 ]] && echo ok || echo FAIL)" \
  "$ex_ok match, $ex_fail fail, $ex_ns not supported ($(( $(date +%s) - t0 )) s)"

# --- benchmark -----------------------------------------------------------------------------------
t0=$(date +%s)
"$BUILD/optimized/hybridtb_bench_attention" --out "$OUT/bench.json" >"$OUT/bench.log" 2>&1
rc=$?
record bench "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "bench.json ($(( $(date +%s) - t0 )) s)"

# --- summary -------------------------------------------------------------------------------------
{
  echo
  echo "--- failing tests (ctest) ---"
  grep -E '\*\*\*Failed|Failed  |\(Failed\)' "$OUT/ctest.log" | head -20
  echo "--- benchmark ---"
  cat "$OUT/bench.log"
  echo "total: $(( $(date +%s) - START )) s"
} >>"$SUMMARY"
echo
cat "$SUMMARY"
exit $FAILED
