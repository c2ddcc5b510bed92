#!/usr/bin/env bash
# Runs a parity sweep or a benchmark suite as N shards side by side on this machine, one worker
# per GPU, then joins the shards into the usual single file.
#
#   run-shards.sh sweep OUTDIR [--gpus G] [--shards N] [--launcher auto|mpirun|xargs] [--dry-run] [-- SWEEP ARGS...]
#   run-shards.sh bench OUTDIR [--gpus G] [--shards N] [--launcher ...] [--bench PATH] [--dry-run] -- --suite FILE [BENCH ARGS...]
#
# e.g. run-shards.sh sweep out/sweep -- --backend cuda          (the full sweep over every GPU)
#      run-shards.sh bench out/bench -- --suite experiments/suites/standard.json --backend cuda
#      run-shards.sh sweep out/sweep --gpus 0 --shards 3 -- --quick --backend reference   (CPU only)
#
# --gpus G    GPUs to use (default: the entries of CUDA_VISIBLE_DEVICES if set, else the GPUs
#             `nvidia-smi -L` lists, else 0). Shard I runs with CUDA_VISIBLE_DEVICES set to one
#             GPU: entry I mod G of the visible ones. --gpus 0 runs the shards on the CPU and
#             leaves CUDA_VISIBLE_DEVICES alone.
# --shards N  shards (default G; required with no GPU). All N run at once, so N > G puts several
#             shards on one GPU (for benchmarks that disturbs the timings: a warning says so).
# --launcher  mpirun: `mpirun -np N` (Open MPI 4.1; the worker reads OMPI_COMM_WORLD_RANK / _SIZE /
#             _LOCAL_RANK), xargs: `xargs -P N`, auto (default): mpirun when it is on PATH, else xargs.
# --bench     the hybridtb_bench executable (default build/experiments/hybridtb_bench).
# --dry-run   print the launch and merge commands, run nothing.
#
# The split is the one of `parity-sweep.sh --shard I/N` / `hybridtb_bench --shard I/N`
# (round-robin over the sorted case ids); each shard is one shard-worker.sh, which writes
# OUTDIR/parity-sweep.shard-I-of-N.json (sweep) or OUTDIR/bench.shard-I-of-N.json (bench), its
# output to OUTDIR/shard-I-of-N.log and its exit status to OUTDIR/shard-I-of-N.rc. Files of an
# earlier run with the same N are removed first. Then merge-shards.py writes OUTDIR/parity-sweep.json
# or OUTDIR/bench.json. A sweep without --jobs gets --jobs nproc/N per shard.
# Several hosts: use slurm-sweep.sbatch (a SLURM job array), or run the shard commands on each host
# and merge-shards.py on the files.
# Exit status: 0 every shard exited 0 and the merge succeeded; 1 a shard failed (a parity fail or
# error, a failed benchmark, a crash: its log is named) or the merge refused; 2 usage error.
# Tested by CTest (`ctest -L shards`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
scripts="$root/harness/scripts"
die() { echo "run-shards: $*" >&2; exit 2; }
usage() {
  die "usage: run-shards.sh sweep|bench OUTDIR [--gpus G] [--shards N] [--launcher auto|mpirun|xargs] [--bench PATH] [--dry-run] [-- ARGS...]"
}

