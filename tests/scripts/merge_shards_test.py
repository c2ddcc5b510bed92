#!/usr/bin/env python3
"""merge_shards_test.py WORKDIR: harness/scripts/merge-shards.py on synthetic shard files.

Joins: three sweep shards given in any order are merged with the cases back in the unsharded
order and the summary recounted; three benchmark shards with the cases in suite order, the
environment's common fields kept, the differing ones listed, every shard's environment kept.
Refusals (exit 2, a message naming the problem, no output file): a missing shard, a shard given
twice (same index in two files, or the same file twice), shards of different N or of N other than
--expect, shards of different backends / selections / case lists / suites / commits, overlapping
cases, sweep and benchmark shards mixed, a file without a shard record, a file whose cases are not
its record's, an --out that is one of the inputs."""
import copy
import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MERGE = os.path.join(ROOT, "harness", "scripts", "merge-shards.py")
WORK = sys.argv[1]
failures = []

# The unsharded sweep: 5 cases in this order; the shards deal them round-robin by sorted id.
IDS = ["p1__decode__float32__auto", "p0__mixed__float16__auto", "p2__prefill__bfloat16__fp8_e4m3",
       "p0__decode__bfloat16__auto", "p1__mixed__bfloat16__auto"]
VERDICTS = ["pass", "fail", "not-supported", "pass", "skipped"]


def sweep_case(k):
    case = {"case": f"hybridtb gen --preset {IDS[k].split('__')[0]}", "id": IDS[k], "verdict": VERDICTS[k],
            "seconds": 0.5 + k}
    if VERDICTS[k] in ("not-supported", "skipped"):
        case["reason"] = "a reason"
    return case


def sweep_shards(count, backend="cuda", digest="fnv1a64:0123456789abcdef", only=""):
    by_id = sorted(range(len(IDS)), key=lambda k: IDS[k])
    shards = []
    for index in range(count):
        positions = sorted(k for rank, k in enumerate(by_id) if rank % count == index)
        cases = [sweep_case(k) for k in positions]
        summary = {"backend": backend, "against": "reference", "quick": True, "cases": len(cases), "seconds": 10.0 + index}
        for v in ("pass", "fail", "not-supported", "skipped", "error"):
            summary[v] = sum(c["verdict"] == v for c in cases)
        shards.append({"schema": "hybridtb-parity-sweep", "version": 1, "summary": summary, "cases": cases,
                       "shard": {"index": index, "count": count, "rule": "round-robin",
                                 "case_ids": [IDS[k] for k in positions], "case_indices": positions,
                                 "total_cases": len(IDS), "case_list_digest": digest,
                                 "selection": {"quick": True, "only": only}}})
    return shards


NAMES = ["llama3-8b/d8@1k/a", "llama3-8b/d64@1k/a", "hymba-small/p1x128/b", "llama3-8b/p1x512/c"]


def bench_shards(count, suite="quick", commit="abc1234"):
    by_name = sorted(range(len(NAMES)), key=lambda k: NAMES[k])
    shards = []
    for index in range(count):
        positions = sorted(k for rank, k in enumerate(by_name) if rank % count == index)
        cases = []
        for k in positions:
            for backend in ("reference", "cuda"):
                cases.append({"name": NAMES[k], "backend": backend, "path": "fused", "status": "ok",
                              "median_s": 0.001 * (k + 1)})
        env = {"commit": commit, "build_type": "Release", "date_utc": f"2025-01-0{index + 1}T00:00:00Z",
               "cpu_model": "cpu", "load_average_start": 1.0 + index, "load_average_end": 0.5, "suite": suite,
               "gpu": {"name": f"NVIDIA H200 #{index}"}, "command": f"hybridtb_bench --shard {index}/{count}",
               "shard": {"index": index, "count": count, "rule": "round-robin",
                         "case_ids": [NAMES[k] for k in positions], "case_indices": positions,
                         "total_cases": len(NAMES), "case_list_digest": "fnv1a64:00000000000000aa",
                         "selection": {"backends": [], "benchmark_filter": "", "cuda_graph": False,
                                       "repetitions": 0, "min_time_s": 0.0, "l2_flush": True}}}
        shards.append({"schema": "hybridtb-bench-results", "version": 1, "environment": env,
                       "ceilings": {"device": {"read_GBps": 4000.0 + index}}, "cases": cases})
    return shards


def write(dirname, docs, stem="parity-sweep"):
    path = os.path.join(WORK, dirname)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    files = []
    for doc in docs:
        shard = doc.get("shard") or doc.get("environment", {}).get("shard") or {"index": len(files), "count": 0}
        f = os.path.join(path, f"{stem}.shard-{shard['index']}-of-{shard['count']}.json")
        if os.path.exists(f):
            f = f.replace(".json", "-copy.json")
        with open(f, "w") as out:
            json.dump(doc, out)
        files.append(f)
    return path, files


