"""Write hybrid-batch 1.x files with h5py + numpy (schema: datasets/SCHEMA.md).

For capture code. `write_hybrid_batch()` takes plain numpy arrays and stores every item the C++
reader accepts, as the schema asks: the attention inputs with any KV-cache dtype (per-tensor fp8,
per-token-head int8/fp8 with their scale caches), /batch's optional mm_prefix_range,
ssm_block_table and num_accepted_tokens, output_scale, the fp8 query of 1.3, the SSM branch of 1.1
(any mode's params, pools and weights), and the linear-attention layers of 1.2 (layer_kind gdn or
mamba2 with their own inputs). `example_batch()`, `example_ssm()` and `example_linear_layer()` make
small consistent batches of each kind to feed it (every registered SSM mode). The file records the
lowest version that describes it. The hybridtb tests read this module's output with the C++ reader
(tests/io/h5py_interop_test.cpp, tests/python_h5).

    python3 -m hybridtb_h5.writer out.h5 [--dtype bfloat16] [--kv-cache-dtype auto] [--ssm MODE]
                                  [--layer-kind full_attention|gdn|mamba2] [--mm-prefix]
                                  [--num-accepted-tokens] [--output-scale S] [--seed 0]
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


LINEAR_LAYER_KINDS = ("gdn", "mamba2")
# Items of an attention layer's /inputs that a linear-attention layer does not have.
ATTENTION_INPUTS = ("query", "key", "value", "kv_cache", "k_scale_cache", "v_scale_cache", "k_scale", "v_scale",
                    "q_scale", "output_scale")


def write_hybrid_batch(path, config, batch, inputs, provenance=None, ssm=None):
    """config: dict of /config attributes (+ optional "sinks"/"alibi_slopes" arrays; "engine_version",
    e.g. "vllm 0.12.0", since 1.3; "layer_kind", since 1.2); batch: dict of /batch arrays +
    "num_actual_tokens"; inputs: dict of /inputs arrays and scalars. An fp8 query (1.3) is passed
    as (uint8_bytes, "float8_e4m3fn") or "float8_e5m2" with the scalar "q_scale": real query =
    stored value * q_scale. A per-token-head KV cache (kv_cache_dtype int8_per_token_head or
    fp8_per_token_head) needs "k_scale_cache" and "v_scale_cache" (float32 [num_blocks, block_size,
    num_kv_heads]). A linear-attention layer (config["layer_kind"] gdn or mamba2, ssm_mode the same)
    has none of query/key/value/kv_cache/scales: its inputs are its own tensors in /config dtype
    (gdn: mixed_qkv, a, b; mamba2: xBC, dt; SCHEMA.md §6.4);
    ssm (schema 1.1, optional): {"params": {name: int}, "state": {name: array}, "weights": {name: array}}
    with the names config["ssm_mode"] defines (reference/ssm/README.md). State pools are
    [num_slots, ...] and all share num_slots; arrays are float64/32/16 numpy arrays, or
    (values_or_bits, "bfloat16")."""
    ssm = ssm or {}
    kind = config.get("layer_kind", "full_attention")
    if kind != "full_attention":
        return _write_linear_layer(path, config, batch, inputs, provenance, ssm, kind)
    kv_cache_dtype = config["kv_cache_dtype"]
    if kv_cache_dtype.endswith("_per_token_head") and config.get("attn_type", "decoder") == "decoder":
        missing = [k for k in ("k_scale_cache", "v_scale_cache") if k not in inputs]
        if missing:
            raise ValueError(f"/inputs/{missing[0]}: kv_cache_dtype {kv_cache_dtype} needs float32 "
                             "[num_blocks, block_size, num_kv_heads] scale caches k_scale_cache and v_scale_cache")
    query = inputs["query"]
    fp8_query = isinstance(query, tuple) and query[1] in FP8_QUERY
    if fp8_query and "q_scale" not in inputs:
        raise ValueError("/inputs/query: an fp8 query needs /inputs/q_scale (real query = stored value * q_scale)")
    if "q_scale" in inputs and not fp8_query:
        raise ValueError("/inputs/q_scale: only an fp8 /inputs/query has a scale (pass the query as "
                         "(uint8_bytes, 'float8_e4m3fn'))")
    with h5py.File(path, "w") as f:  # default libver (earliest): readable by HDF5 1.8 and later
        _write_root_config_batch(f, config, batch, provenance, fp8_query, ssm)
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

        _write_ssm(f, g, ssm)


def _write_root_config_batch(f, config, batch, provenance, fp8_query, ssm):
    f.attrs["schema"] = "hybrid-batch"  # str -> variable-length UTF-8
    # The lowest version that describes the file: 1.1 added the SSM items, 1.2 layer_kind, 1.3 the
    # fp8 query (+ q_scale) and /config engine_version, 1.4 tensor-parallel rank files (tp_size > 1).
    f.attrs["schema_version"] = "1.4" if int(config.get("tp_size", 1)) > 1 else \
        "1.3" if fp8_query or "engine_version" in config else \
        "1.2" if "layer_kind" in config else \
        "1.1" if any(ssm.values()) or config.get("ssm_mode", "none") != "none" else "1.0"
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


def _write_ssm(f, inputs_group, ssm):
    """The SSM branch (1.1) or a linear layer's core: each item only when there is something to store."""
    if ssm.get("params"):
        params = f["config"].create_group("ssm")
        for key, value in ssm["params"].items():
            params.attrs[key] = int(value)  # int -> int64
    if ssm.get("state"):
        write_named_tensors(inputs_group.create_group("ssm"), ssm["state"])
    if ssm.get("weights"):
        write_named_tensors(f.create_group("weights"), ssm["weights"])


