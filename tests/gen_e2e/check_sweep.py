#!/usr/bin/env python3
"""Checks a parity-sweep.json written with --backend reference: every case passed bit for bit (the
reference against itself), or is "not-supported"/"skipped" with a reason; the summary counts the
cases. Used by the parity_sweep_quick_reference CTest test."""
import json
import sys

with open(sys.argv[1]) as f:
    sweep = json.load(f)
cases, summary = sweep["cases"], sweep["summary"]
problems = []
if sweep["schema"] != "hybridtb-parity-sweep" or summary["backend"] != "reference":
    problems.append(f"unexpected header: {sweep['schema']}, backend {summary['backend']}")
if summary["cases"] != len(cases) or sum(summary[v] for v in ("pass", "fail", "not-supported", "skipped", "error")) != len(cases):
    problems.append(f"summary {summary} does not count the {len(cases)} cases")
for c in cases:
    if not c["case"].startswith("hybridtb gen --preset ") or c["verdict"] not in ("pass", "not-supported", "skipped"):
        problems.append(f"{c['id']}: verdict {c['verdict']} ({c.get('reason')})")
    elif c["verdict"] == "pass" and (c["worst"] is None or c["worst"]["max_abs"] != 0 or c["worst"]["cosine"] != 1):
        problems.append(f"{c['id']}: the reference against itself is not bit-identical: {c['worst']}")
    elif c["verdict"] != "pass" and not c.get("reason"):
        problems.append(f"{c['id']}: {c['verdict']} without a reason")
if summary["pass"] == 0:
    problems.append("no case passed")
if problems:
    sys.exit("check_sweep: " + "\n  ".join(problems))
print(f"check_sweep: {len(cases)} cases: {summary['pass']} pass, {summary['not-supported']} not supported, "
      f"{summary['skipped']} skipped")
