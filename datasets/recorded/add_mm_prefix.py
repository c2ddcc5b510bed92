#!/usr/bin/env python3
"""Adds /batch/mm_prefix_range to a generated file (the mix grammar has no multimodal term).

    add_mm_prefix.py FILE RANGES      RANGES: requests joined by '/', a request's ranges by ',',
                                      a range 'start:end' (inclusive absolute positions; 0:0 = none)
e.g. `add_mm_prefix.py f.h5 0:0,0:0/28:37,0:0/2:6,10:15` gives int32 [3, 2, 2]. The command is
stored in the root attribute `post_command` (after `generator_command`), so the two regenerate it.
Run by make.sh before `hybridtb record`. Needs h5py + numpy."""
import sys

import h5py
import numpy as np


def main():
    path, spec = sys.argv[1], sys.argv[2]
    ranges = [[[int(x) for x in r.split(":")] for r in req.split(",")] for req in spec.split("/")]
    array = np.asarray(ranges, dtype="<i4")
    with h5py.File(path, "r+") as f:
        if array.shape[0] != f["batch/seq_lens"].shape[0]:
            sys.exit(f"{path}: {array.shape[0]} requests in RANGES, the batch has {f['batch/seq_lens'].shape[0]}")
        d = f["batch"].create_dataset("mm_prefix_range", data=array)
        d.attrs["dtype_name"] = "int32"
        f.attrs["post_command"] = "add_mm_prefix.py " + " ".join(sys.argv[1:])


if __name__ == "__main__":
    main()
