#!/usr/bin/env python3
"""Golden batches from vLLM's own Triton kernels: /expected computed by vLLM, not by our reference.

    python3 experiments/peers/vllm_golden.py prepare BATCH.h5 [--k-scale S --v-scale S]
    python3 experiments/peers/vllm_golden.py run --vllm /path/to/vllm-X.Y.Z RECORDED.h5 --out GOLDEN.h5

`prepare` rewrites, in place, block 0 of /inputs/kv_cache (and of the scale caches) to
zero bytes. `hybridtb gen` fills vLLM's null block with NaN to prove that a backend never reads
it; vLLM itself allocates the whole KV cache with torch.zeros (vllm/v1/worker/utils.py
allocate_kv_cache) and never writes block 0, so in a real server the null block holds zeros.
vLLM's kernel does load out-of-window and past-the-end keys of a tile it partly needs and
multiplies their V rows by zero probabilities, so NaN there would turn its output into NaN (see the
README's semantics section); a golden batch must hold what vLLM can meet.

`run` takes a batch that `hybridtb record --backend reference` has recorded (its /expected carries
the builders' metadata, which vLLM's kernels take as inputs: the split-K threshold and segment
count), runs vLLM's KV-cache write and unified attention on the GPU on exactly the stored inputs
(bits uploaded as stored, nothing regenerated), as vLLM's TritonAttentionImpl calls them, and writes
GOLDEN.h5: the input file's /config, /batch, /inputs (and root attributes), and /expected with
vLLM's output (= attn_output: no SSM branch), the KV cache after the write and the scale caches
(per-token-head modes), the metadata group copied from the recorded /expected, and the attribute
backend = "vllm <version> triton_unified_attention". Root attributes record the vLLM version and
kernel files, torch, triton, the GPU, the UTC date and the command.

Reads and writes raw bits (bfloat16 through its HDF5 type with no conversion, fp8 as bytes), so
the uploaded inputs and the stored results are exactly the bytes of the device tensors.
"""
import argparse
import datetime
import os
import shlex
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "harness", "scripts"))

from write_batch_h5py import bfloat16_type, write_tensor  # noqa: E402

RAW = {"float64": "<f8", "float32": "<f4", "float16": "<f2", "bfloat16": "<i2", "float8_e4m3fn": "u1",
       "float8_e5m2": "u1", "int8": "i1", "int32": "<i4", "int64": "<i8"}


