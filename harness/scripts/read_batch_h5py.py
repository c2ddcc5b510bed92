#!/usr/bin/env python3
"""Print (and with --check, verify) a hybrid-batch file using only h5py + numpy.

Shows what a Python user sees: every group's attributes and every dataset's h5py dtype, shape and
dtype_name (bfloat16 arrives as float32, fp8 as raw uint8 bytes). --check verifies the root
attributes, the required items and their shapes against /config, the generic rules of the SSM
branch of schema 1.1 (/config/ssm, /inputs/ssm, /weights, ssm_output, the pools after the step) and
the linear-attention layers of 1.2 (/config layer_kind, their own inputs and output), as
datasets/SCHEMA.md states them; it prints every problem and exits 1 if there is any. The hybridtb
tests run it on files written by the C++ writer.

    /usr/bin/python3 harness/scripts/read_batch_h5py.py FILE [--check]
"""
import argparse
import sys

import h5py
import numpy as np

SSM_FLOATS = ("float64", "float32", "float16", "bfloat16")
FP8_QUERY = ("float8_e4m3fn", "float8_e5m2")
FLOATS = SSM_FLOATS + ("float8_e4m3fn", "float8_e5m2")
# vLLM's "fp8" is its platform fp8, float8_e4m3fn on CUDA; hybridtb's reader accepts it as "fp8_e4m3".
KV_STORAGE = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_per_token_head": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
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
    kind = text(c.get("layer_kind", "full_attention"))
    if kind != "full_attention":
        return problems + check_linear_layer(f, kind, dtype, tokens, requests)
    expected = {
        "batch/seq_lens": (None, (requests,)),
        "inputs/query": (dtype, (tokens, heads, head_size)),
        "inputs/key": (dtype, (tokens, kv_heads, head_size)),
        "inputs/value": (dtype, (tokens, kv_heads, head_size)),
    }
    if text(c["attn_type"]) == "decoder":
        blocks = f["inputs/kv_cache"].shape[0] if "inputs/kv_cache" in f else -1
        if kv_cache_dtype != "auto" and kv_cache_dtype not in KV_STORAGE:
            problems.append(f"/config kv_cache_dtype: unknown value {kv_cache_dtype!r} "
                            f"(expected auto, {', '.join(KV_STORAGE)})")
        expected["inputs/kv_cache"] = (KV_STORAGE.get(kv_cache_dtype, dtype), (blocks, 2, block_size, kv_heads, head_size))
    # 1.3: an fp8 query (raw bytes) with /inputs/q_scale; key and value keep the /config dtype.
    if "inputs/query" in f and text(f["inputs/query"].attrs.get("dtype_name", "")) in FP8_QUERY:
        expected["inputs/query"] = (text(f["inputs/query"].attrs["dtype_name"]), expected["inputs/query"][1])
        if "inputs/q_scale" not in f:
            problems.append("/inputs/query is fp8 but /inputs/q_scale is missing (real query = stored value * q_scale)")
    elif "inputs/q_scale" in f:
        problems.append("/inputs/q_scale is present but /inputs/query is not fp8")
    for path, (dtype_name, shape) in expected.items():
        if path not in f:
            problems.append(f"missing dataset /{path}")
            continue
        ds = f[path]
        if tuple(ds.shape) != shape:
            problems.append(f"/{path}: shape {list(ds.shape)} != {list(shape)}")
        if dtype_name is not None and text(ds.attrs.get("dtype_name", "")) != dtype_name:
            problems.append(f"/{path}: dtype_name {text(ds.attrs.get('dtype_name', ''))!r} != {dtype_name!r}")

    problems += check_ssm(f, tokens, heads, head_size)

    def every_dataset(name, obj):
        if isinstance(obj, h5py.Dataset):
            if "dtype_name" not in obj.attrs:
                problems.append(f"/{name}: no dtype_name attribute")
            obj[()]  # every dataset must be readable

    f.visititems(every_dataset)
    return problems


def linear_widths(kind, params):
    """(inputs {name: width}, output width) of a linear-attention layer (SCHEMA.md §6.4)."""
    p = {k: int(v) for k, v in params.items()}
    if kind == "gdn":
        hk, hv, dk, dv = p["num_k_heads"], p["num_v_heads"], p["head_k_dim"], p["head_v_dim"]
        return {"mixed_qkv": 2 * hk * dk + hv * dv, "a": hv, "b": hv}, hv * dv
    hs, hd, n, g = p["num_ssm_heads"], p["head_dim"], p["state_size"], p["n_groups"]
    return {"xBC": hs * hd + 2 * g * n, "dt": hs}, hs * hd


