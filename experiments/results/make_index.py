#!/usr/bin/env python3
"""Index of experiments/results/: one entry per results file (kind, GPU, commit, date, role, the
command that produced it, its headline figures), kept in index.json beside the files.

  make_index.py            rewrite index.json from the files (roles carried over from the old index)
  make_index.py --check    exit 1 if index.json and the folder disagree, if the folder holds more than
                           40 files or 2 MB, or if a GPU has two baselines of one kind
  make_index.py --compact-sweep FULL.json OUT.json
                           write the compact summary of a parity sweep (parity-sweep.sh's report)

File names: <UTC date>_<gpu|cpu>_<commit>_<kind>.<json|txt>. Each (gpu, kind) has one "baseline"
(the latest run); a file of another run is kept only as "same-run": the run a peer file of the same
date, GPU and commit was measured beside.
"""
import argparse
import json
import math
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
INDEX = "index.json"
META = {"README.md", INDEX, os.path.basename(__file__)}
MAX_FILES = 40
MAX_BYTES = 2 * 1000 * 1000
NAME = re.compile(r"^(\d{4}-\d\d-\d\d)_([a-z0-9]+)_([0-9a-f]{7,40})_([a-z0-9-]+)\.(json|txt)$")

# How each kind is made (build/ is the build tree; gpu-check.sh writes its files into OUT).
COMMANDS = {
    "gpu-check": "bash harness/scripts/gpu-check.sh OUT [STAGES] (OUT/summary.txt)",
    "attention": "build/optimized/hybridtb_bench_attention --out F (gpu-check.sh stage bench: OUT/bench.json)",
    "attention-prefill": "build/optimized/hybridtb_bench_attention --filter '^(prefill 1x(2k|4k|8k|32k)"
                         "( w4096| block32| block64| d64| d256)?( fp8_e4m3| fp8_e5m2| int8_pth| fp8_pth)?( mma.sync)?|mixed .*)$' --out F",
    "ssm": "build/optimized/hybridtb_bench_ssm --out F (gpu-check.sh stage bench: OUT/bench-ssm.json)",
    "ssm-lengths": "build/optimized/hybridtb_bench_ssm --prefill-tokens 1024,2048,4096,8192,16384,32768 --out F",
    "linear-bench": "build/optimized/hybridtb_bench_linear --out F (gpu-check.sh stage bench: OUT/bench-linear.json)",
    "linear-prefill": "build/optimized/hybridtb_bench_linear --filter prefill --out F",
    "gdn-prefill": "build/optimized/hybridtb_bench_linear --filter 'gdn prefill' --out F",
    "linear-kernels": "build/optimized/hybridtb_bench_linear --out bench-linear.json; python3 experiments/peers/"
                      "vllm_linear_peer.py --vllm DIR --no-fla --ours bench-linear.json --kernels 3 --json peer-linear.json; ncu "
                      "--clock-control none --section SpeedOfLight on one launch of each GDN / Mamba-2 prefill kernel "
                      "(the log: both prefills kernel by kernel, ours beside vLLM's)",
    "per-layer": "build/optimized/hybridtb_bench_per_layer --out F",
    "peer-attention-ratio": "python3 experiments/peers/peer_ratio.py bench.json peer.json [peer-vllm.json] --out F "
                            "(gpu-check.sh stage peer: OUT/peer-ratio.json)",
    "peer-vllm": "python3 experiments/peers/vllm_attention_peer.py --vllm DIR --out F "
                 "(gpu-check.sh stage peer with HYBRIDTB_VLLM_SRC)",
    "peer-linear": "python3 experiments/peers/vllm_linear_peer.py --vllm DIR --ours bench-linear.json "
                   "--hybridtb build/harness/cli/hybridtb --json F (gpu-check.sh stage linear-peer: "
                   "OUT/peer-linear.json; a .txt is its log)",
    "peer-ssm-ratio": "python3 experiments/peers/torch_mamba1_peer.py --out peer-ssm.json && "
                      "python3 experiments/peers/peer_ratio_ssm.py bench-ssm.json peer-ssm.json --out F",
    "parity-examples": "build/harness/cli/hybridtb parity --backend cuda --against reference --report F "
                       "datasets/examples/*.h5 (gpu-check.sh stage examples: OUT/parity.json)",
    "parity-sweep": "bash harness/scripts/parity-sweep.sh DIR --backend cuda, then "
                    "experiments/results/make_index.py --compact-sweep DIR/<report>.json F",
    "vllm-golden": "build/harness/cli/hybridtb replay --backend cuda --report F datasets/vllm/*.h5 "
                   "(gpu-check.sh stage golden: OUT/golden.json)",
}