def dtype_name(dataset):
    name = dataset.attrs["dtype_name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def read_raw(dataset):
    """The stored elements as a numpy array of RAW[dtype_name] (bfloat16 as int16 bit patterns)."""
    name = dtype_name(dataset)
    out = np.empty(dataset.shape, dtype=RAW[name])
    if out.size == 0:
        return out
    if name == "bfloat16":
        dataset.id.read(h5py.h5s.ALL, h5py.h5s.ALL, out.view("<u2"), mtype=bfloat16_type())
    else:
        dataset.id.read(h5py.h5s.ALL, h5py.h5s.ALL, out)
    return out


def to_torch(array, name, device):
    import torch

    t = torch.from_numpy(np.ascontiguousarray(array)).to(device)
    views = {"bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2}
    return t.view(views[name]) if name in views else t


def to_numpy(t, name):
    import torch

    t = t.detach().contiguous().cpu()
    if name == "bfloat16":
        return t.view(torch.int16).numpy().view("<u2")
    if name in ("float8_e4m3fn", "float8_e5m2"):
        return t.view(torch.uint8).numpy()
    return t.numpy()


def attr_str(value):
    return value.decode() if isinstance(value, bytes) else str(value)


# ------------------------------------------------------------------------------------------------
def prepare(path, k_scale=None, v_scale=None):
    """Block 0 of the KV cache and the scale caches set to zero bytes, in place; optionally the
    per-tensor fp8 scales /inputs/k_scale, v_scale set (gen writes 1: the stored cache bytes stay,
    their dequantised values become stored · scale)."""
    with h5py.File(path, "r+") as f:
        for name, value in (("k_scale", k_scale), ("v_scale", v_scale)):
            if value is None:
                continue
            if name in f["inputs"]:
                del f["inputs"][name]
            f["inputs"][name] = np.float32(value)
            f["inputs"][name].attrs["dtype_name"] = "float32"
        changed = []
        for name in ("kv_cache", "k_scale_cache", "v_scale_cache"):
            if name not in f["inputs"]:
                continue
            d = f["inputs"][name]
            data = read_raw(d)
            before = data[0].copy()
            data[0] = 0
            if dtype_name(d) == "bfloat16":
                d.id.write(h5py.h5s.ALL, h5py.h5s.ALL, data.view("<u2"), mtype=bfloat16_type())
            else:
                d.id.write(h5py.h5s.ALL, h5py.h5s.ALL, data)
            changed.append(f"{name}: {int(np.count_nonzero(before.view(np.uint8)))} nonzero bytes zeroed")
        f.attrs["null_block"] = ("zeroed after generation: vLLM allocates the KV cache with torch.zeros and never "
                                 "writes block 0")
    scales = f"; k_scale {k_scale}, v_scale {v_scale}" if k_scale is not None or v_scale is not None else ""
    print(f"{path}: " + "; ".join(changed) + scales)


# ------------------------------------------------------------------------------------------------
def run(args):
    import torch
    import triton

    from vllm_kernels import load

    kernels = load(args.vllm)
    device = "cuda"
    with h5py.File(args.batch, "r") as f:
        c = f["config"].attrs
        config = {k: (attr_str(v) if isinstance(v, (bytes, str)) else v) for k, v in c.items()}
        if config.get("attn_type", "decoder") != "decoder":
            raise SystemExit(f"{args.batch}: attn_type {config['attn_type']}: vLLM runs encoder-only layers through "
                             "another kernel (context_attention_fwd)")
        if config.get("ssm_mode", "none") != "none" or config.get("layer_kind", "full_attention") != "full_attention":
            raise SystemExit(f"{args.batch}: only plain attention layers (ssm_mode none)")
        if "expected" not in f or "metadata" not in f["expected"]:
            raise SystemExit(f"{args.batch}: record it first (hybridtb record --backend reference): the builders' "
                             "metadata feeds vLLM's kernel")
        inputs = f["inputs"]
        if "output_scale" in inputs:
            raise SystemExit(f"{args.batch}: fp8 output is not generated here")
        batch = f["batch"]
        qsl = batch["query_start_loc"][()].astype(np.int32)
        seq_lens = batch["seq_lens"][()].astype(np.int32)
        block_table = batch["block_table"][()].astype(np.int32)
        slot_mapping = batch["slot_mapping"][()].astype(np.int64)
        num_actual = int(batch.attrs["num_actual_tokens"])
        mm_prefix = batch["mm_prefix_range"][()].astype(np.int32) if "mm_prefix_range" in batch else None
        names = {k: dtype_name(inputs[k]) for k in inputs if isinstance(inputs[k], h5py.Dataset)}
        raw = {k: read_raw(inputs[k]) for k in names}
        meta = f["expected"]["metadata"]["attention"].attrs
        seq_threshold_3d = int(meta["seq_threshold_3d"])
        segments = int(meta["num_par_softmax_segments"])
        alibi = f["config"]["alibi_slopes"][()].astype(np.float32) if "alibi_slopes" in f["config"] else None
        sinks = f["config"]["sinks"][()].astype(np.float32) if "sinks" in f["config"] else None

    kv_dtype = config["kv_cache_dtype"]
    if kv_dtype == "fp8":
        kv_dtype = "fp8_e4m3"
    model = config["dtype"]
    q = to_torch(raw["query"], names["query"], device)
    k = to_torch(raw["key"], names["key"], device)
    v = to_torch(raw["value"], names["value"], device)
    kv_name = names["kv_cache"]
    kv_cache = to_torch(raw["kv_cache"], kv_name, device)  # [NB, 2, BS, Hkv, D]
    key_cache, value_cache = kv_cache[:, 0], kv_cache[:, 1]  # [NB, BS, Hkv, D] views, as vLLM splits its cache
    scalar = lambda name: torch.tensor([float(np.asarray(raw[name]).reshape(-1)[0]) if name in raw else 1.0],
                                       dtype=torch.float32, device=device)
    k_scale, v_scale = scalar("k_scale"), scalar("v_scale")
    k_scale_cache = to_torch(raw["k_scale_cache"], "float32", device) if "k_scale_cache" in raw else None
    v_scale_cache = to_torch(raw["v_scale_cache"], "float32", device) if "v_scale_cache" in raw else None
    slots = torch.from_numpy(slot_mapping).to(device)

    kernels.write_kv(k, v, key_cache, value_cache, slots, kv_dtype, k_scale, v_scale, k_scale_cache, v_scale_cache)

    tokens = q.shape[0]
    out = torch.full_like(q, float("nan"))  # padding rows (>= num_actual_tokens) stay NaN
    query_lens = np.diff(qsl)
    kernels.attention(
        q[:num_actual], key_cache, value_cache, out[:num_actual],
        cu_seqlens_q=torch.from_numpy(qsl).to(device), max_seqlen_q=int(query_lens.max(initial=0)),
        seqused_k=torch.from_numpy(seq_lens).to(device), max_seqlen_k=int(seq_lens.max(initial=0)),
        softmax_scale=float(config["scale"]), window=int(config["sliding_window"]),
        block_table=torch.from_numpy(block_table).to(device), softcap=float(config["logits_soft_cap"]),
        k_scale=k_scale, v_scale=v_scale, kv_cache_dtype=kv_dtype,
        alibi_slopes=torch.from_numpy(alibi).to(device) if alibi is not None else None,
        use_alibi_sqrt=bool(int(config.get("use_alibi_sqrt", 0))),
        sinks=torch.from_numpy(sinks).to(device) if sinks is not None else None,
        mm_prefix_range=torch.from_numpy(mm_prefix).to(device) if mm_prefix is not None else None,
        k_scale_cache=k_scale_cache, v_scale_cache=v_scale_cache,
        seq_threshold_3d=seq_threshold_3d, num_par_softmax_segments=segments)
    torch.cuda.synchronize()

    out_np = to_numpy(out, model)
    real = out[:num_actual].float()
    nan_rows = int(torch.isnan(real).any(dim=-1).any(dim=-1).sum())
    print(f"{args.batch}: {kernels.describe()}: {tokens} token rows ({num_actual} real), "
          f"{nan_rows} real rows with NaN, max |out| {float(real.nan_to_num().abs().max()) if real.numel() else 0:.4g}")
    if args.out is None:
        return 0 if nan_rows == 0 else 1

    tmp = args.out + ".tmp"
    with h5py.File(args.batch, "r") as src, h5py.File(tmp, "w", track_order=True) as dst:
        for key, value in src.attrs.items():
            if key != "backend":
                dst.attrs[key] = value
        for group in ("config", "batch", "inputs", "weights"):
            if group in src:
                src.copy(src[group], dst, group)
        prop = torch.cuda.get_device_properties(0)
        dst.attrs["vllm_version"] = str(kernels.version)
        dst.attrs["vllm_kernel_files"] = ", ".join(kernels.source_files)
        dst.attrs["torch"] = str(torch.__version__)
        dst.attrs["triton"] = str(triton.__version__)
        dst.attrs["cuda"] = str(torch.version.cuda)
        dst.attrs["gpu"] = str(prop.name)
        dst.attrs["date"] = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
        dst.attrs["golden_command"] = args.command or "python3 experiments/peers/vllm_golden.py " + " ".join(
            shlex.quote(a) for a in sys.argv[1:])
        e = dst.create_group("expected")
        e.attrs["backend"] = kernels.describe()
        e.attrs["metadata_source"] = "hybridtb reference builders (inputs of vLLM's kernel: split-K threshold, segments)"
        write_tensor(e, "output", out_np, model)
        write_tensor(e, "attn_output", out_np, model)
        write_tensor(e, "kv_cache", to_numpy(kv_cache, kv_name), kv_name)
        if k_scale_cache is not None:
            write_tensor(e, "k_scale_cache", to_numpy(k_scale_cache, "float32"), "float32")
            write_tensor(e, "v_scale_cache", to_numpy(v_scale_cache, "float32"), "float32")
        src.copy(src["expected"]["metadata"], e, "metadata")
    os.replace(tmp, args.out)
    print(f"wrote {args.out}")
    return 0 if nan_rows == 0 else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    z = sub.add_parser("prepare", help="zero block 0 of the KV cache (and scale caches), in place")
    z.add_argument("batch")
    z.add_argument("--k-scale", type=float, help="set /inputs/k_scale (per-tensor fp8)")
    z.add_argument("--v-scale", type=float, help="set /inputs/v_scale (per-tensor fp8)")
    r = sub.add_parser("run", help="run vLLM's kernels on a recorded batch and write the golden file")
    r.add_argument("batch")
    r.add_argument("--vllm", required=True, help="unpacked vLLM release (the folder holding vllm/)")
    r.add_argument("--out", help="golden file to write (none: only report)")
    r.add_argument("--command", help="the command line to record as golden_command")
    args = parser.parse_args()
    if args.what == "prepare":
        prepare(args.batch, args.k_scale, args.v_scale)
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
