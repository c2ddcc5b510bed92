#!/usr/bin/env bash
# The whole GPU check in one go, on the GPU machine (H100/H200, no network):
#   bash harness/scripts/gpu-check.sh OUTDIR [STAGE...]
# STAGEs (default: all, in this order): ctest sanitizer examples golden sweep sweep-shards tp bench
# peer linear-peer suite graph compare-check (sweep-shards and tp skip, saying so, on a machine with one GPU). The build
# always runs first (incremental when build-gpu/ exists), so a long check can be split over two
# calls of the device tool, e.g. `... OUT ctest sanitizer examples sweep` then `... OUT bench peer suite`.
# configure + build (build-gpu/, all cores) → ctest (every test, GPU ones included) →
# compute-sanitizer memcheck + racecheck on the Small* cases of every GPU test binary →
# `hybridtb parity --backend cuda` against the reference on every datasets/examples/*.h5 →
# `hybridtb replay --backend cuda` of the golden batches of datasets/vllm/ (vLLM's own kernels; the
# files with a known difference between vLLM and our reference left out) →
# the generated parity sweep (harness/scripts/parity-sweep.sh) → the same sweep sharded over every
# GPU (run-shards.sh: verdicts equal, speed-up) → the tensor-parallel hybrid layer one rank per GPU
# (hybridtb tp --placement devices: parity at tp 2/4/8, step times) → the attention benchmark (JSON)
# → the SSM benchmark (when built) → the PyTorch peer on the same shapes and the ratio to it →
# vLLM's and FLA's GDN / Mamba-2 prefill kernels beside ours (linear-peer) → the standard suite → the CUDA-graph suite (eager vs replayed decode steps) → the compare check.
# Writes build.log, ctest.log, sanitizer.log, examples.log, parity.json, sweep/, bench.log,
# bench.json, bench-ssm.*, peer.log, peer.json, peer-ratio.json and summary.txt into OUTDIR and
# prints the summary table last. HYBRIDTB_VLLM_SRC, when set, names an unpacked vLLM release (the
# folder holding vllm/): its Triton kernels then run as a second peer in the peer stage
# (peer-vllm.json, their ratios in peer-ratio.json), the linear-peer stage (its GDN / Mamba-2 prefill
# kernels beside ours: peer-linear.json, peer-linear.log) and the suite stage (suite_peer.py --vllm).
# HYBRIDTB_FLA_SRC, when set, names an unpacked fla-core wheel (the folder holding fla/): the
# linear-peer stage then times FLA's GDN prefill kernels beside vLLM's (vllm_linear_peer.py --fla).
# HYBRIDTB_GIT_COMMIT in the environment names the commit where the
# tree has no .git (the device machine gets a copy without it).
# HYBRIDTB_TP_TIMEOUT (seconds, default 180) bounds each `hybridtb tp` run of the tp stage.
# Exit status: 0 if every stage passed, 1 otherwise (later stages still run).
# The bench stage also runs the GDN / Mamba-2 benchmark when built: bench-linear.json, bench-linear.log.
set -uo pipefail