def _write_linear_layer(path, config, batch, inputs, provenance, ssm, kind):
    """A linear-attention layer (1.2): its own inputs [T, width] in /config dtype, no attention items."""
    if kind not in LINEAR_LAYER_KINDS:
        raise ValueError(f"/config layer_kind: unknown value {kind!r} (expected full_attention, "
                         f"{', '.join(LINEAR_LAYER_KINDS)})")
    if config.get("ssm_mode") != kind:
        raise ValueError(f"/config ssm_mode {config.get('ssm_mode')!r} must equal layer_kind {kind!r}")
    present = [name for name in ATTENTION_INPUTS if name in inputs]
    if present:
        raise ValueError(f"/inputs/{present[0]}: layer_kind {kind} is a linear-attention layer, which has no "
                         f"{present[0]} (its inputs are {'mixed_qkv, a, b' if kind == 'gdn' else 'xBC, dt'})")
    with h5py.File(path, "w") as f:
        _write_root_config_batch(f, config, batch, provenance, False, ssm)
        g = f.create_group("inputs")
        for name, array in inputs.items():
            write_tensor(g, name, array, config["dtype"])
        _write_ssm(f, g, ssm)


def example_batch(dtype="bfloat16", kv_cache_dtype="auto", seed=0, mm_prefix=False, num_accepted_tokens=False,
                  output_scale=None):
    """Two decodes and a 4-token prefill, 2 CUDA-graph padding rows, 8 KV blocks of 16 tokens.

    kv_cache_dtype: auto, a per-tensor fp8 (fp8, fp8_e4m3, fp8_e5m2: raw bytes with k/v scales) or
    per-token-head (int8_per_token_head, fp8_per_token_head: bytes plus float32 scale caches).
    mm_prefix: the prefill's positions 1..2 are one bidirectional range (/batch/mm_prefix_range).
    num_accepted_tokens: one speculative token (num_speculative_tokens 1) and
    /batch/num_accepted_tokens. output_scale: a float, stored as /inputs/output_scale."""
    rng = np.random.default_rng(seed)
    num_heads, num_kv_heads, head_size, block_size, num_blocks = 4, 2, 32, 16, 8
    config = {
        "num_heads": num_heads, "num_kv_heads": num_kv_heads, "head_size": head_size, "block_size": block_size,
        "scale": head_size ** -0.5, "sliding_window": 0, "logits_soft_cap": 0.0, "use_alibi_sqrt": 0,
        "dtype": dtype, "kv_cache_dtype": kv_cache_dtype, "attn_type": "decoder", "ssm_mode": "none",
        "mamba_cache_mode": "none", "mamba_block_size": 0, "num_speculative_tokens": 1 if num_accepted_tokens else 0,
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
    if mm_prefix:  # [R, M, 2] inclusive absolute positions; (0, 0) = no range
        batch["mm_prefix_range"] = np.array([[[0, 0]], [[0, 0]], [[1, 2]]], dtype="<i4")
    if num_accepted_tokens:
        batch["num_accepted_tokens"] = np.array([1, 2, 1], dtype="<i4")

    def activations(*shape):
        return rng.standard_normal(shape).astype("<f4")

    inputs = {"query": activations(tokens, num_heads, head_size), "key": activations(tokens, num_kv_heads, head_size),
              "value": activations(tokens, num_kv_heads, head_size), "k_scale": 1.0, "v_scale": 1.0}
    cache_shape = (num_blocks, 2, block_size, num_kv_heads, head_size)
    if kv_cache_dtype == "auto":
        inputs["kv_cache"] = activations(*cache_shape)
    elif kv_cache_dtype == "int8_per_token_head":
        inputs["kv_cache"] = rng.integers(-127, 128, size=cache_shape, dtype=np.int8)
    else:  # a captured fp8 cache, as raw bytes: positive finite values only (e4m3fn's 0x7F is NaN,
        # e5m2's 0x7C is infinity and 0x7D-0x7F NaN)
        finite_end = 0x7C if KV_STORAGE[kv_cache_dtype] == "float8_e5m2" else 0x7F
        inputs["kv_cache"] = rng.integers(0, finite_end, size=cache_shape, dtype=np.uint8)
        inputs["k_scale"], inputs["v_scale"] = 0.5, 0.25
    if kv_cache_dtype.endswith("_per_token_head"):  # one positive scale per (block, offset, kv head)
        for name in ("k_scale_cache", "v_scale_cache"):
            inputs[name] = rng.uniform(0.01, 0.05, size=(num_blocks, block_size, num_kv_heads)).astype("<f4")
    if output_scale is not None:
        inputs["output_scale"] = float(output_scale)
    if dtype != "bfloat16":
        for key in ("query", "key", "value", "kv_cache"):
            if inputs[key].dtype.kind == "f":
                inputs[key] = inputs[key].astype(NUMPY_DTYPES[dtype])
    return config, batch, inputs


SSM_MODES = ("zero", "prefix_sum_flat", "prefix_sum", "ema", "mamba1")


def example_ssm(ssm_mode, config, num_slots, seed=0):
    """The SSM items of `ssm_mode` for `example_batch()`'s config (which it updates), or None.

    Every mode of the reference's parallel branch (reference/ssm/README.md), with its names and
    shapes; H = num_heads * head_size is the query row viewed flat:
      zero, prefix_sum_flat  no params, pools or weights
      prefix_sum  pool state [num_slots, num_heads, head_size]
      ema         pool state [num_slots, H]; weight a [H] in (0, 1)
      mamba1      params intermediate_size I, state_size N, conv_kernel K, dt_rank R; pools
                  conv_state [num_slots, I, K-1], ssm_state [num_slots, I, N]; weights in_proj
                  [2I, H], conv1d_weight [I, K], x_proj [R+2N, I], dt_proj [I, R], dt_proj_bias [I],
                  A_log [I, N], D [I], out_proj [H, I] (the optional biases left out)
    Slots are indexed by the state block table (here /batch/block_table, whose ids are <
    num_blocks), so num_slots = num_blocks covers them."""
    if ssm_mode == "none":
        return None
    if ssm_mode not in SSM_MODES:
        raise ValueError(f"--ssm: no example for ssm_mode {ssm_mode!r} (expected none, {', '.join(SSM_MODES)}; "
                         "gdn and mamba2 are layer kinds: --layer-kind)")
    config["ssm_mode"] = ssm_mode
    rng = np.random.default_rng(seed + 1)
    heads, head_size = config["num_heads"], config["head_size"]
    hidden = heads * head_size

    def normal(shape, std=1.0):
        return (std * rng.standard_normal(shape)).astype("<f4")

    def uniform(shape, low, high):
        return rng.uniform(low, high, size=shape).astype("<f4")

    if ssm_mode in ("zero", "prefix_sum_flat"):
        return {"params": {}, "state": {}, "weights": {}}
    if ssm_mode == "prefix_sum":
        return {"params": {}, "state": {"state": normal((num_slots, heads, head_size), 0.1)}, "weights": {}}
    if ssm_mode == "ema":
        return {"params": {}, "state": {"state": normal((num_slots, hidden), 0.1)},
                "weights": {"a": uniform((hidden,), 0.5, 0.99)}}
    i, n, k, r = 8, 4, 4, 2  # mamba1, scaled down
    return {
        "params": {"intermediate_size": i, "state_size": n, "conv_kernel": k, "dt_rank": r},
        "state": {"conv_state": normal((num_slots, i, k - 1)), "ssm_state": normal((num_slots, i, n))},
        "weights": {"in_proj": normal((2 * i, hidden), hidden ** -0.5), "conv1d_weight": normal((i, k), k ** -0.5),
                    "x_proj": normal((r + 2 * n, i), i ** -0.5), "dt_proj": normal((i, r), r ** -0.5),
                    "dt_proj_bias": uniform((i,), -6.9, -2.25), "A_log": uniform((i, n), 0.0, np.log(16.0)),
                    "D": uniform((i,), 0.5, 1.5), "out_proj": normal((hidden, i), i ** -0.5)},
    }


def example_linear_layer(layer_kind, dtype="bfloat16", seed=0):
    """A linear-attention layer (1.2) on example_batch()'s batch: (config, batch, inputs, ssm).

      gdn     params num_k_heads Hk, num_v_heads Hv, head_k_dim dk, head_v_dim dv, conv_kernel K;
              inputs mixed_qkv [T, 2*Hk*dk + Hv*dv], a [T, Hv], b [T, Hv]; pools conv_state
              [slots, conv_dim, K-1], recurrent_state [slots, Hv, dv, dk]; weights conv1d_weight
              [conv_dim, K], A_log [Hv], dt_bias [Hv]
      mamba2  params num_ssm_heads Hs, head_dim P, state_size N, n_groups G, conv_kernel K; inputs
              xBC [T, Hs*P + 2*G*N], dt [T, Hs]; pools conv_state [slots, conv_dim, K-1], ssm_state
              [slots, Hs, P, N]; weights conv1d_weight [conv_dim, K], dt_bias, A_log, D [Hs]
    The attention attributes stay those of the model's attention layers (the step's metadata is
    built once for all layers); the layer itself has no query, key, value or KV cache."""
    if layer_kind not in LINEAR_LAYER_KINDS:
        raise ValueError(f"--layer-kind: expected full_attention, {', '.join(LINEAR_LAYER_KINDS)}; got {layer_kind!r}")
    config, batch, _ = example_batch(dtype, "auto", seed)
    config.update({"layer_kind": layer_kind, "ssm_mode": layer_kind})
    del config["sinks"]
    rng = np.random.default_rng(seed + 2)
    tokens, slots, k = len(batch["slot_mapping"]), 8, 4

    def normal(shape, std=1.0):
        return (std * rng.standard_normal(shape)).astype("<f4")

    if layer_kind == "gdn":
        hk, hv, dk, dv = 2, 4, 16, 16
        conv_dim = 2 * hk * dk + hv * dv
        params = {"num_k_heads": hk, "num_v_heads": hv, "head_k_dim": dk, "head_v_dim": dv, "conv_kernel": k}
        inputs = {"mixed_qkv": normal((tokens, conv_dim)), "a": normal((tokens, hv)), "b": normal((tokens, hv))}
        state = {"conv_state": normal((slots, conv_dim, k - 1)), "recurrent_state": normal((slots, hv, dv, dk), 0.1)}
        weights = {"conv1d_weight": normal((conv_dim, k), k ** -0.5),
                   "A_log": rng.uniform(0.0, np.log(16.0), hv).astype("<f4"), "dt_bias": normal((hv,), 0.1)}
    else:
        hs, p, n, g = 4, 16, 8, 1
        conv_dim = hs * p + 2 * g * n
        params = {"num_ssm_heads": hs, "head_dim": p, "state_size": n, "n_groups": g, "conv_kernel": k}
        inputs = {"xBC": normal((tokens, conv_dim)), "dt": normal((tokens, hs))}
        state = {"conv_state": normal((slots, conv_dim, k - 1)), "ssm_state": normal((slots, hs, p, n), 0.1)}
        weights = {"conv1d_weight": normal((conv_dim, k), k ** -0.5), "dt_bias": normal((hs,), 0.1),
                   "A_log": rng.uniform(0.0, np.log(16.0), hs).astype("<f4"),
                   "D": rng.uniform(0.5, 1.5, hs).astype("<f4")}
    if dtype != "bfloat16":
        inputs = {name: array.astype(NUMPY_DTYPES[dtype]) for name, array in inputs.items()}
    return config, batch, inputs, {"params": params, "state": state, "weights": weights}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", *KV_STORAGE])
    parser.add_argument("--ssm", default="none", choices=["none", *SSM_MODES],
                        help="also write the SSM branch of this mode (schema 1.1)")
    parser.add_argument("--layer-kind", default="full_attention", choices=["full_attention", *LINEAR_LAYER_KINDS],
                        help="gdn or mamba2: a linear-attention layer with its own inputs (schema 1.2)")
    parser.add_argument("--mm-prefix", action="store_true", help="write /batch/mm_prefix_range")
    parser.add_argument("--num-accepted-tokens", action="store_true",
                        help="write /batch/num_accepted_tokens (with num_speculative_tokens 1)")
    parser.add_argument("--output-scale", type=float, help="write /inputs/output_scale (fp8 output)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    provenance = {"producer": "write_batch_h5py.py", "seed": args.seed}
    if args.layer_kind != "full_attention":
        if args.ssm != "none" or args.kv_cache_dtype != "auto" or args.mm_prefix or args.num_accepted_tokens or \
                args.output_scale is not None:
            parser.error(f"--layer-kind {args.layer_kind} takes only --dtype and --seed (a linear-attention layer "
                         "has no attention inputs or SSM branch of its own)")
        config, batch, inputs, ssm = example_linear_layer(args.layer_kind, args.dtype, args.seed)
        write_hybrid_batch(args.path, config, batch, inputs, provenance=provenance, ssm=ssm)
        return
    config, batch, inputs = example_batch(args.dtype, args.kv_cache_dtype, args.seed, args.mm_prefix,
                                          args.num_accepted_tokens, args.output_scale)
    num_blocks = inputs["kv_cache"].shape[0]
    ssm = example_ssm(args.ssm, config, num_blocks, args.seed)
    write_hybrid_batch(args.path, config, batch, inputs, provenance=provenance, ssm=ssm)


if __name__ == "__main__":
    main()
