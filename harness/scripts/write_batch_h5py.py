#!/usr/bin/env python3
"""Write a small, valid hybrid-batch 1.x file with h5py + numpy (schema: datasets/SCHEMA.md).

An example for capture code. `write_hybrid_batch()` takes plain numpy arrays and stores them as the
schema asks. `example_batch()` makes a tiny, consistent batch to feed it; with `--ssm prefix_sum`
it also writes the SSM branch of schema 1.1 (/config ssm_mode and the state pool
/inputs/ssm/state), the way to store any mode's params, pools and weights (`example_ssm()`). The
file records the lowest version that describes it: 1.0, or 1.1 with SSM items. The hybridtb tests
read this script's output with read_batch_file (tests/io/h5py_interop_test.cpp).

    /usr/bin/python3 harness/scripts/write_batch_h5py.py out.h5 [--dtype bfloat16] [--kv-cache-dtype auto]
                                                         [--ssm none|prefix_sum] [--seed 0]
"""
import argparse

import h5py
import numpy as np

NUMPY_DTYPES = {"float64": "<f8", "float32": "<f4", "float16": "<f2", "int8": "i1", "int32": "<i4", "int64": "<i8"}


def bfloat16_type():
    """The schema's bfloat16: a 2-byte HDF5 float (sign bit 15, exponent bits 7-14 with bias 127,
    mantissa bits 0-6). h5py reads it back as exact float32."""
    t = h5py.h5t.IEEE_F32LE.copy()
    t.set_fields(15, 7, 8, 0, 7)  # fields first: they must fit the current precision
    t.set_precision(16)
    t.set_size(2)
    t.set_ebias(127)
    return t


def to_bfloat16_bits(values):
    """float32 values -> bfloat16 bit patterns (round to nearest even; NaN stays NaN)."""
    f32 = np.ascontiguousarray(values, dtype="<f4")
    bits = f32.view("<u4").astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype("<u2")
    nan = np.isnan(f32)
    rounded[nan] = ((bits[nan] >> 16) | 0x40).astype("<u2")  # keep a NaN a (quiet) NaN
    return rounded


FP8_QUERY = ("float8_e4m3fn", "float8_e5m2")


def write_tensor(group, name, array, dtype_name):
    """One tensor dataset plus its dtype_name attribute.

    bfloat16: pass float values (rounded here) or uint16 bit patterns, e.g. from torch
    `t.view(torch.uint16)`. fp8: pass the raw bytes as uint8 (`t.view(torch.uint8)`)."""
    if dtype_name == "bfloat16":
        array = np.asarray(array)
        bits = array.astype("<u2") if array.dtype.kind in "ui" else to_bfloat16_bits(array)
        bits = np.ascontiguousarray(bits)
        bf16 = bfloat16_type()
        space = h5py.h5s.create_simple(bits.shape)
        dataset = h5py.Dataset(h5py.h5d.create(group.id, name.encode(), bf16, space))
        dataset.id.write(h5py.h5s.ALL, h5py.h5s.ALL, bits, mtype=bf16)  # memory type = file type: no conversion
    elif dtype_name in ("float8_e4m3fn", "float8_e5m2"):
        dataset = group.create_dataset(name, data=np.asarray(array, dtype=np.uint8))
    elif dtype_name in NUMPY_DTYPES:
        dataset = group.create_dataset(name, data=np.asarray(array, dtype=NUMPY_DTYPES[dtype_name]))
    else:
        raise ValueError(f"{group.name}/{name}: unknown dtype_name {dtype_name!r} (expected one of "
                         f"{', '.join(['bfloat16', 'float8_e4m3fn', 'float8_e5m2', *NUMPY_DTYPES])})")
    dataset.attrs["dtype_name"] = dtype_name
    return dataset


def write_scalar(group, name, value):
    """k_scale, v_scale, output_scale: 0-d float32 datasets."""
    group[name] = np.float32(value)
    group[name].attrs["dtype_name"] = "float32"


KV_STORAGE = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_per_token_head": "float8_e4m3fn",
              "fp8_e5m2": "float8_e5m2", "int8_per_token_head": "int8"}


def kv_storage_dtype(kv_cache_dtype, dtype):
    """The element type of /inputs/kv_cache (SCHEMA.md §5.2). vLLM's "fp8" is its platform fp8,
    float8_e4m3fn on CUDA; hybridtb's reader reads it as "fp8_e4m3" (harness/src/config.cpp)."""
    if kv_cache_dtype == "auto":
        return dtype
    if kv_cache_dtype not in KV_STORAGE:
        raise ValueError(f"/config kv_cache_dtype: unknown value {kv_cache_dtype!r} (expected auto, "
                         f"{', '.join(KV_STORAGE)})")
    return KV_STORAGE[kv_cache_dtype]