def merge(args):
    p = subprocess.run([sys.executable, MERGE, *args], capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def expect_join(name, check):
    try:
        check()
        print(f"ok: {name}")
    except AssertionError as e:
        failures.append(f"{name}: {e}")


def expect_refusal(name, path, files, *needles, extra=()):
    before = set(os.listdir(path))
    rc, out = merge([*extra, *files])
    after = set(os.listdir(path))
    problems = []
    if rc != 2:
        problems.append(f"exit {rc}, expected 2")
    for needle in needles:
        if needle not in out:
            problems.append(f"message lacks {needle!r}")
    if after != before:
        problems.append(f"wrote {sorted(after - before)}")
    if problems:
        failures.append(f"{name}: " + "; ".join(problems) + f"\n    output: {out.strip()}")
    else:
        print(f"ok: refuses {name}: {out.strip().splitlines()[-1]}")


def check_sweep_join():
    path, files = write("sweep-ok", sweep_shards(3))
    rc, out = merge(list(reversed(files)))  # any order
    assert rc == 0, f"exit {rc}: {out}"
    merged = json.load(open(os.path.join(path, "parity-sweep.json")))
    assert [c["id"] for c in merged["cases"]] == IDS, [c["id"] for c in merged["cases"]]
    assert [c["verdict"] for c in merged["cases"]] == VERDICTS
    s = merged["summary"]
    assert (s["cases"], s["pass"], s["fail"], s["not-supported"], s["skipped"], s["error"]) == (5, 2, 1, 1, 1, 0), s
    assert s["seconds"] == 12.0 and s["backend"] == "cuda", s
    assert "shard" not in merged and merged["merged_from"]["shards"] == 3, merged.get("merged_from")
    assert "5 cases: 2 pass, 1 fail" in out, out
    # --out elsewhere, and --expect matching.
    out_file = os.path.join(path, "sub", "merged.json")
    rc, out = merge(["--expect", "3", "--out", out_file, *files])
    assert rc == 0 and json.load(open(out_file))["cases"] == merged["cases"], out


def check_bench_join():
    path, files = write("bench-ok", bench_shards(3), stem="bench")
    rc, out = merge(files)
    assert rc == 0, f"exit {rc}: {out}"
    merged = json.load(open(os.path.join(path, "bench.json")))
    order = [(c["name"], c["backend"]) for c in merged["cases"]]
    assert order == [(n, b) for n in NAMES for b in ("reference", "cuda")], order
    env = merged["environment"]
    assert env["commit"] == "abc1234" and env["suite"] == "quick" and "shard" not in env, env
    assert env["date_utc"] == "2025-01-01T00:00:00Z" and env["load_average_start"] == 3.0, env
    assert env["gpu"] == {"name": "NVIDIA H200 #0"}, env["gpu"]
    assert set(env["fields_differing_across_shards"]) == {"date_utc", "load_average_start", "gpu", "command"}, \
        env["fields_differing_across_shards"]
    assert [s["environment"]["shard"]["index"] for s in env["shards"]] == [0, 1, 2], env["shards"]
    assert [s["ceilings"]["device"]["read_GBps"] for s in env["shards"]] == [4000.0, 4001.0, 4002.0]
    assert merged["ceilings"] == {"device": {"read_GBps": 4000.0}} and merged["schema"] == "hybridtb-bench-results"


expect_join("sweep shards joined in the unsharded order", check_sweep_join)
expect_join("benchmark shards joined in suite order", check_bench_join)

path, files = write("missing", sweep_shards(3))
expect_refusal("a missing shard", path, [files[0], files[2]], "missing shard(s) 1/3")
path, files = write("duplicate-index", [*sweep_shards(3), sweep_shards(3)[1]])
expect_refusal("a shard index given twice", path, files, "shard 1/3 is given twice")
path, files = write("duplicate-file", sweep_shards(2))
expect_refusal("the same file twice", path, [files[0], files[0], files[1]], "is given twice")
path, files = write("counts", [*sweep_shards(2), sweep_shards(3)[2]])
expect_refusal("shards of different N", path, files, "different counts N")
path, files = write("expect", sweep_shards(2))
expect_refusal("N other than --expect", path, files, "--expect 3", extra=("--expect", "3"))
path, files = write("backends", [sweep_shards(2)[0], sweep_shards(2, backend="reference")[1]])
expect_refusal("shards of different backends", path, files, "different runs: backend")
path, files = write("selection", [sweep_shards(2)[0], sweep_shards(2, only="llama")[1]])
expect_refusal("shards of different --only selections", path, files, "different runs: selection")
path, files = write("case-lists", [sweep_shards(2)[0], sweep_shards(2, digest="fnv1a64:ffffffffffffffff")[1]])
expect_refusal("shards of different case lists", path, files, "case list")
bad = bench_shards(2)
bad[1]["environment"]["suite"] = "standard"
path, files = write("suites", bad, stem="bench")
expect_refusal("benchmark shards of different suites", path, files, "different runs: suite")
bad = bench_shards(2)
bad[1]["environment"]["commit"] = "def5678"
path, files = write("commits", bad, stem="bench")
expect_refusal("benchmark shards of different commits", path, files, "different runs: commit")
bad = sweep_shards(2)
moved = copy.deepcopy(bad[0]["cases"][0])
bad[1]["cases"].append(moved)
bad[1]["shard"]["case_ids"].append(moved["id"])
bad[1]["shard"]["case_indices"].append(IDS.index(moved["id"]))
path, files = write("overlap", bad)
expect_refusal("overlapping shards", path, files, "overlap", moved["id"])
path, files = write("mixed", [sweep_shards(2)[0], bench_shards(2)[1]])
expect_refusal("sweep and benchmark shards mixed", path, files, "mix parity-sweep and benchmark")
unsharded = sweep_shards(1)[0]
del unsharded["shard"]
path, files = write("unsharded", [unsharded, sweep_shards(2)[1]])
expect_refusal("a file without a shard record", path, files, 'no "shard" record')
bad = sweep_shards(2)
bad[0]["cases"].pop()
path, files = write("cases", bad)
expect_refusal("a file whose cases are not its record's", path, files, "not the ones its shard record lists")
path, files = write("out-input", sweep_shards(2))
expect_refusal("--out naming an input", path, files, "is one of the shard files", extra=("--out", files[1]))

if failures:
    sys.exit("merge_shards_test: FAIL:\n  " + "\n  ".join(failures))
print("merge_shards_test: ok")
