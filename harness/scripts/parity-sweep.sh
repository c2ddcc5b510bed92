#!/usr/bin/env bash
# The parity sweep: generates every model preset × a set of standard mixes × dtypes ×
# KV-cache dtypes with `hybridtb gen`, runs `hybridtb parity --backend B --against reference` on
# each, and writes OUTDIR/parity-sweep.json (one entry per case) plus a summary line.
#
#   harness/scripts/parity-sweep.sh OUTDIR [--backend B] [--quick] [--hybridtb PATH] [--jobs N]
#                                   [--only SUB,SUB...] [--shard I/N]
#
# --backend   the candidate (default reference: then every case passes trivially)
# --quick     a covering subset: every preset, mix, dtype and KV-cache dtype at least once (32
#             cases, under 2 minutes on 2 cores); the full sweep is the whole product (666 cases:
#             the linear-attention presets qwen3-next-gdn and falcon-h1-7b-mamba2 with kv auto
#             only, having no KV cache; a few minutes on 16 cores)
# --hybridtb  the executable (default build/harness/cli/hybridtb)
# --jobs      parallel cases (default nproc)
# --only      keep the cases whose id (<preset>__<mix>__<dtype>__<kv_cache_dtype>) contains one of
#             these comma-separated substrings
# --shard I/N run shard I of N (0 <= I < N) of the cases (after --only) and write
#             OUTDIR/parity-sweep.shard-I-of-N.json instead of parity-sweep.json: the same schema
#             plus "shard" (index, count, the rule, this shard's case_ids and their case_indices in
#             the unsharded order, total_cases, case_list_digest of the whole case list, and the
#             selection: quick, only). The split is round-robin over the case ids sorted: the k-th id
#             in sorted order goes to shard k mod N. Sorted ids group a preset's cases together, so
#             each preset's cases, the slow SSM and linear-attention ones included, are dealt across
#             the shards rather than landing in one; shard sizes differ by at most one case.
#             harness/scripts/merge-shards.py joins the N files into the unsharded parity-sweep.json
#             (cases in the unsharded order); run-shards.sh runs the shards on every local GPU,
#             slurm-sweep.sbatch as a SLURM job array. Shards may share OUTDIR (per-case files are
#             named by case id).
#
# Sizes are kept small (contexts of a few hundred tokens, the SSM presets' intermediate size shrunk
# to 128) so the float64 CPU reference stays fast; head counts and head sizes are the presets'.
# A combination `gen` rejects is skipped with its reason ("skipped"); a case the candidate does not
# support is "not-supported" (e.g. speculative decodes with an SSM branch). Verdicts: pass, fail,
# not-supported, skipped, error (parity reported bad input). Files: OUTDIR/cases/<id>.h5,
# OUTDIR/reports/<id>.json, OUTDIR/logs/<id>.log. Exit status: 0 no fail and no error, 1 otherwise,
# 2 usage error (a bad --shard included; nothing is written then). Smoke-tested by CTest (`ctest -L gen`,
# parity_sweep_quick_reference; the shards: `ctest -L shards`).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
usage() { echo "usage: parity-sweep.sh OUTDIR [--backend B] [--quick] [--hybridtb PATH] [--jobs N] [--only SUB,SUB...] [--shard I/N]" >&2; exit 2; }
[[ $# -ge 1 && "$1" != -* ]] || usage
outdir="$1"; shift
backend=reference quick=0 hybridtb="$root/build/harness/cli/hybridtb" jobs="$(nproc)" only="" shard=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --backend) backend="${2:?}"; shift 2 ;;
    --quick) quick=1; shift ;;
    --hybridtb) hybridtb="${2:?}"; shift 2 ;;
    --jobs) jobs="${2:?}"; shift 2 ;;
    --only) only="${2:?}"; shift 2 ;;  # keep only cases whose id contains one of these comma-separated substrings
    --shard)
      [[ $# -ge 2 ]] || { echo "parity-sweep: --shard needs a value I/N (0 <= I < N)" >&2; exit 2; }
      shard="$2"; shard_given=1; shift 2 ;;
    *) usage ;;
  esac
done
# --shard I/N: two whole numbers, N >= 1 and 0 <= I < N; checked before anything is written.
shard_index=-1 shard_count=0
if [[ -n "${shard_given:-}" ]]; then
  if [[ ! "$shard" =~ ^([0-9]{1,6})/([0-9]{1,6})$ ]]; then
    echo "parity-sweep: --shard must be I/N, two whole numbers of at most 6 digits with 0 <= I < N (got '$shard')" >&2
    exit 2
  fi
  shard_index=$((10#${BASH_REMATCH[1]})) shard_count=$((10#${BASH_REMATCH[2]}))
  if (( shard_count < 1 )); then
    echo "parity-sweep: --shard I/N needs N >= 1 shards (got '$shard')" >&2; exit 2
  fi
  if (( shard_index >= shard_count )); then
    echo "parity-sweep: --shard I/N needs 0 <= I < N: shard $shard_index does not exist among $shard_count (got '$shard')" >&2
    exit 2
  fi
fi
[[ -x "$hybridtb" ]] || { echo "parity-sweep: no hybridtb executable at $hybridtb (pass --hybridtb PATH)" >&2; exit 2; }
py="$(command -v /usr/bin/python3 || command -v python3)"
mkdir -p "$outdir"

exec "$py" - "$outdir" "$backend" "$quick" "$hybridtb" "$jobs" "$only" "$shard_index" "$shard_count" <<'PY'
import concurrent.futures, json, os, subprocess, sys, time

outdir, backend, quick, hybridtb, jobs, only = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4], int(sys.argv[5]), sys.argv[6]
shard_index, shard_count = int(sys.argv[7]), int(sys.argv[8])  # shard_count 0: not sharded

PRESETS = ["llama3-8b", "mistral-7b", "gemma3-local-128", "gemma3-local-256", "gpt-oss", "hymba-small", "mamba-2.8b",
           "qwen3-next-gdn", "falcon-h1-7b-mamba2"]
# Linear-attention layers (layer_kind gdn / mamba2) have no KV cache: their cases take kv "auto" only.
LINEAR_PRESETS = {"qwen3-next-gdn", "falcon-h1-7b-mamba2"}
# The SSM presets' real weights are 64–160 MiB of float32: shrink the branch, keep the attention.
PRESET_SETS = {"hymba-small": ["ssm.intermediate_size=128", "ssm.dt_rank=8"],
               "mamba-2.8b": ["ssm.intermediate_size=128", "ssm.dt_rank=8"]}
# name -> gen arguments. Contexts cross gpt-oss's 128-token and mamba-2.8b's 16-token windows.
MIXES = {
    "decode": ["--mix", "d8@300"],
    "prefill": ["--mix", "p2x64"],
    "chunked": ["--mix", "c2x32@200"],
    "mixed": ["--mix", "d4@200+c1x32@100+p1x48"],
    "spec-decode": ["--mix", "s4x3@150"],
    "cudagraph-padded": ["--mix", "d5@200", "--pad-to", "8"],
}
DTYPES = ["float32", "float16", "bfloat16"]
KV_DTYPES = ["auto", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head"]


def case_list():
    if not quick:
        return [(p, m, d, k) for p in PRESETS for m in MIXES for d in DTYPES for k in KV_DTYPES
                if p not in LINEAR_PRESETS or k == "auto"]
    # Every value of every axis at least once, rotating the others, so a failure still points at
    # one preset, mix, dtype or cache dtype.
    cases = []
    for i, p in enumerate(PRESETS):
        cases.append((p, list(MIXES)[i % len(MIXES)], DTYPES[i % len(DTYPES)], "auto"))
    for i, m in enumerate(MIXES):
        cases.append(("llama3-8b", m, "bfloat16", KV_DTYPES[i % len(KV_DTYPES)]))
    cases.append(("hymba-small", "spec-decode", "bfloat16", "auto"))  # an SSM branch: not supported yet
    for i, k in enumerate(KV_DTYPES):
        for d in DTYPES:
            cases.append((PRESETS[(i + DTYPES.index(d)) % 5], "mixed", d, k))
    for p in sorted(LINEAR_PRESETS):
        cases.append((p, "mixed", "bfloat16", "auto"))
    seen, unique = set(), []
    for c in cases:
        if c not in seen:
            seen.add(c)
            unique.append(c)
    return unique


def worst_metric(report_case):
    """The quantity that is furthest from passing: the most elements outside tolerance, then the
    largest max_abs relative to its atol."""
    best, key = None, None
    for q in report_case.get("quantities", []):
        atol = q["tolerance"]["atol"] or 0.0
        max_abs = q["max_abs"] if isinstance(q["max_abs"], (int, float)) else float("inf")
        ratio = max_abs / atol if atol else (0.0 if max_abs == 0 else float("inf"))
        k = (not q["passed"], q["outside"], ratio)
        if key is None or k > key:
            best, key = q, k
    if best is None:
        return None
    return {"quantity": best["name"], "max_abs": best["max_abs"], "max_rel": best["max_rel"], "nmse": best["nmse"],
            "cosine": best["cosine"], "fraction_outside": best["fraction_outside"],
            "atol": best["tolerance"]["atol"], "rtol": best["tolerance"]["rtol"], "passed": best["passed"]}


def last_error_line(text):
    lines = [l for l in text.strip().splitlines() if l.strip()]
    return lines[-1] if lines else ""


def run_case(case):
    preset, mix, dtype, kv = case
    cid = f"{preset}__{mix}__{dtype}__{kv}"
    path = os.path.join(outdir, "cases", cid + ".h5")
    report = os.path.join(outdir, "reports", cid + ".json")
    gen = ["gen", "--preset", preset, *MIXES[mix], "--set", f"dtype={dtype}", "--set", f"kv_cache_dtype={kv}"]
    for s in PRESET_SETS.get(preset, []):
        gen += ["--set", s]
    gen += ["--seed", "0", "--quiet", "--out", path]
    entry = {"case": "hybridtb " + " ".join(gen[:-2]), "id": cid, "preset": preset, "mix": mix, "dtype": dtype,
             "kv_cache_dtype": kv}
    start = time.time()
    with open(os.path.join(outdir, "logs", cid + ".log"), "w") as log:
        g = subprocess.run([hybridtb, *gen], capture_output=True, text=True)
        log.write(f"$ hybridtb {' '.join(gen)}\n{g.stdout}{g.stderr}")
        if g.returncode != 0:
            entry.update(verdict="skipped", reason="gen rejected the combination: " + last_error_line(g.stderr))
            return entry
        argv = ["parity", "--quiet", "--no-rationale", "--backend", backend, "--against", "reference", path,
                "--report", report]
        p = subprocess.run([hybridtb, *argv], capture_output=True, text=True)
        log.write(f"$ hybridtb {' '.join(argv)}\n{p.stdout}{p.stderr}")
    entry["seconds"] = round(time.time() - start, 2)
    data = None
    if os.path.exists(report):
        with open(report) as f:
            data = json.load(f)
    c = data["cases"][0] if data and data.get("cases") else None
    if c and "not_supported" in c:
        entry.update(verdict="not-supported", reason=c["not_supported"])
    elif c and p.returncode in (0, 1):
        entry.update(verdict="pass" if c["passed"] else "fail", worst=worst_metric(c))
        if not c["metadata"]["passed"]:
            entry["metadata_differences"] = c["metadata"]["differences"][:5]
    else:
        entry.update(verdict="error", reason=f"parity exit {p.returncode}: " + last_error_line(p.stderr or p.stdout))
    return entry


def case_list_digest(ids):
    """FNV-1a (64 bit) of the case ids joined by newlines: equal digests, equal case lists (in order)."""
    h = 0xcbf29ce484222325
    for byte in "\n".join(ids).encode():
        h = ((h ^ byte) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"fnv1a64:{h:016x}"


def shard_positions(ids, index, count):
    """The positions (in the unsharded order) of shard `index` of `count`: round-robin over the ids
    sorted, the k-th sorted id going to shard k mod count."""
    by_id = sorted(range(len(ids)), key=lambda k: ids[k])
    return sorted(k for rank, k in enumerate(by_id) if rank % count == index)


def main():
    for sub in ("cases", "reports", "logs"):
        os.makedirs(os.path.join(outdir, sub), exist_ok=True)
    wanted = [w for w in only.split(",") if w]
    cases = [c for c in case_list() if not wanted or any(w in "__".join(c) for w in wanted)]
    shard = None
    name = "parity-sweep.json"
    if shard_count:
        ids = ["__".join(c) for c in cases]
        positions = shard_positions(ids, shard_index, shard_count)
        shard = {"index": shard_index, "count": shard_count,
                 "rule": "round-robin over the case ids sorted: the k-th id goes to shard k mod count",
                 "case_ids": [ids[k] for k in positions], "case_indices": positions, "total_cases": len(ids),
                 "case_list_digest": case_list_digest(ids), "selection": {"quick": quick, "only": only}}
        cases = [cases[k] for k in positions]
        name = f"parity-sweep.shard-{shard_index}-of-{shard_count}.json"
    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(run_case, cases))
    counts = {}
    for r in results:
        counts[r["verdict"]] = counts.get(r["verdict"], 0) + 1
        if r["verdict"] != "pass":
            print(f"{r['verdict']:>13}  {r['id']}: {r.get('reason') or r.get('worst')}")
    elapsed = time.time() - start
    summary = {"backend": backend, "against": "reference", "quick": quick, "cases": len(results),
               "seconds": round(elapsed, 1), **{k: counts.get(k, 0) for k in ("pass", "fail", "not-supported", "skipped", "error")}}
    out = {"schema": "hybridtb-parity-sweep", "version": 1, "summary": summary, "cases": results}
    if shard:
        out["shard"] = shard
    path = os.path.join(outdir, name)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)
    which = f"shard {shard_index}/{shard_count} ({len(results)} of {shard['total_cases']} cases)" if shard else f"{len(results)} cases"
    print(f"parity-sweep: backend {backend} vs reference, {which} in {elapsed:.0f} s: "
          f"{summary['pass']} pass, {summary['fail']} fail, {summary['not-supported']} not supported, "
          f"{summary['skipped']} skipped, {summary['error']} error -> {path}")
    return 1 if summary["fail"] or summary["error"] else 0


sys.exit(main())
PY