def parse_name(name):
    m = NAME.match(name)
    if not m:
        return None
    date, gpu, commit, kind, ext = m.groups()
    return {"date": date, "gpu": gpu, "commit": commit, "kind": kind, "ext": ext}


def r1(x):
    return round(float(x), 1)


def gm(xs):
    xs = [x for x in xs if x and x > 0]
    return round(math.exp(sum(math.log(x) for x in xs) / len(xs)), 2) if xs else None


def headline(path, info):
    """The figures a reader looks for first, read from the file."""
    if info["ext"] == "txt":
        with open(path, encoding="utf-8") as f:
            stages = [" ".join(line.split()) for line in f
                      if re.match(r"^[a-z][a-z0-9-]*\s+(ok|FAIL|skip)\b", line)]
        return {"stages": stages}
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    schema = doc.get("schema") if isinstance(doc, dict) else None
    kind = info["kind"]
    if schema == "hybridtb-bench-results":
        cases = doc["cases"]
        status = {}
        for c in cases:
            status[c.get("status", "?")] = status.get(c.get("status", "?"), 0) + 1
        h = {"suite": doc["environment"].get("suite"), "cases": len(cases), "status": status,
             "ceilings": doc.get("ceilings")}
        for key, label in (("peer", "pytorch"), ("vllm_peer", "vllm")):
            ratios = [c[key]["ratio"] for c in cases if isinstance(c.get(key), dict) and "ratio" in c[key]]
            if ratios:
                h[f"{label}_peer_ratio_geomean"] = gm(ratios)
                h[f"{label}_peer_cases"] = len(ratios)
        return h
    if schema == "hybridtb-comparison-report":
        return {"summary": doc.get("summary")}
    if schema == "hybridtb-parity-sweep":
        return {"summary": doc.get("summary")}
    if schema == "hybridtb-bench-per-layer":
        return {c["name"]: f"latency eager {r1(c['eager_latency_us'])} us, graph {r1(c['graph_latency_us'])} us; "
                           f"graph GPU {r1(c['graph_gpu_us'])} us = {r1(c['pct_of_bound'])}% of bound"
                for c in doc["cases"]}
    if kind in ("attention", "attention-prefill"):
        out = {"ceilings": {k: r1(v) for k, v in doc["ceilings"].items()}}
        for c in doc["cases"]:
            if c["kind"] == "prefill":
                out[c["name"]] = f"{r1(c['median_us'])} us, {r1(c['pct_of_gemm_ceiling'])}% of GEMM"
            else:
                out[c["name"]] = f"{r1(c['median_us'])} us, {r1(c['pct_of_read_ceiling'])}% of read"
        return out
    if kind in ("ssm", "ssm-lengths", "linear-bench", "linear-prefill", "gdn-prefill"):
        out = {}
        for c in doc["cases"]:
            if "pct_of_copy_bw" in c:
                out[c["name"]] = f"{round(c['median_us'], 2)} us, {r1(c['pct_of_copy_bw'])}% of copy"
            elif "pct_of_bound" in c:
                out[c["name"]] = f"{r1(c['median_us'])} us, {r1(c['pct_of_bound'])}% of bound"
            elif "pct_of_fma" in c:
                s = f"{r1(c['median_us'])} us, {r1(c['pct_of_fma'])}% of FP32 FMA"
                if "ratio_to_flashinfer" in c:
                    s += f", {round(c['ratio_to_flashinfer'], 2)}x FlashInfer's time"
                out[c["name"]] = s
            else:
                out[c["name"]] = f"{r1(c['median_us'])} us"
        return out
    if kind == "peer-attention-ratio":
        out = {}
        for r in doc["ratios"]:
            parts = [f"ours {r1(r['ours_us'])} us" if r.get("ours_us") is not None else "ours: none"]
            for p in ("vllm", "vllm_step", "sdpa", "flex"):
                if r.get(f"{p}_ratio") is not None:
                    parts.append(f"{p} {round(r[p + '_ratio'], 2)}x")
            out[r["name"]] = ", ".join(parts)
        return out
    if kind == "peer-ssm-ratio":
        return {r["name"]: f"ours {round(r['ours_us'], 2)} us, {r['peer']} {round(r['ratio'], 2)}x"
                for r in doc["ratios"]}
    if kind.startswith("peer-"):
        return {f"{c['name']} ({c['peer']})": f"{r1(c['median_us'])} us" for c in doc["cases"]}
    return {"see": "README.md"}