def float_dtype_name(array):
    """The dtype_name of a float numpy array (bfloat16 has no numpy dtype: pass (bits_or_values, "bfloat16"))."""
    names = {"f8": "float64", "f4": "float32", "f2": "float16"}
    key = np.asarray(array).dtype.str[1:]
    if key not in names:
        raise ValueError(f"SSM tensors must be float64, float32, float16 or bfloat16, got {np.asarray(array).dtype}")
    return names[key]


def write_named_tensors(group, tensors):
    """/inputs/ssm/<name> or /weights/<name>: each value a float numpy array or (array, dtype_name)."""
    for name, value in tensors.items():
        array, dtype_name = value if isinstance(value, tuple) else (value, float_dtype_name(value))
        write_tensor(group, name, array, dtype_name)


def write_hybrid_batch(path, config, batch, inputs, provenance=None, ssm=None):
    """config: dict of /config attributes (+ optional "sinks"/"alibi_slopes" arrays; "engine_version",
    e.g. "vllm 0.12.0", since 1.3); batch: dict of /batch arrays + "num_actual_tokens"; inputs: dict
    of /inputs arrays and scalars. An fp8 query (1.3) is passed as (uint8_bytes, "float8_e4m3fn")
    or "float8_e5m2" with the scalar "q_scale": real query = stored value * q_scale;
    ssm (schema 1.1, optional): {"params": {name: int}, "state": {name: array}, "weights": {name: array}}
    with the names config["ssm_mode"] defines (reference/ssm/README.md). State pools are
    [num_slots, ...] and all share num_slots; arrays are float64/32/16 numpy arrays, or
    (values_or_bits, "bfloat16")."""
    ssm = ssm or {}
    query = inputs["query"]
    fp8_query = isinstance(query, tuple) and query[1] in FP8_QUERY
    if fp8_query and "q_scale" not in inputs:
        raise ValueError("/inputs/query: an fp8 query needs /inputs/q_scale (real query = stored value * q_scale)")
    if "q_scale" in inputs and not fp8_query:
        raise ValueError("/inputs/q_scale: only an fp8 /inputs/query has a scale (pass the query as "
                         "(uint8_bytes, 'float8_e4m3fn'))")
    with h5py.File(path, "w") as f:  # default libver (earliest): readable by HDF5 1.8 and later
        f.attrs["schema"] = "hybrid-batch"  # str -> variable-length UTF-8
        # The lowest version that describes the file: 1.1 added the SSM items, 1.3 the fp8 query
        # (+ q_scale) and /config engine_version.
        f.attrs["schema_version"] = "1.3" if fp8_query or "engine_version" in config else \
            "1.1" if any(ssm.values()) else "1.0"
        for key, value in (provenance or {}).items():
            f.attrs[key] = value

        g = f.create_group("config")
        for key, value in config.items():
            if key in ("sinks", "alibi_slopes"):
                write_tensor(g, key, np.asarray(value, dtype="<f4"), "float32")
            elif key == "cudagraph_capture_sizes":
                write_tensor(g, key, value, "int32")
            else:
                g.attrs[key] = value  # int -> int64, float -> float64, str -> UTF-8

        g = f.create_group("batch")
        g.attrs["num_actual_tokens"] = int(batch["num_actual_tokens"])
        for key in ("query_start_loc", "seq_lens", "block_table", "mm_prefix_range", "ssm_block_table",
                    "num_accepted_tokens"):
            if key in batch:
                write_tensor(g, key, batch[key], "int32")
        write_tensor(g, "slot_mapping", batch["slot_mapping"], "int64")

        g = f.create_group("inputs")
        dtype = config["dtype"]
        if fp8_query:  # 1.3: fp8 bytes with their dtype_name; /config dtype stays the model dtype
            write_tensor(g, "query", query[0], query[1])
        else:
            write_tensor(g, "query", query, dtype)
        for key in ("key", "value"):
            write_tensor(g, key, inputs[key], dtype)
        if "kv_cache" in inputs:
            write_tensor(g, "kv_cache", inputs["kv_cache"], kv_storage_dtype(config["kv_cache_dtype"], dtype))
        for key in ("k_scale_cache", "v_scale_cache"):
            if key in inputs:
                write_tensor(g, key, inputs[key], "float32")
        for key in ("k_scale", "v_scale", "output_scale", "q_scale"):
            if key in inputs:
                write_scalar(g, key, inputs[key])

        # The SSM branch (1.1): each item only when there is something to store.
        if ssm.get("params"):
            params = f["config"].create_group("ssm")
            for key, value in ssm["params"].items():
                params.attrs[key] = int(value)  # int -> int64
        if ssm.get("state"):
            write_named_tensors(g.create_group("ssm"), ssm["state"])
        if ssm.get("weights"):
            write_named_tensors(f.create_group("weights"), ssm["weights"])