def check_linear_layer(f, kind, dtype, tokens, requests):
    """A linear-attention layer (1.2): its inputs [T, W] in /config dtype, no attention tensors, an
    output [T, W_out] alone; its pools and weights follow the SSM branch's generic rules."""
    problems = []
    if kind not in ("gdn", "mamba2"):
        return [f"/config layer_kind {kind!r} is not full_attention, gdn or mamba2"]
    if text(f["config"].attrs["ssm_mode"]) != kind:
        problems.append(f"/config ssm_mode {text(f['config'].attrs['ssm_mode'])!r} != layer_kind {kind!r}")
    try:
        inputs, output_width = linear_widths(kind, dict(f["config/ssm"].attrs) if "config/ssm" in f else {})
    except KeyError as missing:
        return problems + [f"missing /config/ssm {missing.args[0]} (a parameter of layer_kind {kind})"]
    if f["batch/seq_lens"].shape != (requests,):
        problems.append(f"/batch/seq_lens: shape {list(f['batch/seq_lens'].shape)} != {[requests]}")
    for name in ("query", "key", "value", "kv_cache", "k_scale", "v_scale", "k_scale_cache", "v_scale_cache"):
        if f"inputs/{name}" in f:
            problems.append(f"/inputs/{name} is present, but layer_kind {kind} is a linear-attention layer")
    for name, width in inputs.items():
        if f"inputs/{name}" not in f:
            problems.append(f"missing dataset /inputs/{name}")
            continue
        ds = f[f"inputs/{name}"]
        if tuple(ds.shape) != (tokens, width):
            problems.append(f"/inputs/{name}: shape {list(ds.shape)} != {[tokens, width]}")
        if text(ds.attrs.get("dtype_name", "")) != dtype:
            problems.append(f"/inputs/{name}: dtype_name {text(ds.attrs.get('dtype_name', ''))!r} != {dtype!r}")
    for group in ("outputs", "expected"):
        if group not in f:
            continue
        if f"{group}/output" not in f or tuple(f[f"{group}/output"].shape) != (tokens, output_width):
            problems.append(f"/{group}/output must be [{tokens}, {output_width}]")
        for name in ("attn_output", "ssm_output", "kv_cache"):
            if f"{group}/{name}" in f:
                problems.append(f"/{group}/{name} is present, but layer_kind {kind} has no such output")
    problems += check_ssm(f, tokens, 0, 0)

    def every_dataset(name, obj):
        if isinstance(obj, h5py.Dataset):
            if "dtype_name" not in obj.attrs:
                problems.append(f"/{name}: no dtype_name attribute")
            obj[()]

    f.visititems(every_dataset)
    return problems


def check_ssm(f, tokens, heads, head_size):
    """The SSM branch (1.1): generic rules only; each mode's names and shapes are the reference's."""
    problems = []

    def named_tensors(path, what):
        """{name: shape} of the float datasets in group `path` (problems for anything else)."""
        if path not in f:
            return {}
        if not isinstance(f[path], h5py.Group):
            problems.append(f"/{path} is not a group")
            return {}
        shapes = {}
        for name, ds in f[path].items():
            if not isinstance(ds, h5py.Dataset):
                problems.append(f"/{path}/{name} is a group, expected a dataset")
                continue
            dtype_name = text(ds.attrs.get("dtype_name", ""))
            if dtype_name not in SSM_FLOATS:
                problems.append(f"/{path}/{name}: dtype_name {dtype_name!r} is not allowed "
                                f"({what} must be one of {', '.join(SSM_FLOATS)})")
            if ds.shape is None or len(ds.shape) < 1:
                problems.append(f"/{path}/{name}: {what} must have rank >= 1")
                continue
            shapes[name] = tuple(ds.shape)
        return shapes

    def same_num_slots(path, pools):
        slots = {name: shape[0] for name, shape in pools.items()}
        if len(set(slots.values())) > 1:
            problems.append(f"/{path}: the pools do not share num_slots (dimension 0): {slots}")

    if "config/ssm" in f:
        for key, value in f["config/ssm"].attrs.items():
            v = np.asarray(value)  # any integer width; the C++ reader also takes integral floats
            integral = v.size == 1 and (v.dtype.kind in "iu" or (v.dtype.kind == "f" and float(v.flat[0]).is_integer()))
            if not integral:
                problems.append(f"/config/ssm: attribute {key} = {text(value)!r} is not an integer")
    before = named_tensors("inputs/ssm", "state pools")
    same_num_slots("inputs/ssm", before)
    named_tensors("weights", "weights")
    for group in ("outputs", "expected"):
        if f"{group}/ssm_output" in f:
            ds = f[f"{group}/ssm_output"]
            if tuple(ds.shape or ()) != (tokens, heads, head_size):
                problems.append(f"/{group}/ssm_output: shape {list(ds.shape or ())} != {[tokens, heads, head_size]}")
            if text(ds.attrs.get("dtype_name", "")) not in FLOATS:
                problems.append(f"/{group}/ssm_output: dtype_name {text(ds.attrs.get('dtype_name', ''))!r} "
                                "is not a float type")
        after = named_tensors(f"{group}/ssm", "state pools")
        same_num_slots(f"{group}/ssm", after)
        if before and after:  # the pools after the step are the pools before it
            for name in sorted(set(before) | set(after)):
                if name not in after:
                    problems.append(f"missing dataset /{group}/ssm/{name} (the pool /inputs/ssm/{name} after the step)")
                elif name not in before:
                    problems.append(f"/{group}/ssm/{name}: no state pool of that name in /inputs/ssm")
                elif after[name] != before[name]:
                    problems.append(f"/{group}/ssm/{name}: shape {list(after[name])} != /inputs/ssm/{name} "
                                    f"{list(before[name])}")
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
