#!/usr/bin/env python3
"""A/B of two builds of a kernel benchmark in one call: which cases got faster, and by more than the
same binary varies from run to run.

Both programs are builds of one kernel benchmark (hybridtb_bench_attention, hybridtb_bench_linear, or
any program that takes `--filter REGEX --out FILE` and writes {"cases": [{"name", "median_us"}, ...]}).
They run in alternating order for R rounds: base then new in even rounds, new then base in odd ones,
so that neither side always runs first, or always right after the other has heated the GPU. Per case
the fastest median of each side is compared (new / base: < 1, new is faster), and the case's noise is
the largest spread its own runs show (the slowest over the fastest median of a side, minus 1). With
--control the base program also runs a second time in every round, after both; its fastest median
over the base's is the A/A ratio of the call, and its distance from 1 counts as noise too. A ratio
further from 1 than the noise is `faster` or `slower`; otherwise `within noise`.

    python3 experiments/kernel_ab.py --base OLD/optimized/hybridtb_bench_attention \\
        --new NEW/optimized/hybridtb_bench_attention --filter '^prefill 1x8k' [--rounds 3] [--control] \\
        [--out ab.json] [-- more benchmark arguments]

Prints one row per case and writes the table as JSON with --out (only once every run has succeeded).
Exit status 0; 2 for a bad argument or a run that failed or wrote no usable JSON (the message names
the side, the round and what was wrong).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


class AbError(Exception):
    """A bad argument or a failed run: the message names what and where."""


def run_once(program, label, round_index, filter_regex, extra, workdir):
    """One run of `program`; returns {case name: median_us} and the run's environment."""
    out = os.path.join(workdir, f"{label}-{round_index}.json")
    command = [program] + (["--filter", filter_regex] if filter_regex is not None else []) + ["--out", out] + extra
    try:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as e:
        raise AbError(f"{label}, round {round_index + 1}: cannot run {program}: {e.strerror}")
    if done.returncode != 0:
        tail = "\n".join(done.stdout.strip().splitlines()[-5:])
        raise AbError(f"{label}, round {round_index + 1}: {program} exited with {done.returncode}:\n{tail}")
    try:
        with open(out) as f:
            result = json.load(f)
    except (OSError, ValueError) as e:
        raise AbError(f"{label}, round {round_index + 1}: {program} wrote no readable JSON at {out}: {e}")
    cases = result.get("cases") if isinstance(result, dict) else None
    if not isinstance(cases, list):
        raise AbError(f"{label}, round {round_index + 1}: {out} has no list 'cases'")
    medians = {}
    for case in cases:
        name, median = case.get("name"), case.get("median_us")
        if not isinstance(name, str) or not isinstance(median, (int, float)) or not median > 0:
            raise AbError(f"{label}, round {round_index + 1}: a case of {out} lacks a name or a positive "
                          f"'median_us': {case}")
        medians[name] = float(median)
    return medians, result.get("environment", {})


def spread(values):
    return max(values) / min(values) - 1.0


def compare(base_runs, new_runs, control_runs):
    """Rows per case, in the base's order; cases on one side only are listed as such."""
    rows = []
    names = list(base_runs[0])
    names += [n for n in new_runs[0] if n not in base_runs[0]]
    for name in names:
        base = [r[name] for r in base_runs if name in r]
        new = [r[name] for r in new_runs if name in r]
        control = [r[name] for r in control_runs if name in r]
        row = {"name": name, "base_us": base, "new_us": new}
        if control:
            row["control_us"] = control
        if len(base) != len(base_runs) or len(new) != len(new_runs) or (control_runs and len(control) != len(control_runs)):
            row["verdict"] = "only in base" if not new else "only in new" if not base else "missing in some runs"
            rows.append(row)
            continue
        ratio = min(new) / min(base)
        noise = max(spread(base), spread(new))
        if control:
            row["aa_ratio"] = min(control) / min(base)
            noise = max(noise, spread(control), abs(row["aa_ratio"] - 1.0))
        row.update(base_best_us=min(base), new_best_us=min(new), ratio=ratio, noise=noise)
        row["verdict"] = "faster" if ratio < 1.0 - noise else "slower" if ratio > 1.0 + noise else "within noise"
        rows.append(row)
    return rows


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="Arguments after -- go to both programs unchanged.")
    parser.add_argument("--base", required=True, help="the benchmark program of the build to compare against")
    parser.add_argument("--new", required=True, help="the benchmark program of the build under test")
    parser.add_argument("--filter", help="passed to both as --filter (the cases to run)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of alternating runs (default 3)")
    parser.add_argument("--control", action="store_true", help="also run the base a second time each round (A/A)")
    parser.add_argument("--out", help="write the table as JSON here")
    own, extra = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = parser.parse_args(own)
    if args.rounds < 2:
        raise AbError(f"--rounds {args.rounds}: at least 2 (a side's spread needs two runs)")
    for side in ("base", "new"):
        program = getattr(args, side)
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise AbError(f"--{side} {program}: not an executable file")

    base_runs, new_runs, control_runs, environments = [], [], [], {}
    with tempfile.TemporaryDirectory(prefix="kernel_ab-") as workdir:
        for r in range(args.rounds):
            order = ("base", "new") if r % 2 == 0 else ("new", "base")
            for side in order + (("control",) if args.control else ()):
                program = args.new if side == "new" else args.base
                medians, environment = run_once(program, side, r, args.filter, extra, workdir)
                {"base": base_runs, "new": new_runs, "control": control_runs}[side].append(medians)
                environments.setdefault(side, environment)
    if not base_runs[0] and not new_runs[0]:
        raise AbError(f"--filter {args.filter!r}: no case ran on either side")
    rows = compare(base_runs, new_runs, control_runs)

    print(f"{'case':<44} {'base µs':>10} {'new µs':>10} {'new/base':>9} {'noise':>7}  verdict")
    for row in rows:
        if "ratio" in row:
            print(f"{row['name']:<44} {row['base_best_us']:>10.1f} {row['new_best_us']:>10.1f} "
                  f"{row['ratio']:>9.3f} {100 * row['noise']:>6.1f}%  {row['verdict']}")
        else:
            print(f"{row['name']:<44} {'':>10} {'':>10} {'':>9} {'':>7}  {row['verdict']}")
    counts = {v: sum(1 for row in rows if row["verdict"] == v) for v in ("faster", "slower", "within noise")}
    print(f"summary: {counts['faster']} faster, {counts['slower']} slower, {counts['within noise']} within noise "
          f"({args.rounds} rounds{', with an A/A control' if args.control else ''})")
    if args.out:
        table = {"base": {"program": args.base, "environment": environments.get("base", {})},
                 "new": {"program": args.new, "environment": environments.get("new", {})},
                 "filter": args.filter, "rounds": args.rounds, "control": args.control, "extra_args": extra,
                 "cases": rows}
        with open(args.out, "w") as f:
            json.dump(table, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except AbError as e:
        print(f"kernel_ab: {e}", file=sys.stderr)
        sys.exit(2)
