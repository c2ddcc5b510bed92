#!/usr/bin/env bash
# slurm_dry_run_test.sh WORKDIR: harness/scripts/slurm-sweep.sbatch checked without SLURM.
# --dry-run --shards 4 of a sweep prints the array submission (--array=0-3), the dependent merge
# job, for each array task i exactly `parity-sweep.sh OUTDIR --shard i/4 ARGS`, and the merge of the
# four shard files; it submits and runs nothing. An array task's environment (SLURM_ARRAY_TASK_ID,
# _MIN, _COUNT) with HYBRIDTB_SLURM_DRY_RUN=1 prints that task's shard, for a benchmark suite too.
# The #SBATCH header asks for one GPU per task. Outside an array task without --dry-run/--submit,
# and with --shards 0, it refuses (exit 2).
set -uo pipefail
work="$1"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
script="$root/harness/scripts/slurm-sweep.sbatch"
fail() { echo "slurm_dry_run_test: FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
out="$work/sweep"

bash "$script" --dry-run --shards 4 sweep "$out" -- --quick --backend cuda >"$work/dry.txt" 2>&1 || fail "exit $?"
cat "$work/dry.txt"
[ ! -e "$out" ] || fail "--dry-run created $out"
grep -qx "sbatch --parsable --array=0-3 $script sweep $out -- --quick --backend cuda" "$work/dry.txt" ||
  fail "no array submission of 0-3"
grep -q "^sbatch --dependency=afterany:<array job id> .*merge-shards.py --expect 4 " "$work/dry.txt" ||
  fail "no dependent merge job"
for i in 0 1 2 3; do
  grep -qx "bash $root/harness/scripts/parity-sweep.sh $out --shard $i/4 --quick --backend cuda" "$work/dry.txt" ||
    fail "no command of array task $i"
done
[ "$(grep -c -- '--shard [0-9]*/4' "$work/dry.txt")" -eq 4 ] || fail "not exactly 4 task commands"
files=""
for i in 0 1 2 3; do files+=" $out/parity-sweep.shard-$i-of-4.json"; done
grep -qx "python3 $root/harness/scripts/merge-shards.py --expect 4$files" "$work/dry.txt" || fail "no merge command of the 4 shard files"

task=$(HYBRIDTB_SLURM_DRY_RUN=1 SLURM_ARRAY_TASK_ID=6 SLURM_ARRAY_TASK_MIN=4 SLURM_ARRAY_TASK_COUNT=3 \
       bash "$script" bench "$work/bench" -- --suite s.json --backend cuda) || fail "array task dry run exit $?"
[ "$task" = "$root/build/experiments/hybridtb_bench --shard 2/3 --out $work/bench/bench.shard-2-of-3.json --suite s.json --backend cuda" ] ||
  fail "array task 6 of 4-6 prints: $task"
[ ! -e "$work/bench" ] || fail "the array task's dry run created its OUTDIR"

grep -q '^#SBATCH --array=0-' "$script" && grep -q '^#SBATCH --gres=gpu:1' "$script" || fail "#SBATCH header lacks --array or one GPU"
bash "$script" sweep "$out" >/dev/null 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "outside an array task: exit $rc, expected 2"
bash "$script" --dry-run --shards 0 sweep "$out" >/dev/null 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "--shards 0: exit $rc, expected 2"
echo "slurm_dry_run_test: ok"
