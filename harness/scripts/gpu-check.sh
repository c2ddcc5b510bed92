#!/usr/bin/env bash
# The whole GPU check in one go, on the GPU machine (H100/H200, no network):
#   bash harness/scripts/gpu-check.sh OUTDIR
# configure + build (build-gpu/, all cores) → ctest (every test, GPU ones included) →
# compute-sanitizer memcheck + racecheck on the Small* GPU cases (one of each kind) →
# `hybridtb parity --backend cuda` against the reference on every datasets/examples/*.h5 →
# the attention benchmark (JSON). Writes build.log, ctest.log, sanitizer.log, examples.log,
# parity.json, bench.log, bench.json and summary.txt into OUTDIR and prints the summary table last.
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

# --- example batches: `hybridtb parity` (cuda against reference, the one tolerance table) -------
t0=$(date +%s)
"$BUILD/harness/cli/hybridtb" parity --backend cuda --against reference --report "$OUT/parity.json" \
  datasets/examples/*.h5 >"$OUT/examples.log" 2>&1
rc=$?
record examples "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" \
  "$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/examples.log" | tail -1); $(grep -E 'not supported' "$OUT/examples.log" | tail -1) ($(( $(date +%s) - t0 )) s)"

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
