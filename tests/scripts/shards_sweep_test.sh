#!/usr/bin/env bash
# shards_sweep_test.sh HYBRIDTB WORKDIR: the quick parity sweep (gpt-oss and hymba-small cases,
# reference against itself) run whole, and run as 3 CPU shards by run-shards.sh (xargs) and merged:
# the merged parity-sweep.json has the unsharded run's cases in the same order with the same
# verdicts, reasons and worst quantities, and the same summary counts; each shard file holds its
# share of the cases. Then a run whose shards all fail (no hybridtb executable) exits 1 and writes
# no merged file.
set -uo pipefail
hybridtb="$1" work="$2"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fail() { echo "shards_sweep_test: FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work"
sweep_args=(--quick --backend reference --hybridtb "$hybridtb" --only "gpt-oss,hymba-small")

bash "$root/harness/scripts/parity-sweep.sh" "$work/whole" "${sweep_args[@]}" --jobs 2 || fail "unsharded sweep exit $?"
bash "$root/harness/scripts/run-shards.sh" sweep "$work/sharded" --gpus 0 --shards 3 --launcher xargs -- "${sweep_args[@]}" ||
  fail "run-shards exit $?"
for i in 0 1 2; do
  [ -f "$work/sharded/parity-sweep.shard-$i-of-3.json" ] || fail "no shard file $i"
  grep -q "^# shard $i/3 " "$work/sharded/shard-$i-of-3.log" || fail "shard $i's log does not name it"
done

python3 - "$work/whole/parity-sweep.json" "$work/sharded" <<'PY' || fail "merged sweep differs from the unsharded one"
import json, sys
whole = json.load(open(sys.argv[1]))
merged = json.load(open(sys.argv[2] + "/parity-sweep.json"))
problems = []
def same(c):
    return {k: v for k, v in c.items() if k != "seconds"}
if [c["id"] for c in merged["cases"]] != [c["id"] for c in whole["cases"]]:
    problems.append(f"case order {[c['id'] for c in merged['cases']]} != {[c['id'] for c in whole['cases']]}")
for a, b in zip(whole["cases"], merged["cases"]):
    if same(a) != same(b):
        problems.append(f"{a['id']}: {same(a)} != {same(b)}")
sa = {k: v for k, v in whole["summary"].items() if k != "seconds"}
sb = {k: v for k, v in merged["summary"].items() if k != "seconds"}
if sa != sb:
    problems.append(f"summary {sb} != {sa}")
if merged["schema"] != whole["schema"] or merged["version"] != whole["version"] or "shard" in merged:
    problems.append("merged header differs from the unsharded one")
if merged["merged_from"]["shards"] != 3:
    problems.append(f"merged_from {merged['merged_from']}")
if sa["pass"] < 1 or sa["not-supported"] < 1:
    problems.append(f"expected passes and a not-supported case: {sa}")
held = []
for i in range(3):
    shard = json.load(open(f"{sys.argv[2]}/parity-sweep.shard-{i}-of-3.json"))
    ids = [c["id"] for c in shard["cases"]]
    if shard["shard"]["index"] != i or shard["shard"]["count"] != 3 or shard["shard"]["case_ids"] != ids:
        problems.append(f"shard {i}: record {shard['shard']} vs cases {ids}")
    if len(ids) != 2 or shard["summary"]["cases"] != 2:
        problems.append(f"shard {i} holds {len(ids)} cases, expected 2 of 6")
    held += ids
if sorted(held) != sorted(c["id"] for c in whole["cases"]):
    problems.append(f"the shards hold {sorted(held)}")
if problems:
    sys.exit("\n".join(problems))
print(f"merged sweep equals the unsharded one: {len(merged['cases'])} cases, {sb}")
PY

bash "$root/harness/scripts/run-shards.sh" sweep "$work/broken" --gpus 0 --shards 2 --launcher xargs -- \
  --quick --hybridtb "$work/no-such-hybridtb" --only gpt-oss >"$work/broken.out" 2>&1
rc=$?
cat "$work/broken.out"
[ "$rc" -eq 1 ] || fail "run-shards with failing shards exited $rc, expected 1"
[ ! -e "$work/broken/parity-sweep.json" ] || fail "a merged file was written from failed shards"
grep -q "shard 0/2: exit 2" "$work/broken.out" && grep -q "merge refused" "$work/broken.out" ||
  fail "run-shards does not name the failed shards and the refused merge"
echo "shards_sweep_test: ok"
