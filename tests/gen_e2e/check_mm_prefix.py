#!/usr/bin/env python3
"""`hybridtb gen ... --mm-prefix SPEC` against the shipped datasets/recorded/mm_prefix.h5, made by
`gen` plus add_mm_prefix.py (h5py): the same generator command with --mm-prefix instead of the
post-processing must give the same /config, /batch and /inputs, element for element; bad specs
must be refused without a file.

    check_mm_prefix.py HYBRIDTB RECORDED_MM_PREFIX_H5 WORKDIR
"""
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

hybridtb, recorded, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
with h5py.File(recorded, "r") as f:
    command = f.attrs["generator_command"].split()   # hybridtb gen ... --out mm_prefix.h5
    post = f.attrs["post_command"].split()            # add_mm_prefix.py mm_prefix.h5 SPEC
spec = post[2]
out = os.path.join(work, "mm_prefix.h5")
argv = [hybridtb] + command[1:-1] + [out, "--mm-prefix", spec, "--quiet"]
subprocess.run(argv, check=True)

problems = []
with h5py.File(recorded, "r") as want, h5py.File(out, "r") as got:
    if dict(want["config"].attrs) != dict(got["config"].attrs):
        problems.append("/config attributes differ")
    names = []
    want.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) and n.split("/")[0] in ("config", "batch", "inputs") else None)
    for name in names:
        a, b = want[name][()], got[name][()] if name in got else None
        if b is None or a.dtype != b.dtype or a.shape != b.shape or not np.array_equal(a, b, equal_nan=a.dtype.kind == "f"):
            problems.append(f"/{name} differs")
    if "--mm-prefix " + spec not in got.attrs["generator_command"]:
        problems.append(f"generator_command lacks --mm-prefix: {got.attrs['generator_command']}")

for bad, message in (("0:0/28:37", "2 entries, but the batch has 3 requests"), ("0:0/28:x/1:2", "'x' is not a position")):
    target = os.path.join(work, "bad.h5")
    p = subprocess.run([hybridtb] + command[1:-1] + [target, "--mm-prefix", bad], capture_output=True, text=True)
    if p.returncode == 0 or message not in p.stderr or os.path.exists(target):
        problems.append(f"--mm-prefix {bad}: exit {p.returncode}, stderr {p.stderr.strip()!r}")
if problems:
    sys.exit("check_mm_prefix: " + "\n  ".join(problems))
print(f"check_mm_prefix: {len(names)} datasets of /config, /batch and /inputs equal the recorded file's")
