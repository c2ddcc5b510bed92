#!/usr/bin/env python3
"""Joins the shard files of one sharded run into the file the unsharded run writes.

    merge-shards.py [--expect N] [--out FILE] SHARD.json...

The shards are either those of one parity sweep (`parity-sweep.sh OUTDIR --shard I/N` writes
OUTDIR/parity-sweep.shard-I-of-N.json) or those of one benchmark suite run (`hybridtb_bench --suite
S --shard I/N --out F`), all N of them, in any order:

- sweep: writes the usual parity-sweep.json (schema hybridtb-parity-sweep): the cases in the
  unsharded order (each shard records its cases' positions in it, "case_indices"), the summary
  recounted from them ("seconds": the longest shard's, as the shards ran side by side), plus
  "merged_from" (the shard count, the files and each shard's seconds). Its verdicts and case order
  equal those of the unsharded run with the same options; only the timings differ.
- benchmark: writes one hybridtb-bench-results file: "cases" in suite order (by the suite position
  of each case, the backends and paths of a case in the order its shard ran them); "environment"
  holds the fields on which every shard agrees, and where they differ the earliest date_utc, the
  highest load_average_start / load_average_end (so hybridtb_bench_compare's load warning covers
  every shard) and shard 0's value of any other field (absent if shard 0 lacks it), named in
  "fields_differing_across_shards"; "environment.shards" keeps every shard's own environment
  (host, GPU, command, shard) and ceilings, in shard order; "ceilings" is shard 0's (each case
  carries the ceilings of its own shard in ceiling_bandwidth_GBps / ceiling_TFLOPs). Other top-level
  fields of the shard files (a peer's annotations) are not carried: annotate the merged file.

It refuses, writing nothing, with a message naming the files (exit 2), when: a file is unreadable,
not one of these schemas or has no "shard" record (it was not run with --shard); the files mix
sweeps and benchmark runs; their shard counts differ (or differ from --expect N); a shard index is
given twice or one is missing; the shards come from different runs (sweep: backend, reference,
--quick/--only selection or case list; benchmark: suite and its case list, commit, --backend,
--benchmark_filter, --cuda-graph, --repetitions, --min-time, L2 flush); two shards hold the same
case; or a file's cases are not the ones its shard record lists.

--out FILE: the merged file (default: the shard files' name without ".shard-I-of-N", in the
directory of shard 0: OUTDIR/parity-sweep.json for a sweep). Written atomically (a temporary file
renamed), replacing an existing one; never one of the inputs. Exit status: 0 merged, 2 refused or
usage error. Tested by CTest (`ctest -L shards`).
"""
import argparse
import json
import os
import re
import sys

SWEEP = "hybridtb-parity-sweep"
BENCH = "hybridtb-bench-results"
VERDICTS = ("pass", "fail", "not-supported", "skipped", "error")
SHARD_SUFFIX = re.compile(r"\.shard-(\d+)-of-(\d+)(?=\.json$)")


class Refused(Exception):
    """A reason not to merge; nothing has been written."""