def example_batch(dtype="bfloat16", kv_cache_dtype="auto", seed=0):
    """Two decodes and a 4-token prefill, 2 CUDA-graph padding rows, 8 KV blocks of 16 tokens."""
    rng = np.random.default_rng(seed)
    num_heads, num_kv_heads, head_size, block_size, num_blocks = 4, 2, 32, 16, 8
    config = {
        "num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_size": head_size, "block_size": block_size,
        "scale": head_size ** -0.5, "sliding_window": 0, "logits_soft_cap": 0.0, "use_alibi_sqrt": 0,
        "dtype": dtype, "kv_cache_dtype": kv_cache_dtype, "attn_type": "decoder", "ssm_mode": "none",
        "mamba_cache_mode": "none", "mamba_block_size": 0, "num_speculative_tokens": 0,
        "cudagraph_mode": "full_and_piecewise", "max_num_seqs": 64,
        "cudagraph_capture_sizes": np.array([1, 2, 4, 8], dtype="<i4"),
        "sinks": rng.standard_normal(num_heads).astype("<f4"),
    }
    # Request r owns query rows [query_start_loc[r], query_start_loc[r+1]); block 0 is the null block.
    seq_lens = np.array([18, 4, 4], dtype="<i4")
    query_start_loc = np.array([0, 1, 2, 6], dtype="<i4")
    block_table = np.array([[2, 5], [7, 0], [3, 0]], dtype="<i4")
    slot_mapping = []
    for r in range(3):
        query_len = query_start_loc[r + 1] - query_start_loc[r]
        for position in range(seq_lens[r] - query_len, seq_lens[r]):
            slot_mapping.append(block_table[r, position // block_size] * block_size + position % block_size)
    slot_mapping += [-1, -1]  # CUDA-graph padding rows
    tokens = len(slot_mapping)
    batch = {"query_start_loc": query_start_loc, "seq_lens": seq_lens, "block_table": block_table,
             "slot_mapping": np.array(slot_mapping, dtype="<i8"), "num_actual_tokens": 6}

    def activations(*shape):
        return rng.standard_normal(shape).astype("<f4")

    inputs = {"query": activations(tokens, num_heads, head_size), "key": activations(tokens, num_kv_heads, head_size),
              "value": activations(tokens, num_kv_heads, head_size), "k_scale": 1.0, "v_scale": 1.0}
    cache_shape = (num_blocks, 2, block_size, num_kv_heads, head_size)
    if kv_cache_dtype == "auto":
        inputs["kv_cache"] = activations(*cache_shape)
    else:  # a captured fp8 cache, as raw bytes; avoid the NaN encodings of e4m3fn (0x7F, 0xFF)
        inputs["kv_cache"] = rng.integers(0, 0x7F, size=cache_shape, dtype=np.uint8)
        inputs["k_scale"], inputs["v_scale"] = 0.5, 0.25
    if dtype != "bfloat16":
        for key in ("query", "key", "value", "kv_cache"):
            if inputs[key].dtype.kind == "f":
                inputs[key] = inputs[key].astype(NUMPY_DTYPES[dtype])
    return config, batch, inputs


def example_ssm(ssm_mode, config, num_slots, seed=0):
    """The SSM items of `ssm_mode` for `example_batch()`'s config (which it updates), or None.

    prefix_sum (reference/ssm/README.md): no params, no weights, one float32 pool `state`
    [num_slots, num_heads, head_size]. Slots are indexed by the state block table (here
    /batch/block_table, whose ids are < num_blocks), so num_slots = num_blocks covers them."""
    if ssm_mode == "none":
        return None
    if ssm_mode != "prefix_sum":
        raise ValueError(f"no example for ssm_mode {ssm_mode!r}")
    config["ssm_mode"] = ssm_mode
    rng = np.random.default_rng(seed + 1)
    state = (0.1 * rng.standard_normal((num_slots, config["num_heads"], config["head_size"]))).astype("<f4")
    return {"params": {}, "state": {"state": state}, "weights": {}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "fp8", "fp8_e4m3", "fp8_e5m2"])
    parser.add_argument("--ssm", default="none", choices=["none", "prefix_sum"],
                        help="also write the SSM branch of this mode (schema 1.1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    config, batch, inputs = example_batch(args.dtype, args.kv_cache_dtype, args.seed)
    num_blocks = inputs["kv_cache"].shape[0]
    ssm = example_ssm(args.ssm, config, num_blocks, args.seed)
    write_hybrid_batch(args.path, config, batch, inputs,
                       provenance={"producer": "write_batch_h5py.py", "seed": args.seed}, ssm=ssm)


if __name__ == "__main__":
    main()