def scan():
    names = sorted(os.listdir(HERE))
    problems, entries, total = [], [], 0
    for name in names:
        path = os.path.join(HERE, name)
        if not os.path.isfile(path) or os.path.islink(path):
            problems.append(f"{name}: not a plain file (rendered reports and folders are not committed)")
            continue
        total += os.path.getsize(path)
        if name in META or name == "__pycache__":
            continue
        info = parse_name(name)
        if info is None:
            problems.append(f"{name}: name is not <date>_<gpu>_<commit>_<kind>.<json|txt>")
            continue
        try:
            h = headline(path, info)
        except (ValueError, KeyError, TypeError) as e:
            problems.append(f"{name}: cannot read its figures ({type(e).__name__}: {e})")
            h = None
        entries.append({"file": name, "kind": info["kind"], "gpu": info["gpu"], "commit": info["commit"],
                        "date": info["date"], "role": "baseline", "bytes": os.path.getsize(path),
                        "command": bench_command(path, info), "headline": h})
    count = len([n for n in names if n != "__pycache__"])
    if count > MAX_FILES:
        problems.append(f"{count} files, more than {MAX_FILES}")
    if total > MAX_BYTES:
        problems.append(f"{total} bytes, more than {MAX_BYTES}")
    return entries, problems, count, total


def bench_command(path, info):
    if info["ext"] == "json":
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
        if isinstance(doc, dict) and doc.get("schema") == "hybridtb-bench-results":
            cmd = doc["environment"].get("command", "")
            if "peer_environment" in doc:
                cmd += " && python3 experiments/peers/suite_peer.py SUITE.json --out F"
                if "vllm_peer_environment" in doc:
                    cmd += " --vllm DIR"
            return cmd
    return COMMANDS.get(info["kind"], "see README.md")


def check_roles(entries):
    problems = []
    baselines = {}
    for e in entries:
        key = (e["gpu"], e["kind"])
        if e["role"] == "baseline":
            if key in baselines:
                problems.append(f"two baselines of {e['kind']} on {e['gpu']}: {baselines[key]} and {e['file']} "
                                "(remove the older, or mark it same-run of a peer run)")
            baselines[key] = e["file"]
        elif e["role"] == "same-run":
            if not any(o["kind"].startswith("peer-") and (o["date"], o["gpu"], o["commit"]) ==
                       (e["date"], e["gpu"], e["commit"]) for o in entries):
                problems.append(f"{e['file']}: same-run, but no peer file of {e['date']} {e['gpu']} {e['commit']}")
        else:
            problems.append(f"{e['file']}: role {e['role']!r} (baseline or same-run)")
    return problems


