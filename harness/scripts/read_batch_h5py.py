#!/usr/bin/env python3
"""Print (and with --check, verify) a hybrid-batch file using only h5py + numpy.

Shows what a Python user sees: every group's attributes and every dataset's h5py dtype, shape and
dtype_name (bfloat16 arrives as float32, fp8 as raw uint8 bytes). --check verifies the root
attributes, the required items and their shapes against /config (datasets/SCHEMA.md) and exits 1
on the first problem. The hybridtb tests run it on files written by the C++ writer.

    /usr/bin/python3 harness/scripts/read_batch_h5py.py FILE [--check]
"""
import argparse
import sys

import h5py
import numpy as np

KV_STORAGE = {"fp8_e4m3": "float8_e4m3fn", "fp8_per_token_head": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
              "int8_per_token_head": "int8"}


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def describe(f):
    def visit(name, obj):
        path = "/" + name
        if isinstance(obj, h5py.Group):
            attrs = ", ".join(f"{k}={text(v)!r}" if isinstance(v, (str, bytes)) else f"{k}={v}"
                              for k, v in obj.attrs.items())
            print(f"{path}/  {attrs}")
        else:
            dtype_name = text(obj.attrs.get("dtype_name", "?"))
            data = obj[()]
            summary = ""
            if obj.dtype.kind == "f" and obj.shape is not None and data.size:
                finite = data[np.isfinite(data)]
                summary = f" min={finite.min() if finite.size else 'n/a'} max={finite.max() if finite.size else 'n/a'}"
            shape = "empty" if obj.shape is None else list(obj.shape)  # h5py.Empty: a default IntArray
            print(f"{path}  {dtype_name} (h5py {obj.dtype.str}) {shape}{summary}")

    root = ", ".join(f"{k}={text(v)!r}" for k, v in f.attrs.items())
    print(f"/  {root}")
    f.visititems(visit)


def check(f):
    """Returns a list of problems (empty if the file looks valid)."""
    problems = []
    if text(f.attrs.get("schema", "")) != "hybrid-batch":
        problems.append("root attribute schema is not 'hybrid-batch'")
    if not text(f.attrs.get("schema_version", "")).startswith("1."):
        problems.append("schema_version is not 1.x")
    for group in ("config", "batch", "inputs"):
        if group not in f:
            return problems + [f"missing group /{group}"]
    c = f["config"].attrs
    heads, kv_heads, head_size, block_size = (int(c[k]) for k in ("num_heads", "num_kv_heads", "head_size", "block_size"))
    dtype, kv_cache_dtype = text(c["dtype"]), text(c["kv_cache_dtype"])
    tokens = f["batch/slot_mapping"].shape[0]
    requests = f["batch/query_start_loc"].shape[0] - 1
    expected = {
        "batch/seq_lens": (None, (requests,)),
        "inputs/query": (dtype, (tokens, heads, head_size)),
        "inputs/key": (dtype, (tokens, kv_heads, head_size)),
        "inputs/value": (dtype, (tokens, kv_heads, head_size)),
    }
    if text(c["attn_type"]) == "decoder":
        blocks = f["inputs/kv_cache"].shape[0] if "inputs/kv_cache" in f else -1
        expected["inputs/kv_cache"] = (KV_STORAGE.get(kv_cache_dtype, dtype), (blocks, 2, block_size, kv_heads, head_size))
    for path, (dtype_name, shape) in expected.items():
        if path not in f:
            problems.append(f"missing dataset /{path}")
            continue
        ds = f[path]
        if tuple(ds.shape) != shape:
            problems.append(f"/{path}: shape {list(ds.shape)} != {list(shape)}")
        if dtype_name is not None and text(ds.attrs.get("dtype_name", "")) != dtype_name:
            problems.append(f"/{path}: dtype_name {text(ds.attrs.get('dtype_name', ''))!r} != {dtype_name!r}")

    def every_dataset(name, obj):
        if isinstance(obj, h5py.Dataset):
            if "dtype_name" not in obj.attrs:
                problems.append(f"/{name}: no dtype_name attribute")
            obj[()]  # every dataset must be readable

    f.visititems(every_dataset)
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--check", action="store_true", help="verify the schema; exit 1 on problems")
    args = parser.parse_args()
    with h5py.File(args.path, "r") as f:
        describe(f)
        if args.check:
            problems = check(f)
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            print("ok" if not problems else f"{len(problems)} problem(s)")
            sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