ALL_STAGES="ctest sanitizer examples golden sweep sweep-shards tp bench peer linear-peer suite graph compare-check"
if [[ $# -lt 1 ]]; then
  echo "usage: bash harness/scripts/gpu-check.sh OUTDIR [STAGE...]   (stages: $ALL_STAGES)" >&2
  exit 2
fi
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
shift
STAGES="${*:-$ALL_STAGES}"
for stage in $STAGES; do
  [[ " $ALL_STAGES " == *" $stage "* ]] || { echo "gpu-check: unknown stage '$stage' (stages: $ALL_STAGES)" >&2; exit 2; }
done
want() { [[ " $STAGES " == *" $1 "* ]]; }
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
BUILD=build-gpu
JOBS=$(nproc)
export PATH="$PATH:/usr/local/cuda/bin"
SUMMARY="$OUT/summary.txt"
echo "== gpu-check $(date -u +%FT%TZ): build $STAGES" >>"$SUMMARY"  # appended: a split check keeps both halves
FAILED=0
START=$(date +%s)

# configure_and_build DIR [cmake -D options...] [-- build targets...]: the CUDA Release build.
configure_and_build() {
  local dir="$1"; shift
  local options=() targets=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do options+=("$1"); shift; done
  [[ $# -gt 0 ]] && { shift; targets=("$@"); }
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 -DHYBRIDTB_CUDA=ON \
    ${HYBRIDTB_GIT_COMMIT:+-DHYBRIDTB_GIT_COMMIT=$HYBRIDTB_GIT_COMMIT} "${options[@]}" &&
    cmake --build "$dir" -j"$JOBS" ${targets[@]:+--target "${targets[@]}"}
}

record() {  # record STAGE STATUS DETAIL
  printf '%-12s %-5s %s\n' "$1" "$2" "$3" >>"$SUMMARY"
  [[ "$2" == "ok" || "$2" == "skip" ]] || FAILED=1
}

# --- build --------------------------------------------------------------------------------------
t0=$(date +%s)
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  configure_and_build "$BUILD"
} >"$OUT/build.log" 2>&1
if [[ $? -ne 0 ]]; then
  record build FAIL "see build.log ($(( $(date +%s) - t0 )) s)"
  tail -30 "$OUT/build.log"
  cat "$SUMMARY"
  exit 1
fi
record build ok "$(( $(date +%s) - t0 )) s, $(grep -ci 'warning' "$OUT/build.log") lines mentioning warnings"

# --- tests --------------------------------------------------------------------------------------
if want ctest; then
  t0=$(date +%s)
  ctest --test-dir "$BUILD" --output-on-failure -j"$JOBS" --timeout 600 >"$OUT/ctest.log" 2>&1
  rc=$?
  line=$(grep -E 'tests passed|tests failed' "$OUT/ctest.log" | tail -1)
  gpu_skipped=$(grep -c 'Skipped' "$OUT/ctest.log")
  record ctest "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "$line; $gpu_skipped skipped ($(( $(date +%s) - t0 )) s)"
fi

# --- compute-sanitizer ---------------------------------------------------------------------------
if want sanitizer; then
  t0=$(date +%s)
  : >"$OUT/sanitizer.log"
  san_rc=0
  san_binaries=0
  for binary in "$BUILD"/tests/cuda/cuda_*_test; do
    [[ -x "$binary" ]] || continue
    "$binary" --gtest_list_tests 2>/dev/null | grep -q 'Small' || continue
    san_binaries=$((san_binaries + 1))
    for tool in memcheck racecheck; do
      echo "=== compute-sanitizer --tool $tool $(basename "$binary") (Small* cases) ===" >>"$OUT/sanitizer.log"
      compute-sanitizer --tool "$tool" --error-exitcode 3 "$binary" --gtest_filter='*Small*' \
        >>"$OUT/sanitizer.log" 2>&1 || san_rc=1
    done
  done
  # One line for all runs: memcheck's errors and racecheck's hazards summed over the binaries.
  san_errors=$(grep -oE 'ERROR SUMMARY: [0-9]+ error' "$OUT/sanitizer.log" | awk '{n += $3} END {print n + 0}')
  san_hazards=$(grep -oE 'RACECHECK SUMMARY: [0-9]+ hazard' "$OUT/sanitizer.log" | awk '{n += $3} END {print n + 0}')
  san_what="memcheck $san_errors errors, racecheck $san_hazards hazards"
  record sanitizer "$([[ $san_rc -eq 0 ]] && echo ok || echo FAIL)" \
    "$san_what on the Small* cases of $san_binaries GPU test binaries ($(( $(date +%s) - t0 )) s)"
fi

# --- example batches: `hybridtb parity` (cuda against reference, the one tolerance table) -------
if want examples; then
  t0=$(date +%s)
  "$BUILD/harness/cli/hybridtb" parity --backend cuda --against reference --report "$OUT/parity.json" \
    datasets/examples/*.h5 >"$OUT/examples.log" 2>&1
  rc=$?
  record examples "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" \
    "$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/examples.log" | tail -1); $(grep -E 'not supported' "$OUT/examples.log" | tail -1) ($(( $(date +%s) - t0 )) s)"
fi

# --- golden batches from vLLM's own Triton kernels: `hybridtb replay --backend cuda` ---------------
if want golden; then
  t0=$(date +%s)
  # The files whose manifest entry lists no known difference between vLLM and our reference.
  mapfile -t golden < <(python3 -c 'import json; [print("datasets/vllm/" + e["file"]) for e in
    json.load(open("datasets/vllm/manifest.json"))["datasets"] if "known_difference" not in e]')
  "$BUILD/harness/cli/hybridtb" replay --backend cuda --report "$OUT/golden.json" "${golden[@]}" \
    >"$OUT/golden.log" 2>&1
  rc=$?
  record golden "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" \
    "$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/golden.log" | tail -1) ($(( $(date +%s) - t0 )) s)"
fi

# --- generated parity sweep (every preset x the standard mixes x dtypes x KV dtypes) -----------
if want sweep; then
  t0=$(date +%s)
  bash harness/scripts/parity-sweep.sh "$OUT/sweep" --backend cuda --hybridtb "$ROOT/$BUILD/harness/cli/hybridtb" \
    >"$OUT/sweep.log" 2>&1
  rc=$?
  SWEEP_SECONDS=$(( $(date +%s) - t0 ))
  record sweep "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "$(tail -1 "$OUT/sweep.log") ($SWEEP_SECONDS s)"
fi

# --- the same sweep sharded over every GPU of the machine (run-shards.sh, one GPU per shard) ------
# Verdicts must equal the one-GPU sweep's of this run case by case; the speed-up is its wall time
# over this stage's.
GPU_COUNT=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if want sweep-shards && (( GPU_COUNT < 2 )); then
  record sweep-shards skip "one GPU: the sharded sweep needs two or more"
elif want sweep-shards; then
  t0=$(date +%s)
  bash harness/scripts/run-shards.sh sweep "$OUT/sweep-shards" -- --backend cuda \
    --hybridtb "$ROOT/$BUILD/harness/cli/hybridtb" >"$OUT/sweep-shards.log" 2>&1
  rc=$?
  seconds=$(( $(date +%s) - t0 ))
  same=$(python3 - "$OUT/sweep/parity-sweep.json" "$OUT/sweep-shards/parity-sweep.json" "${SWEEP_SECONDS:-}" \
    "$seconds" <<'PY'
import json, os, sys
one, sharded, one_s, sharded_s = sys.argv[1:5]
if not os.path.exists(sharded):
    print("no merged sweep"); sys.exit(1)
cases = {c["id"]: c["verdict"] for c in json.load(open(sharded))["cases"]}
if not os.path.exists(one):
    print(f"{len(cases)} cases (no one-GPU sweep in this run to compare)"); sys.exit(0)
ref = {c["id"]: c["verdict"] for c in json.load(open(one))["cases"]}
differ = sorted(k for k in ref.keys() | cases.keys() if ref.get(k) != cases.get(k))
speed = f", {float(one_s) / float(sharded_s):.2f}x the one-GPU sweep's speed" if one_s else ""
print(f"{len(cases)} cases, {len(differ)} verdicts differ from the one-GPU sweep{speed}" +
      (f" (first: {differ[0]})" if differ else ""))
sys.exit(1 if differ else 0)
PY
  )
  same_rc=$?
  record sweep-shards "$([[ $rc -eq 0 && $same_rc -eq 0 ]] && echo ok || echo FAIL)" \
    "$GPU_COUNT GPUs: $same ($seconds s)"
fi

# --- tensor-parallel hybrid layer, one rank per GPU over NCCL (hybridtb tp --placement devices) ---
# mamba-2.8b (40 query heads, one kv head replicated on every rank, mamba1 branch of 5120 channels):
# decode, prefill and mixed steps against the unsharded reference at every tp the GPUs allow; then
# prefill 8k and decode 64x4k timed sharded beside tp 1 (against cuda: the float64 reference of an
# 8k prefill with this branch takes minutes; those verdicts are informational). tp/*.json: reports.
if want tp && (( GPU_COUNT < 2 )); then
  record tp skip "one GPU: a rank per GPU needs two or more"
elif want tp; then
  t0=$(date +%s)
  gpus=$GPU_COUNT
  mkdir -p "$OUT/tp"
  : >"$OUT/tp.log"
  tp_rc=0 runs=0
  hyb="$BUILD/harness/cli/hybridtb"
  # Each run under a time limit: a rank that fails must make the others leave their all-reduces, and
  # if one ever does not, the stage reports the hang instead of holding the machine.
  tp_limit=${HYBRIDTB_TP_TIMEOUT:-180}
  tp_run() {  # tp_run REPORT_STEM ARGS...: one `hybridtb tp` run; returns its status, 124 on timeout
    timeout "$tp_limit" "$hyb" tp "${@:2}" >>"$OUT/tp.log" 2>&1
    local rc=$?
    (( rc == 124 )) && echo "tp: $1 timed out after $tp_limit s" >>"$OUT/tp.log"
    return $rc
  }
  for mix in d8@512 p1x1k d8@512+c1x256@256+p1x512 p1x8k d64@4k; do
    name=$(echo "$mix" | tr '@+' '__')
    "$hyb" gen --preset mamba-2.8b --mix "$mix" --quiet --out "$OUT/tp/$name.h5" >>"$OUT/tp.log" 2>&1 || tp_rc=1
    for tp in 2 4 8; do
      (( tp <= gpus )) || continue
      if [[ "$mix" == p1x8k || "$mix" == d64@4k ]]; then
        tp_run "${name}_tp$tp" "$OUT/tp/$name.h5" --tp "$tp" --placement devices --backend cuda --against cuda \
          --time 20 --quiet --no-rationale --report "$OUT/tp/${name}_tp$tp.json"
        (( $? == 124 )) && tp_rc=1
      else
        tp_run "${name}_tp$tp" "$OUT/tp/$name.h5" --tp "$tp" --placement devices --backend cuda --quiet \
          --no-rationale --report "$OUT/tp/${name}_tp$tp.json" || tp_rc=1
        runs=$(( runs + 1 ))
      fi
    done
    rm -f "$OUT/tp/$name.h5"
  done
  record tp "$([[ $tp_rc -eq 0 ]] && echo ok || echo FAIL)" \
    "$runs parity runs against the reference on $gpus GPUs; $(grep -c 'step time over' "$OUT/tp.log") timed; $(grep -c 'timed out after' "$OUT/tp.log") timed out ($(( $(date +%s) - t0 )) s)"
fi

# --- kernel benchmarks ---------------------------------------------------------------------------
if want bench; then
  t0=$(date +%s)
  "$BUILD/optimized/hybridtb_bench_attention" --out "$OUT/bench.json" >"$OUT/bench.log" 2>&1
  rc=$?
  record bench "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "bench.json ($(( $(date +%s) - t0 )) s)"
  if [[ -x "$BUILD/optimized/hybridtb_bench_ssm" ]]; then
    t0=$(date +%s)
    "$BUILD/optimized/hybridtb_bench_ssm" --out "$OUT/bench-ssm.json" >"$OUT/bench-ssm.log" 2>&1
    rc=$?
    record bench-ssm "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "bench-ssm.json ($(( $(date +%s) - t0 )) s)"
  fi
  if [[ -x "$BUILD/optimized/hybridtb_bench_linear" ]]; then
    t0=$(date +%s)
    "$BUILD/optimized/hybridtb_bench_linear" --out "$OUT/bench-linear.json" >"$OUT/bench-linear.log" 2>&1
    rc=$?
    record bench-linear "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "bench-linear.json ($(( $(date +%s) - t0 )) s)"
  fi
fi

# --- PyTorch peer on the same shapes (torch is on the GPU machine) -------------------------------
if want peer; then
  if ! python3 -c 'import torch' 2>/dev/null; then
    record peer skip "python3 cannot import torch"
  elif [[ ! -f "$OUT/bench.json" ]]; then
    record peer FAIL "needs bench.json from the bench stage in the same OUTDIR"
  else
    t0=$(date +%s)
    peer_files=("$OUT/peer.json")
    if [[ -n "${HYBRIDTB_VLLM_SRC:-}" ]]; then
      python3 experiments/peers/vllm_attention_peer.py --vllm "$HYBRIDTB_VLLM_SRC" --out "$OUT/peer-vllm.json" \
        >"$OUT/peer-vllm.log" 2>&1
      rc=$?
      record peer-vllm "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "peer-vllm.json ($(( $(date +%s) - t0 )) s)"
      [[ $rc -eq 0 ]] && peer_files+=("$OUT/peer-vllm.json")
      t0=$(date +%s)
    fi
    python3 experiments/peers/torch_attention_peer.py --out "$OUT/peer.json" >"$OUT/peer.log" 2>&1 &&
      python3 experiments/peers/peer_ratio.py "$OUT/bench.json" "${peer_files[@]}" --out "$OUT/peer-ratio.json" \
        >"$OUT/peer-ratio.log" 2>&1
    rc=$?
    record peer "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "peer.json, peer-ratio.json ($(( $(date +%s) - t0 )) s)"
    if [[ -f "$OUT/bench-ssm.json" ]]; then
      t0=$(date +%s)
      python3 experiments/peers/torch_mamba1_peer.py --out "$OUT/peer-ssm.json" >"$OUT/peer-ssm.log" 2>&1 &&
        python3 experiments/peers/peer_ratio_ssm.py "$OUT/bench-ssm.json" "$OUT/peer-ssm.json" \
          --out "$OUT/peer-ssm-ratio.json" >"$OUT/peer-ssm-ratio.log" 2>&1
      rc=$?
      record peer-ssm "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "peer-ssm.json, peer-ssm-ratio.json ($(( $(date +%s) - t0 )) s)"
    fi
  fi
fi

# --- vLLM's and FLA's linear-attention prefill kernels (minutes: Triton autotunes each case) -------
# Their Triton GDN / Mamba-2 prefill kernels on the linear benchmark's cases, each output checked
# against our cuda backend on the same inputs (vllm_linear_peer.py), with each peer's per-kernel GPU
# times (--kernels 3); needs HYBRIDTB_VLLM_SRC and the bench stage's bench-linear.json in the same
# OUTDIR; FLA's GDN kernels too where HYBRIDTB_FLA_SRC names an unpacked fla-core wheel.
# HYBRIDTB_LINEAR_PEER_CASES (a regex) picks cases.
if want linear-peer; then
  if [[ -z "${HYBRIDTB_VLLM_SRC:-}" ]]; then
    record linear-peer skip "HYBRIDTB_VLLM_SRC names no unpacked vLLM release"
  elif [[ ! -f "$OUT/bench-linear.json" ]]; then
    record linear-peer FAIL "needs bench-linear.json from the bench stage in the same OUTDIR"
  else
    t0=$(date +%s)
    python3 experiments/peers/vllm_linear_peer.py --vllm "$HYBRIDTB_VLLM_SRC" --ours "$OUT/bench-linear.json" \
      --hybridtb "$BUILD/harness/cli/hybridtb" ${HYBRIDTB_LINEAR_PEER_CASES:+--cases "$HYBRIDTB_LINEAR_PEER_CASES"} \
      ${HYBRIDTB_FLA_SRC:+--fla "$HYBRIDTB_FLA_SRC"} --kernels 3 --json "$OUT/peer-linear.json" \
      >"$OUT/peer-linear.log" 2>&1
    rc=$?
    record linear-peer "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "peer-linear.json ($(( $(date +%s) - t0 )) s)"
  fi
fi

# --- the standard benchmark suite (experiments/) ---------------------------------------------------
if want suite; then
  t0=$(date +%s)
  "$BUILD/experiments/hybridtb_bench" --suite experiments/suites/standard.json --backend cuda \
    --out "$OUT/suite.json" >"$OUT/suite.log" 2>&1
  rc=$?
  record suite "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "suite.json: $(grep -c '"name"' "$OUT/suite.json" 2>/dev/null) entries ($(( $(date +%s) - t0 )) s)"
  if python3 -c 'import torch' 2>/dev/null; then
    t0=$(date +%s)
    python3 experiments/peers/suite_peer.py "$OUT/suite.json" --out "$OUT/suite-peer.json" \
      --hybridtb "$BUILD/harness/cli/hybridtb" ${HYBRIDTB_VLLM_SRC:+--vllm "$HYBRIDTB_VLLM_SRC"} \
      >"$OUT/suite-peer.log" 2>&1
    rc=$?
    record suite-peer "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "suite-peer.json ($(( $(date +%s) - t0 )) s)"
  else
    record suite-peer skip "python3 cannot import torch"
  fi
fi

# --- decode steps eager vs replayed from a CUDA graph (experiments/suites/graph.json) -------------
if want graph; then
  t0=$(date +%s)
  "$BUILD/experiments/hybridtb_bench" --suite experiments/suites/graph.json --out "$OUT/graph.json" \
    >"$OUT/graph.log" 2>&1
  rc=$?
  record graph "$([[ $rc -eq 0 ]] && echo ok || echo FAIL)" "graph.json ($(( $(date +%s) - t0 )) s)"
fi

# --- the compare flags a deliberately slowed build and not a rerun ---------------------------------
# The quick suite's cuda cases twice on this build, then once on a build whose attention launches
# each spin 200 us more (-DHYBRIDTB_DEBUG_SLOWDOWN_US=200): rerun → "same", slowed → "slower".
if want compare-check; then
  t0=$(date +%s)
  quick=(--suite experiments/suites/quick.json --backend cuda)
  {
    "$BUILD/experiments/hybridtb_bench" "${quick[@]}" --out "$OUT/quick-a.json" &&
      "$BUILD/experiments/hybridtb_bench" "${quick[@]}" --out "$OUT/quick-b.json" &&
      configure_and_build "$BUILD-slow" -DHYBRIDTB_DEBUG_SLOWDOWN_US=200 -- hybridtb_bench &&
      "$BUILD-slow/experiments/hybridtb_bench" "${quick[@]}" --out "$OUT/quick-slow.json"
  } >"$OUT/compare-check.log" 2>&1
  rc=$?
  "$BUILD/experiments/hybridtb_bench_compare" "$OUT/quick-a.json" "$OUT/quick-b.json" >"$OUT/compare-rerun.txt" 2>&1
  rerun_rc=$?
  "$BUILD/experiments/hybridtb_bench_compare" "$OUT/quick-a.json" "$OUT/quick-slow.json" >"$OUT/compare-slowed.txt" 2>&1
  slowed_rc=$?
  # compare exits 0 when nothing is slower, 1 when some case is slower.
  ok=$([[ $rc -eq 0 && $rerun_rc -eq 0 && $slowed_rc -eq 1 ]] && echo ok || echo FAIL)
  record compare "$ok" "rerun exit $rerun_rc (want 0), slowed build exit $slowed_rc (want 1) ($(( $(date +%s) - t0 )) s)"
fi

# --- summary -------------------------------------------------------------------------------------
{
  echo
  if [[ -f "$OUT/ctest.log" ]]; then
    echo "--- failing tests (ctest) ---"
    grep -E '\*\*\*Failed|Failed  |\(Failed\)' "$OUT/ctest.log" | head -20
  fi
  [[ -f "$OUT/bench.log" ]] && { echo "--- benchmark ---"; cat "$OUT/bench.log"; }
  [[ -f "$OUT/bench-ssm.log" ]] && { echo "--- SSM benchmark ---"; cat "$OUT/bench-ssm.log"; }
  [[ -f "$OUT/bench-linear.log" ]] && { echo "--- linear-attention benchmark (GDN, Mamba-2) ---"; cat "$OUT/bench-linear.log"; }
  [[ -f "$OUT/peer-ratio.log" ]] && { echo "--- PyTorch and vLLM peers (ratio > 1: hybridtb faster) ---"; cat "$OUT/peer-ratio.log"; }
  [[ -f "$OUT/peer-ssm-ratio.log" ]] && { echo "--- PyTorch peer, mamba1 ---"; cat "$OUT/peer-ssm-ratio.log"; }
  [[ -f "$OUT/peer-linear.log" ]] && { echo "--- vLLM / FLA linear-attention prefill peers (ratio > 1: hybridtb faster) ---"
    grep -E '^(gdn|mamba2) |^FLA: skipped' "$OUT/peer-linear.log"; }
  [[ -f "$OUT/graph.log" ]] && { echo "--- CUDA graph vs eager ---"; sed -n '/^status/,$p' "$OUT/graph.log"; }
  echo "total: $(( $(date +%s) - START )) s"
} >>"$SUMMARY"
echo
cat "$SUMMARY"
exit $FAILED
