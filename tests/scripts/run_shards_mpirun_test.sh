#!/usr/bin/env bash
# run_shards_mpirun_test.sh HYBRIDTB WORKDIR: run-shards.sh through mpirun, one GPU per worker.
# Without Open MPI and GPUs here, a stand-in `mpirun` first on PATH does what Open MPI does for a
# local job: -np N copies of the command side by side, each with OMPI_COMM_WORLD_RANK,
# OMPI_COMM_WORLD_SIZE and OMPI_COMM_WORLD_LOCAL_RANK, exit non-zero if one copy did. With
# --gpus 2 --shards 4 on the 3 gpt-oss mixed cases of the quick sweep (the reference computes on the
# CPU whatever CUDA_VISIBLE_DEVICES says): the launcher chosen is mpirun (auto), the stand-in is
# called with -np 4, shards 0..3 see GPUs 0, 1, 0, 1, shard 3 is empty, and the merge holds the 3
# cases once each. With CUDA_VISIBLE_DEVICES=5,7 already set, the workers pick among 5 and 7.
set -uo pipefail
hybridtb="$1" work="$2"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fail() { echo "run_shards_mpirun_test: FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work/bin"
cat >"$work/bin/mpirun" <<'SH'
#!/usr/bin/env bash
# Stand-in for Open MPI's mpirun on one host: -np N, Open MPI's other options ignored.
echo "mpirun $*" >>"$MPIRUN_STANDIN_LOG"
np=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -np) np="$2"; shift 2 ;;
    --bind-to) shift 2 ;;
    --oversubscribe|--allow-run-as-root) shift ;;
    *) break ;;
  esac
done
pids=()
for ((r = 0; r < np; r++)); do
  OMPI_COMM_WORLD_RANK=$r OMPI_COMM_WORLD_SIZE=$np OMPI_COMM_WORLD_LOCAL_RANK=$r "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
exit $rc
SH
chmod +x "$work/bin/mpirun"
export MPIRUN_STANDIN_LOG="$work/mpirun.log"
args=(--quick --backend reference --hybridtb "$hybridtb" --only gpt-oss__mixed)

(unset CUDA_VISIBLE_DEVICES; PATH="$work/bin:$PATH" bash "$root/harness/scripts/run-shards.sh" sweep "$work/out" \
   --gpus 2 --shards 4 -- "${args[@]}") || fail "run-shards exit $?"
grep -q -- "^mpirun -np 4 " "$work/mpirun.log" || fail "mpirun not called with -np 4: $(cat "$work/mpirun.log")"
expected=(0 1 0 1)
for i in 0 1 2 3; do
  head -1 "$work/out/shard-$i-of-4.log" | grep -q "^# shard $i/4 on .*, CUDA_VISIBLE_DEVICES=${expected[$i]}\$" ||
    fail "shard $i: $(head -1 "$work/out/shard-$i-of-4.log"), expected CUDA_VISIBLE_DEVICES=${expected[$i]}"
done
python3 - "$work/out" <<'PY' || fail "merged file"
import json, sys
merged = json.load(open(sys.argv[1] + "/parity-sweep.json"))
ids = [c["id"] for c in merged["cases"]]
sizes = [len(json.load(open(f"{sys.argv[1]}/parity-sweep.shard-{i}-of-4.json"))["cases"]) for i in range(4)]
if len(ids) != 3 or len(set(ids)) != 3 or not all(i.startswith("gpt-oss__mixed__") for i in ids):
    sys.exit(f"merged cases {ids}")
if sizes != [1, 1, 1, 0] or merged["summary"]["pass"] != 3:
    sys.exit(f"shard sizes {sizes}, summary {merged['summary']}")
print(f"merged {ids} from shards of sizes {sizes}")
PY

# GPUs already restricted by CUDA_VISIBLE_DEVICES: the workers choose among those.
CUDA_VISIBLE_DEVICES=5,7 PATH="$work/bin:$PATH" bash "$root/harness/scripts/run-shards.sh" sweep "$work/out57" \
  --shards 2 -- "${args[@]}" >"$work/out57.txt" 2>&1 || { cat "$work/out57.txt"; fail "run-shards exit $?"; }
grep -q "2 shards on 2 GPU(s) through mpirun" "$work/out57.txt" || fail "GPU count not taken from CUDA_VISIBLE_DEVICES"
head -1 "$work/out57/shard-0-of-2.log" | grep -q "CUDA_VISIBLE_DEVICES=5\$" &&
  head -1 "$work/out57/shard-1-of-2.log" | grep -q "CUDA_VISIBLE_DEVICES=7\$" || fail "workers did not pick GPUs 5 and 7"
echo "run_shards_mpirun_test: ok"