[[ $# -ge 2 ]] || usage
kind="$1" outdir="$2"; shift 2
[[ "$kind" == sweep || "$kind" == bench ]] || die "the first argument must be sweep or bench (got '$kind')"
[[ "$outdir" != -* ]] || die "OUTDIR must come second (got '$outdir')"
gpus="" shards="" launcher=auto bench="$root/build/experiments/hybridtb_bench" dry_run=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --gpus) [[ $# -ge 2 ]] || die "--gpus needs a value G >= 0"; gpus="$2"; shift 2 ;;
    --shards) [[ $# -ge 2 ]] || die "--shards needs a value N >= 1"; shards="$2"; shift 2 ;;
    --launcher) [[ $# -ge 2 ]] || die "--launcher needs a value: auto, mpirun or xargs"; launcher="$2"; shift 2 ;;
    --bench) [[ $# -ge 2 ]] || die "--bench needs a path"; bench="$2"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    --) shift; break ;;
    *) usage ;;
  esac
done
args=("$@")

if [[ -n "$gpus" ]]; then
  [[ "$gpus" =~ ^[0-9]{1,4}$ ]] || die "--gpus must be a whole number >= 0 (got '$gpus')"
  gpus=$((10#$gpus))
elif [[ -n "${CUDA_VISIBLE_DEVICES:-}" ]]; then
  IFS=, read -r -a visible <<<"$CUDA_VISIBLE_DEVICES"
  gpus=${#visible[@]}
elif command -v nvidia-smi >/dev/null 2>&1; then
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true)
else
  gpus=0
fi
if [[ -n "$shards" ]]; then
  [[ "$shards" =~ ^[0-9]{1,6}$ ]] && ((10#$shards >= 1)) || die "--shards must be a whole number >= 1 (got '$shards')"
  shards=$((10#$shards))
elif ((gpus > 0)); then
  shards=$gpus
else
  die "no GPU found (--gpus 0, or no nvidia-smi): pass --shards N to run N shards on the CPU"
fi
case "$launcher" in
  auto) if command -v mpirun >/dev/null 2>&1; then launcher="mpirun"; else launcher="xargs"; fi ;;
  mpirun) command -v mpirun >/dev/null 2>&1 || die "--launcher mpirun: no mpirun on PATH" ;;
  xargs) ;;
  *) die "--launcher must be auto, mpirun or xargs (got '$launcher')" ;;
esac
if [[ "$kind" == bench ]]; then
  has_suite=0
  for a in "${args[@]}"; do [[ "$a" == --suite || "$a" == --suite=* ]] && has_suite=1; done
  ((has_suite)) || die "bench: name the suite after --: -- --suite FILE"
  if ((shards > (gpus > 0 ? gpus : 1))); then
    echo "run-shards: warning: $shards benchmark shards on ${gpus} GPU(s): shards sharing a device disturb each other's timings" >&2
  fi
else
  has_jobs=0
  for a in "${args[@]}"; do [[ "$a" == --jobs ]] && has_jobs=1; done
  if ((!has_jobs)); then
    jobs=$(($(nproc) / shards))
    args+=(--jobs "$((jobs > 0 ? jobs : 1))")
  fi
fi

stem=$([[ "$kind" == sweep ]] && echo parity-sweep || echo bench)
shard_files=()
for ((i = 0; i < shards; i++)); do shard_files+=("$outdir/$stem.shard-$i-of-$shards.json"); done
worker=(bash "$scripts/shard-worker.sh" --gpus "$gpus" --exit-zero)
[[ "$kind" == bench ]] && worker+=(--bench "$bench")
if [[ "$launcher" == mpirun ]]; then
  # --oversubscribe: more shards than cores is fine; --bind-to none: a shard's threads may use
  # every core (the sweep runs --jobs cases at once, the reference its own threads).
  launch=(mpirun -np "$shards" --oversubscribe --bind-to none)
  [[ $(id -u) -eq 0 ]] && launch+=(--allow-run-as-root)
  launch+=("${worker[@]}" "$kind" "$outdir" -- "${args[@]}")
else
  launch=(xargs -P "$shards" -I{} "${worker[@]}" --shard "{}/$shards" "$kind" "$outdir" -- "${args[@]}")
fi
merge=(python3 "$scripts/merge-shards.py" --expect "$shards" "${shard_files[@]}")

if ((dry_run)); then
  echo "# $shards shards on $gpus GPU(s) through $launcher:"
  [[ "$launcher" == xargs ]] && printf 'seq 0 %d | ' "$((shards - 1))"
  printf '%q ' "${launch[@]}" | sed 's/ $//'; echo
  echo "# merge:"
  printf '%q ' "${merge[@]}" | sed 's/ $//'; echo
  exit 0
fi

mkdir -p "$outdir"
for ((i = 0; i < shards; i++)); do
  rm -f "${shard_files[$i]}" "$outdir/shard-$i-of-$shards.log" "$outdir/shard-$i-of-$shards.rc"
done
echo "run-shards: $kind: $shards shards on $gpus GPU(s) through $launcher, logs in $outdir/shard-I-of-$shards.log"
launch_rc=0
if [[ "$launcher" == mpirun ]]; then
  "${launch[@]}" || launch_rc=$?
else
  seq 0 $((shards - 1)) | "${launch[@]}" || launch_rc=$?
fi
((launch_rc == 0)) || echo "run-shards: $launcher exited $launch_rc" >&2

failed=0
for ((i = 0; i < shards; i++)); do
  log="$outdir/shard-$i-of-$shards.log" rc_file="$outdir/shard-$i-of-$shards.rc"
  rc=$(cat "$rc_file" 2>/dev/null || echo "none (the worker did not finish)")
  if [[ "$rc" == 0 ]]; then
    echo "run-shards: shard $i/$shards: ok"
  else
    failed=1
    echo "run-shards: shard $i/$shards: exit $rc, log $log; its last lines:" >&2
    tail -n 5 "$log" 2>/dev/null | sed 's/^/    /' >&2 || true
  fi
done
merge_rc=0
"${merge[@]}" || merge_rc=$?
if ((merge_rc != 0)); then
  echo "run-shards: the merge refused the shards (above); the shard files and logs are in $outdir" >&2
  exit 1
fi
((failed == 0 && launch_rc == 0)) || exit 1
exit 0
