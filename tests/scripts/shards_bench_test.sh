#!/usr/bin/env bash
# shards_bench_test.sh HYBRIDTB_BENCH HYBRIDTB_BENCH_COMPARE SUITE WORKDIR: hybridtb_bench --shard
# on a tiny suite (the CTest smoke suite; the reference runs on the CPU, cuda cases skip without a
# GPU). For N = 2, 3, 7 the shards' --list together are the unsharded --list, each benchmark
# exactly once, with the shard sizes (in cases) differing by at most one. Then the suite run whole,
# and as 3 CPU shards through run-shards.sh merged into WORKDIR/sharded/bench.json: the same
# benchmarks in the same order with the same statuses, environment.shard in every shard file,
# every shard's environment kept in the merged one, and hybridtb_bench_compare reads the merged file.
set -uo pipefail
bench="$1" compare="$2" suite="$3" work="$4"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fail() { echo "shards_bench_test: FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"

"$bench" --suite "$suite" --list >"$work/all.txt" || fail "--list exit $?"
for n in 2 3 7; do
  : >"$work/union.txt"
  sizes=()
  for ((i = 0; i < n; i++)); do
    "$bench" --suite "$suite" --list --shard "$i/$n" >"$work/list-$i.txt" 2>"$work/list-$i.err" || fail "--shard $i/$n --list exit $?"
    cat "$work/list-$i.txt" >>"$work/union.txt"
    sizes+=("$(sed -n 's/.*shard [0-9]*\/[0-9]*: \([0-9]*\) of .*/\1/p' "$work/list-$i.err")")
  done
  sort "$work/all.txt" | diff - <(sort "$work/union.txt") >/dev/null ||
    fail "the $n shards' benchmarks are not the suite's, each once: $(sort "$work/all.txt" | diff - <(sort "$work/union.txt"))"
  smallest=$(printf '%s\n' "${sizes[@]}" | sort -n | head -1) largest=$(printf '%s\n' "${sizes[@]}" | sort -n | tail -1)
  [[ -n "$smallest" && $((largest - smallest)) -le 1 ]] || fail "shard sizes ${sizes[*]} of $n differ by more than one"
  echo "ok: $n shards cover the $(wc -l <"$work/all.txt") benchmarks once (cases per shard: ${sizes[*]})"
done

"$bench" --suite "$suite" --no-ceilings --out "$work/whole.json" >"$work/whole.log" 2>&1 || fail "unsharded run exit $?"
bash "$root/harness/scripts/run-shards.sh" bench "$work/sharded" --gpus 0 --shards 3 --launcher xargs --bench "$bench" -- \
  --suite "$suite" --no-ceilings || fail "run-shards exit $?"
python3 - "$work/whole.json" "$work/sharded" <<'PY' || fail "merged results differ from the unsharded run"
import json, sys
whole = json.load(open(sys.argv[1]))
merged = json.load(open(sys.argv[2] + "/bench.json"))
key = lambda c: (c["backend"], c["path"], c["name"], c["status"], c.get("reason"))
problems = []
if [key(c) for c in merged["cases"]] != [key(c) for c in whole["cases"]]:
    problems.append(f"benchmarks {[key(c)[:3] for c in merged['cases']]} != {[key(c)[:3] for c in whole['cases']]}")
if not any(c["status"] == "ok" and c.get("median_s", 0) > 0 for c in merged["cases"]):
    problems.append("no timed benchmark in the merged file")
env = merged["environment"]
if env["suite"] != whole["environment"]["suite"] or env["commit"] != whole["environment"]["commit"] or "shard" in env:
    problems.append(f"merged environment {env}")
if [s["environment"]["shard"]["index"] for s in env["shards"]] != [0, 1, 2]:
    problems.append("the merged environment does not keep the 3 shards' environments")
for i in range(3):
    shard = json.load(open(f"{sys.argv[2]}/bench.shard-{i}-of-3.json"))["environment"]["shard"]
    if (shard["index"], shard["count"], shard["total_cases"]) != (i, 3, 6):
        problems.append(f"shard {i}: {shard}")
if problems:
    sys.exit("\n".join(problems))
print(f"merged results equal the unsharded run's benchmarks: {len(merged['cases'])}")
PY
out=$("$compare" "$work/sharded/bench.json" "$work/sharded/bench.json") || fail "compare exit $?: $out"
echo "$out" | grep -q "0 slower" || fail "compare on the merged file: $out"
echo "shards_bench_test: ok"
