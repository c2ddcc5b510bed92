#!/usr/bin/env python3
"""Tests of kernel_ab.py with fake benchmark programs (no GPU): the run order, the verdicts against
each case's noise, the A/A control, cases on one side only, and the errors (a failing run, a bad
argument: exit 2, the side and round named, no JSON written).

    python3 experiments/kernel_ab_test.py WORKDIR
"""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
AB = os.path.join(HERE, "kernel_ab.py")

# A fake benchmark: takes --filter and --out, logs "<label> <filter>" to $FAKE_LOG, and writes the
# medians of its n-th run (n = its earlier lines in the log) from the spec file beside it; a spec
# {"fail": true} exits 3 instead.
FAKE = """#!{python}
import json, os, sys
args = sys.argv[1:]
out = args[args.index("--out") + 1]
filt = args[args.index("--filter") + 1] if "--filter" in args else ""
label = {label!r}
log = os.environ["FAKE_LOG"]
runs = sum(1 for line in open(log) if line.split(" ")[0] == label) if os.path.exists(log) else 0
with open(log, "a") as f:
    f.write(label + " " + filt + " " + " ".join(a for a in args if a.startswith("--extra")) + "\\n")
spec = json.load(open({spec!r}))
if spec.get("fail"):
    print("fake failure: device lost")
    sys.exit(3)
cases = [{{"name": n, "median_us": v[runs]}} for n, v in spec["cases"].items()]
json.dump({{"cases": cases, "environment": {{"commit": label}}}}, open(out, "w"))
"""

failures = []


def check(condition, what):
    if not condition:
        failures.append(what)
        print("FAIL:", what)


def fake(workdir, label, spec):
    spec_path = os.path.join(workdir, label + ".spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    path = os.path.join(workdir, label)
    with open(path, "w") as f:
        f.write(FAKE.format(python=sys.executable, label=label, spec=spec_path))
    os.chmod(path, 0o755)
    return path


def ab(workdir, *args):
    log = os.path.join(workdir, "log.txt")
    if os.path.exists(log):
        os.remove(log)
    done = subprocess.run([sys.executable, AB, *args], capture_output=True, text=True,
                          env=dict(os.environ, FAKE_LOG=log))
    lines = open(log).read().splitlines() if os.path.exists(log) else []
    return done, lines


def main():
    workdir = sys.argv[1]
    os.makedirs(workdir, exist_ok=True)
    out = os.path.join(workdir, "ab.json")

    # Faster beyond the noise, within the noise, and a case the new build adds.
    base = fake(workdir, "base", {"cases": {"prefill 1x8k": [100.0, 102.0, 101.0, 100.5, 101.5, 100.8],
                                            "decode 64x4k": [50.0, 51.0, 50.5, 50.2, 50.6, 50.1]}})
    new = fake(workdir, "new", {"cases": {"prefill 1x8k": [90.0, 91.0, 90.5],
                                          "decode 64x4k": [50.2, 50.9, 50.4],
                                          "decode 1x32k": [45.0, 45.5, 45.2]}})
    if os.path.exists(out):
        os.remove(out)
    done, log = ab(workdir, "--base", base, "--new", new, "--filter", "^(prefill|decode)", "--out", out,
                   "--", "--extra-flag")
    check(done.returncode == 0, f"faster case: exit {done.returncode}: {done.stderr}")
    check([line.split(" ")[0] for line in log] == ["base", "new", "new", "base", "base", "new"],
          f"alternating order base,new / new,base / base,new: {log}")
    check(all(line.split(" ")[1] == "^(prefill|decode)" and "--extra-flag" in line for line in log),
          f"--filter and the arguments after -- reach every run: {log}")
    table = json.load(open(out))
    rows = {row["name"]: row for row in table["cases"]}
    check(abs(rows["prefill 1x8k"]["ratio"] - 0.9) < 1e-9 and rows["prefill 1x8k"]["verdict"] == "faster",
          f"prefill: fastest 90 over fastest 100 = 0.9, faster: {rows['prefill 1x8k']}")
    check(abs(rows["prefill 1x8k"]["noise"] - 0.02) < 1e-9,
          f"prefill's noise: the base's 102 / 100 - 1 = 2% (the new's 91 / 90 is less): {rows['prefill 1x8k']}")
    check(rows["decode 64x4k"]["verdict"] == "within noise",
          f"decode: 50.2 / 50 = 1.004 inside the base's 2% spread: {rows['decode 64x4k']}")
    check(rows["decode 1x32k"]["verdict"] == "only in new", f"a case of the new build only: {rows['decode 1x32k']}")
    check(table["base"]["environment"].get("commit") == "base" and table["new"]["environment"].get("commit") == "new",
          f"each side's environment recorded: {table['base']}, {table['new']}")
    check("summary: 1 faster, 0 slower, 1 within noise (3 rounds)" in done.stdout, f"summary line: {done.stdout}")

    # The A/A control: the base again after both in each round; a control 3% off the base widens
    # the noise past a 2.5% change, which alone would have counted as slower.
    base = fake(workdir, "base", {"cases": {"mixed": [100.0, 103.0, 100.2, 103.1]}})
    new = fake(workdir, "new", {"cases": {"mixed": [102.5, 102.6]}})
    done, log = ab(workdir, "--base", base, "--new", new, "--rounds", "2", "--control", "--out", out)
    check(done.returncode == 0, f"control: exit {done.returncode}: {done.stderr}")
    check([line.split(" ")[0] for line in log] == ["base", "new", "base", "new", "base", "base"],
          f"control runs the base after both sides each round: {log}")
    row = json.load(open(out))["cases"][0]
    check(row.get("control_us") == [103.0, 103.1] and abs(row["aa_ratio"] - 1.03) < 1e-9,
          f"control medians and A/A ratio 103 / 100: {row}")
    check(row["verdict"] == "within noise" and abs(row["noise"] - 0.03) < 1e-9,
          f"2.5% slower inside the A/A's 3%: {row}")
    base = fake(workdir, "base", {"cases": {"mixed": [100.0, 100.2]}})  # the same base runs, no control
    done, _ = ab(workdir, "--base", base, "--new", new, "--rounds", "2", "--out", out)
    row = json.load(open(out))["cases"][0]
    check(row["verdict"] == "slower", f"without the control the same 2.5% is slower (noise 0.2%): {row}")

    # A failing run: exit 2, the side and round named, the output's tail shown, no JSON written.
    base = fake(workdir, "base", {"cases": {"a": [1.0, 1.0, 1.0]}})
    broken = fake(workdir, "new", {"fail": True})
    os.remove(out)
    done, _ = ab(workdir, "--base", base, "--new", broken, "--out", out)
    check(done.returncode == 2, f"failing run: exit {done.returncode}, expected 2")
    check("new, round 1" in done.stderr and "exited with 3" in done.stderr and "device lost" in done.stderr,
          f"failing run named with its output: {done.stderr}")
    check(not os.path.exists(out), "no JSON written after a failed run")

    # Bad arguments.
    done, _ = ab(workdir, "--base", base, "--new", base, "--rounds", "1")
    check(done.returncode == 2 and "--rounds 1" in done.stderr, f"--rounds 1 refused: {done.stderr}")
    done, _ = ab(workdir, "--base", os.path.join(workdir, "absent"), "--new", base)
    check(done.returncode == 2 and "--base" in done.stderr and "not an executable file" in done.stderr,
          f"a missing program refused: {done.stderr}")

    print(f"kernel_ab_test: {'all checks passed' if not failures else f'{len(failures)} checks failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