def load_shard(path):
    """(document, schema, shard record) of one shard file, or Refused saying what is wrong with it."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise Refused(f"{path}: cannot read: {e.strerror}")
    except ValueError as e:
        raise Refused(f"{path}: not JSON: {e}")
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema == SWEEP:
        shard = doc.get("shard")
    elif schema == BENCH:
        shard = doc.get("environment", {}).get("shard") if isinstance(doc.get("environment"), dict) else None
    else:
        raise Refused(f"{path}: not a parity-sweep or hybridtb_bench results file (schema {schema!r})")
    if shard is None:
        where = '"shard"' if schema == SWEEP else '"environment.shard"'
        raise Refused(f"{path}: no {where} record: not written by a run with --shard I/N")
    problems = []
    for key, kind in (("index", int), ("count", int), ("total_cases", int), ("case_ids", list),
                      ("case_indices", list), ("case_list_digest", str)):
        if not isinstance(shard.get(key), kind) or isinstance(shard.get(key), bool):
            problems.append(f"{key} is not a {kind.__name__}")
    if not problems:
        if not (shard["count"] >= 1 and 0 <= shard["index"] < shard["count"]):
            problems.append(f"index {shard['index']} / count {shard['count']} is not 0 <= index < count")
        if len(shard["case_ids"]) != len(shard["case_indices"]):
            problems.append("case_ids and case_indices differ in length")
        elif not all(isinstance(k, int) and 0 <= k < shard["total_cases"] for k in shard["case_indices"]):
            problems.append(f"a case index outside 0..{shard['total_cases'] - 1}")
    if problems:
        raise Refused(f"{path}: malformed shard record: " + "; ".join(problems))
    if not isinstance(doc.get("cases"), list):
        raise Refused(f"{path}: no list of cases")
    return doc, schema, shard


def run_identity(schema, doc, shard):
    """What must be equal in every shard of one run, field by field."""
    selection = shard.get("selection")
    if schema == SWEEP:
        summary = doc.get("summary", {})
        fields = {"backend": summary.get("backend"), "against": summary.get("against"),
                  "selection (--quick, --only)": selection}
    else:
        env = doc["environment"]
        fields = {"suite": env.get("suite"), "commit": env.get("commit"),
                  "selection (--backend, --benchmark_filter, --cuda-graph, --repetitions, --min-time, L2 flush)":
                      selection}
    fields.update({"schema version": doc.get("version"), "total_cases": shard["total_cases"],
                   "case list (case_list_digest)": shard["case_list_digest"]})
    return fields


def check_shards(paths, expect):
    """The shards in index order [(path, doc, shard)] and their schema, or Refused."""
    loaded = [(p, *load_shard(p)) for p in paths]
    schemas = {schema for _, _, schema, _ in loaded}
    if len(schemas) > 1:
        kinds = ", ".join(f"{p} ({'sweep' if s == SWEEP else 'benchmark'})" for p, _, s, _ in loaded)
        raise Refused(f"the files mix parity-sweep and benchmark shards: {kinds}")
    schema = schemas.pop()
    counts = {}
    for p, _, _, shard in loaded:
        counts.setdefault(shard["count"], []).append(p)
    if len(counts) > 1:
        raise Refused("the files are shards of different counts N: " +
                      "; ".join(f"of {n}: {', '.join(ps)}" for n, ps in sorted(counts.items())))
    count = next(iter(counts))
    if expect is not None and count != expect:
        raise Refused(f"--expect {expect}, but the files are shards of {count}")
    by_index = {}
    seen_paths = {}
    for p, doc, _, shard in loaded:
        real = os.path.realpath(p)
        if real in seen_paths:
            raise Refused(f"{p} is given twice (also as {seen_paths[real]})")
        seen_paths[real] = p
        if shard["index"] in by_index:
            raise Refused(f"shard {shard['index']}/{count} is given twice: {by_index[shard['index']][0]} and {p}")
        by_index[shard["index"]] = (p, doc, shard)
    missing = [i for i in range(count) if i not in by_index]
    if missing:
        raise Refused(f"missing shard(s) {', '.join(f'{i}/{count}' for i in missing)}: have "
                      f"{', '.join(f'{i}/{count} ({by_index[i][0]})' for i in sorted(by_index))}")
    shards = [by_index[i] for i in range(count)]
    first_path, first_doc, first_shard = shards[0]
    reference = run_identity(schema, first_doc, first_shard)
    for p, doc, shard in shards[1:]:
        for field, value in run_identity(schema, doc, shard).items():
            if value != reference[field]:
                raise Refused(f"the shards come from different runs: {field} is {json.dumps(reference[field])} in "
                              f"{first_path} but {json.dumps(value)} in {p}")
    owner = {}
    for p, doc, shard in shards:
        for cid, k in zip(shard["case_ids"], shard["case_indices"]):
            for key in (("id", cid), ("position", k)):
                if key in owner:
                    what = f"case {cid}" if key[0] == "id" else f"case position {k} ({cid})"
                    raise Refused(f"the shards overlap: {what} is in {owner[key]} and in {p}")
                owner[key] = p
    total = first_shard["total_cases"]
    held = sum(len(shard["case_ids"]) for _, _, shard in shards)
    if held != total:
        raise Refused(f"the {count} shards hold {held} cases, the run has {total}")
    for p, doc, shard in shards:
        listed = shard["case_ids"]
        if schema == SWEEP:
            ids = [c.get("id") for c in doc["cases"]]
            if ids != listed:
                raise Refused(f"{p}: its cases {ids} are not the ones its shard record lists {listed}")
        else:
            stray = sorted({c.get("name") for c in doc["cases"]} - set(listed))
            if stray:
                raise Refused(f"{p}: cases not in its shard record: {', '.join(map(str, stray))}")
    return shards, schema


def merge_sweep(shards):
    positioned = []
    for _, doc, shard in shards:
        positioned += zip(shard["case_indices"], doc["cases"])
    cases = [c for _, c in sorted(positioned, key=lambda pc: pc[0])]
    first = shards[0][1]["summary"]
    counts = {v: sum(1 for c in cases if c.get("verdict") == v) for v in VERDICTS}
    seconds = [doc["summary"].get("seconds", 0) for _, doc, _ in shards]
    summary = {"backend": first["backend"], "against": first["against"], "quick": first["quick"], "cases": len(cases),
               "seconds": max(seconds), **counts}
    return {"schema": SWEEP, "version": shards[0][1]["version"], "summary": summary, "cases": cases,
            "merged_from": {"shards": len(shards), "files": [os.path.basename(p) for p, _, _ in shards],
                            "seconds": seconds}}


def merge_bench(shards):
    positioned = []
    for _, doc, shard in shards:
        position = dict(zip(shard["case_ids"], shard["case_indices"]))
        positioned += [(position[c["name"]], n, c) for n, c in enumerate(doc["cases"])]
    cases = [c for _, _, c in sorted(positioned, key=lambda t: (t[0], t[1]))]
    envs = [{k: v for k, v in doc["environment"].items() if k != "shard"} for _, doc, _ in shards]
    keys = []
    for e in envs:
        keys += [k for k in e if k not in keys]
    environment, differing = {}, []
    for k in keys:
        values = [e.get(k) for e in envs]
        if any(v != values[0] for v in values):
            differing.append(k)
            present = [v for v in values if v is not None]
            if k == "date_utc" and present:
                values[0] = min(present)
            elif k in ("load_average_start", "load_average_end") and present:
                values[0] = max(present)
            elif k not in envs[0]:
                continue  # shard 0 has no such field: only the shards' own environments show it
        environment[k] = values[0]
    environment["fields_differing_across_shards"] = differing
    environment["shards"] = [{"file": os.path.basename(p), "environment": doc["environment"],
                              "ceilings": doc.get("ceilings", {})} for p, doc, _ in shards]
    first = shards[0][1]
    return {"schema": BENCH, "version": first["version"], "environment": environment,
            "ceilings": first.get("ceilings", {}), "cases": cases}


def default_out(shards):
    path = shards[0][0]
    name = os.path.basename(path)
    if not SHARD_SUFFIX.search(name):
        raise Refused(f"{path}: its name has no .shard-I-of-N part to drop: pass --out FILE")
    return os.path.join(os.path.dirname(path), SHARD_SUFFIX.sub("", name))


def main(argv):
    parser = argparse.ArgumentParser(prog="merge-shards.py",
                                     description="Join the N shard files of one sharded parity sweep or "
                                                 "benchmark run into the unsharded file.")
    parser.add_argument("shards", nargs="+", metavar="SHARD.json")
    parser.add_argument("--out", help="the merged file (default: shard 0's name without .shard-I-of-N)")
    parser.add_argument("--expect", type=int, metavar="N", help="refuse unless the files are shards of N")
    args = parser.parse_args(argv)
    if args.expect is not None and args.expect < 1:
        print(f"merge-shards: error: --expect N needs N >= 1 (got {args.expect})", file=sys.stderr)
        return 2
    try:
        shards, schema = check_shards(args.shards, args.expect)
        out = args.out or default_out(shards)
        if any(os.path.realpath(out) == os.path.realpath(p) for p, _, _ in shards):
            raise Refused(f"--out {out} is one of the shard files")
        if os.path.isdir(out):
            raise Refused(f"--out {out} is a directory")
    except Refused as e:
        print(f"merge-shards: error: {e}; nothing written", file=sys.stderr)
        return 2
    merged = merge_sweep(shards) if schema == SWEEP else merge_bench(shards)
    parent = os.path.dirname(out)
    if parent:
        os.makedirs(parent, exist_ok=True)
    tmp = f"{out}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(merged, f, indent=2 if schema == SWEEP else 1)
        f.write("\n")
    os.replace(tmp, out)
    if schema == SWEEP:
        s = merged["summary"]
        print(f"merge-shards: {len(shards)} shards of the parity sweep (backend {s['backend']}), {s['cases']} cases: "
              f"{s['pass']} pass, {s['fail']} fail, {s['not-supported']} not supported, {s['skipped']} skipped, "
              f"{s['error']} error -> {out}")
    else:
        e = merged["environment"]
        print(f"merge-shards: {len(shards)} shards of suite {e.get('suite')}, {len(merged['cases'])} benchmarks -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