def load_index():
    path = os.path.join(HERE, INDEX)
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def build(old):
    entries, problems, count, total = scan()
    roles = {e["file"]: e.get("role", "baseline") for e in (old or {}).get("files", [])}
    for e in entries:
        e["role"] = roles.get(e["file"], "baseline")
    problems += check_roles(entries)
    doc = {"schema": "hybridtb-results-index", "version": 1,
           "limits": {"max_files": MAX_FILES, "max_bytes": MAX_BYTES},
           "files": entries}
    return doc, problems, count, total


def compact_sweep(src, dst):
    with open(src, encoding="utf-8") as f:
        doc = json.load(f)
    by_preset, not_supported, other = {}, {}, []
    margins = []
    for c in doc["cases"]:
        v = c["verdict"]
        by_preset.setdefault(c["preset"], {}).setdefault(v, 0)
        by_preset[c["preset"]][v] += 1
        if v == "not-supported":
            not_supported.setdefault(c.get("reason", ""), []).append(c["id"])
        elif v != "pass":
            other.append({"id": c["id"], "verdict": v, "reason": c.get("reason"), "worst": c.get("worst")})
        w = c.get("worst")
        if v == "pass" and w and w.get("atol"):
            margins.append((w["max_abs"] / w["atol"], c["id"], w))
    margins.sort(key=lambda m: -m[0])
    out = {"schema": doc["schema"], "version": doc.get("version"), "compact": True,
           "summary": doc["summary"],
           "by_preset": by_preset,
           "not_supported": [{"reason": r, "cases": ids} for r, ids in not_supported.items()],
           "not_passed": other,
           "closest_to_tolerance": [{"id": i, "max_abs_over_atol": round(m, 4), "quantity": w.get("quantity"),
                                     "max_abs": w.get("max_abs"), "atol": w.get("atol")}
                                    for m, i, w in margins[:10]]}
    with open(dst, "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--compact-sweep", nargs=2, metavar=("FULL", "OUT"))
    a = ap.parse_args()
    if a.compact_sweep:
        compact_sweep(*a.compact_sweep)
        return 0
    old = load_index()
    doc, problems, count, total = build(old)
    if a.check:
        if old is None:
            problems.append(f"{INDEX} missing: run {os.path.basename(__file__)} to write it")
        else:
            listed = {e["file"]: e for e in old.get("files", [])}
            fresh = {e["file"]: e for e in doc["files"]}
            for name in sorted(set(listed) - set(fresh)):
                problems.append(f"{name}: in {INDEX}, not in the folder")
            for name in sorted(set(fresh) - set(listed)):
                problems.append(f"{name}: in the folder, not in {INDEX}")
            for name in sorted(set(fresh) & set(listed)):
                if fresh[name] != listed[name]:
                    keys = sorted(k for k in set(fresh[name]) | set(listed[name])
                                  if fresh[name].get(k) != listed[name].get(k))
                    problems.append(f"{name}: {INDEX} differs from the file in {', '.join(keys)}")
            if {k: v for k, v in old.items() if k != "files"} != {k: v for k, v in doc.items() if k != "files"}:
                problems.append(f"{INDEX}: header differs (schema, version, limits)")
        for p in problems:
            print(f"make_index: {p}", file=sys.stderr)
        print(f"make_index: {count} files, {total} bytes (limits {MAX_FILES}, {MAX_BYTES}); "
              f"{len(doc['files'])} results; {'FAIL' if problems else 'ok'}")
        return 1 if problems else 0
    with open(os.path.join(HERE, INDEX), "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    for p in problems:
        print(f"make_index: {p}", file=sys.stderr)
    print(f"make_index: wrote {INDEX}: {len(doc['files'])} results; {count} files, {total} bytes")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
