#!/usr/bin/env bash
# One shard of a sharded parity sweep or benchmark suite run: the per-rank wrapper that
# run-shards.sh starts once per shard (through mpirun or xargs) and slurm-sweep.sbatch once per
# array task.
#
#   shard-worker.sh [--shard I/N] [--gpus G] [--bench PATH] [--exit-zero] [--dry-run] KIND OUTDIR [-- ARGS...]
#
# KIND sweep: runs  parity-sweep.sh OUTDIR --shard I/N ARGS...
#                   → OUTDIR/parity-sweep.shard-I-of-N.json
# KIND bench: runs  hybridtb_bench --shard I/N --out OUTDIR/bench.shard-I-of-N.json ARGS...
#                   (ARGS must name --suite FILE)
#
# The shard I/N comes from --shard, else from Open MPI (OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE),
# else from a SLURM job array (SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN / SLURM_ARRAY_TASK_COUNT:
# a contiguous --array range).
# --gpus G (G > 0): the shard sees one GPU: CUDA_VISIBLE_DEVICES is set to entry (local rank mod G)
#   of the GPUs visible to the worker (the list in CUDA_VISIBLE_DEVICES if set, else 0..G-1); the
#   local rank is OMPI_COMM_WORLD_LOCAL_RANK under mpirun, else I. --gpus 0 or no --gpus: the
#   environment's CUDA_VISIBLE_DEVICES is left as it is (SLURM sets it per task).
# --bench PATH: the hybridtb_bench executable (default build/experiments/hybridtb_bench).
# The command's output goes to OUTDIR/shard-I-of-N.log (first line: the shard, host and
# CUDA_VISIBLE_DEVICES, then the command), its exit status to OUTDIR/shard-I-of-N.rc; the shard's
# results file and those two are removed first, so a failed shard leaves no stale result behind.
# --exit-zero: exit 0 whatever the command's status (that is in the .rc file): mpirun aborts every
#   rank once one exits non-zero, and a failed parity case must not stop the other shards.
# --dry-run: print the command (with the CUDA_VISIBLE_DEVICES it would set) and run nothing.
# Exit status: the command's (0 with --exit-zero), 2 usage error.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
die() { echo "shard-worker: $*" >&2; exit 2; }
usage() { die "usage: shard-worker.sh [--shard I/N] [--gpus G] [--bench PATH] [--exit-zero] [--dry-run] sweep|bench OUTDIR [-- ARGS...]"; }

shard="" gpus="" bench="$root/build/experiments/hybridtb_bench" exit_zero=0 dry_run=0
while [[ $# -gt 0 && "$1" == -* ]]; do
  case "$1" in
    --shard) [[ $# -ge 2 ]] || usage; shard="$2"; shift 2 ;;
    --gpus) [[ $# -ge 2 ]] || usage; gpus="$2"; shift 2 ;;
    --bench) [[ $# -ge 2 ]] || usage; bench="$2"; shift 2 ;;
    --exit-zero) exit_zero=1; shift ;;
    --dry-run) dry_run=1; shift ;;
    *) usage ;;
  esac
done
[[ $# -ge 2 ]] || usage
kind="$1" outdir="$2"; shift 2
[[ "$kind" == sweep || "$kind" == bench ]] || die "KIND must be sweep or bench (got '$kind')"
if [[ $# -gt 0 ]]; then
  [[ "$1" == -- ]] || usage
  shift
fi

local_rank=""
if [[ -z "$shard" ]]; then
  if [[ -n "${OMPI_COMM_WORLD_RANK:-}" ]]; then
    shard="$OMPI_COMM_WORLD_RANK/${OMPI_COMM_WORLD_SIZE:-}"
    local_rank="${OMPI_COMM_WORLD_LOCAL_RANK:-}"
  elif [[ -n "${SLURM_ARRAY_TASK_ID:-}" ]]; then
    [[ "${SLURM_ARRAY_TASK_ID}${SLURM_ARRAY_TASK_MIN:-0}" =~ ^[0-9]+$ ]] ||
      die "SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_MIN must be whole numbers"
    [[ -n "${SLURM_ARRAY_TASK_COUNT:-}" ]] || die "SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT is not"
    shard="$((SLURM_ARRAY_TASK_ID - ${SLURM_ARRAY_TASK_MIN:-0}))/$SLURM_ARRAY_TASK_COUNT"
  else
    die "no shard: pass --shard I/N, or run under mpirun (OMPI_COMM_WORLD_RANK) or as a SLURM array task"
  fi
fi
[[ "$shard" =~ ^([0-9]{1,6})/([0-9]{1,6})$ ]] ||
  die "--shard must be I/N, two whole numbers of at most 6 digits with 0 <= I < N (got '$shard')"
index=$((10#${BASH_REMATCH[1]})) count=$((10#${BASH_REMATCH[2]}))
((count >= 1 && index < count)) || die "--shard I/N needs N >= 1 and 0 <= I < N (got '$shard')"
[[ -z "$gpus" || "$gpus" =~ ^[0-9]{1,4}$ ]] || die "--gpus must be a whole number >= 0 (got '$gpus')"

if [[ -n "$gpus" ]] && ((10#$gpus > 0)); then
  visible=()
  if [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
    IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
  else
    for ((g = 0; g < 10#$gpus; g++)); do visible+=("$g"); done
  fi
  ((${#visible[@]} > 0)) || die "no GPU visible to this worker"
  slot=$(( ${local_rank:-$index} % (10#$gpus < ${#visible[@]} ? 10#$gpus : ${#visible[@]}) ))
  export CUDA_VISIBLE_DEVICES="${visible[$slot]}"
fi

tag="shard-$index-of-$count"
case "$kind" in
  sweep)
    result="$outdir/parity-sweep.$tag.json"
    cmd=(bash "$root/harness/scripts/parity-sweep.sh" "$outdir" --shard "$index/$count" "$@") ;;
  bench)
    result="$outdir/bench.$tag.json"
    cmd=("$bench" --shard "$index/$count" --out "$result" "$@") ;;
esac

if ((dry_run)); then
  prefix=""
  [[ -n "${CUDA_VISIBLE_DEVICES+set}" && -n "$gpus" ]] && ((10#$gpus > 0)) && prefix="CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES "
  printf '%s' "$prefix"
  printf '%q ' "${cmd[@]}" | sed 's/ $//'
  echo
  exit 0
fi

mkdir -p "$outdir"
log="$outdir/$tag.log" rc_file="$outdir/$tag.rc"
rm -f "$result" "$rc_file"
{
  echo "# shard $index/$count on $(hostname), CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-<unset>}"
  printf '$'; printf ' %q' "${cmd[@]}"; echo
} >"$log"
rc=0
"${cmd[@]}" >>"$log" 2>&1 || rc=$?
echo "$rc" >"$rc_file"
((exit_zero)) && exit 0
exit "$rc"
