#!/usr/bin/env bash
# shard_option_test.sh HYBRIDTB HYBRIDTB_BENCH SUITE WORKDIR: bad shard options are refused with
# exit 2, a message naming the option and its constraint, and nothing written:
# parity-sweep.sh --shard and hybridtb_bench --shard (I >= N, N < 1, not numbers, malformed,
# missing), shard-worker.sh --shard, and run-shards.sh --gpus / --shards / --launcher / a bench
# run without --suite.
set -uo pipefail
hybridtb="$1" bench="$2" suite="$3" work="$4"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
scripts="$root/harness/scripts"
rm -rf "$work" && mkdir -p "$work"
failures=0
# refused NAME NEEDLE... -- COMMAND...: COMMAND exits 2, its stderr holds every NEEDLE, $work/out is not created.
refused() {
  local name="$1" needles=()
  shift
  while [[ "$1" != -- ]]; do needles+=("$1"); shift; done
  shift
  rm -rf "$work/out" "$work/out.json"
  "$@" >"$work/stdout" 2>"$work/stderr"
  local rc=$? problems=""
  [[ $rc -eq 2 ]] || problems+=" exit $rc (expected 2);"
  for n in "${needles[@]}"; do grep -qF -- "$n" "$work/stderr" || problems+=" no '$n' in the message;"; done
  [[ ! -e "$work/out" && ! -e "$work/out.json" ]] || problems+=" wrote output;"
  if [[ -n "$problems" ]]; then
    echo "FAIL: $name:$problems"; sed 's/^/    /' "$work/stderr"; failures=$((failures + 1))
  else
    echo "ok: $name: $(head -1 "$work/stderr")"
  fi
}

for bad in 3/3 5/2 0/0 1/0 a/2 1/b 1 1/2/3 -1/2 "" " 1/2" 0x1/2 1234567/9999999; do
  case "$bad" in
    3/3|5/2) want="0 <= I < N" ;;
    0/0|1/0) want="N >= 1" ;;
    *) want="I/N" ;;
  esac
  refused "parity-sweep.sh --shard '$bad'" --shard "$want" -- \
    bash "$scripts/parity-sweep.sh" "$work/out" --quick --hybridtb "$hybridtb" --shard "$bad"
  refused "hybridtb_bench --shard '$bad'" --shard "$want" -- \
    "$bench" --suite "$suite" --no-ceilings --out "$work/out.json" --shard "$bad"
  refused "shard-worker.sh --shard '$bad'" --shard "$want" -- \
    bash "$scripts/shard-worker.sh" --shard "$bad" sweep "$work/out" -- --quick --hybridtb "$hybridtb"
done
refused "parity-sweep.sh --shard without a value" --shard -- bash "$scripts/parity-sweep.sh" "$work/out" --shard
refused "hybridtb_bench --shard without a value" --shard -- "$bench" --suite "$suite" --out "$work/out.json" --shard
refused "run-shards.sh --gpus x" "--gpus" ">= 0" -- bash "$scripts/run-shards.sh" sweep "$work/out" --gpus x --shards 2
refused "run-shards.sh --shards 0" "--shards" ">= 1" -- bash "$scripts/run-shards.sh" sweep "$work/out" --gpus 0 --shards 0
refused "run-shards.sh --shards 1/2" "--shards" -- bash "$scripts/run-shards.sh" sweep "$work/out" --gpus 0 --shards 1/2
refused "run-shards.sh without GPUs or --shards" "--shards N" -- bash "$scripts/run-shards.sh" sweep "$work/out" --gpus 0
refused "run-shards.sh --launcher srun" "--launcher" "mpirun or xargs" -- \
  bash "$scripts/run-shards.sh" sweep "$work/out" --gpus 0 --shards 2 --launcher srun
refused "run-shards.sh bench without --suite" "--suite" -- bash "$scripts/run-shards.sh" bench "$work/out" --gpus 0 --shards 2
refused "run-shards.sh with a kind other than sweep or bench" "sweep or bench" -- \
  bash "$scripts/run-shards.sh" suite "$work/out" --gpus 0 --shards 2
[[ $failures -eq 0 ]] || { echo "shard_option_test: $failures failure(s)"; exit 1; }
echo "shard_option_test: ok"
