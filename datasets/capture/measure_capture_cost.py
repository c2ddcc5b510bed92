#!/usr/bin/env python3
"""Measure what capturing costs per step: time of a captured forward vs the forward alone, and
bytes per file. Needs torch (CUDA for meaningful numbers); h5py + numpy.

    python3 datasets/capture/measure_capture_cost.py [--json cost.json] [--repeats 5]
        [--case 'llama3-8b:d64@4k'] [--forward my_module:my_forward] [--num-blocks 20000]

Each case builds vLLM-0.12-shaped engine objects (the classes of the vllm-0.12.0 contract, a
[NB, 2, BS, Hkv, D] bf16 cache of --num-blocks blocks, random activations, a batch from the mix)
on the GPU, installs the capture hook on the fake TritonAttentionImpl (or HybridAttentionImpl with
a Mamba-1 adapter for hymba-small) and times, with torch.cuda.synchronize() around each call:
the forward alone (capture off) and a captured step (capture on, every step, file written and
deleted after each repeat). The default forward writes the keys and values into the cache at the
slot mapping and copies the query into the output (a stand-in whose own cost is small, so the
difference is the capture's); `--forward module:function` supplies a real one with vLLM's
signature (self, layer, query, key, value, kv_cache, attn_metadata, output=None, ...).
Prints one line per case and, with --json, writes them as a JSON list.
"""
import argparse
import importlib
import json
import os
import re
import shutil
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "capture"))

PRESETS = {  # num_heads, num_kv_heads, head_size, mamba1 (I, N, K, R) or None
    "llama3-8b": (32, 8, 128, None),
    "hymba-small": (25, 5, 64, (3200, 16, 4, 100)),
}
DEFAULT_CASES = ["llama3-8b:d64@4k", "llama3-8b:p1x2k", "llama3-8b:d32@8k+p2x1k", "hymba-small:d64@4k"]
BLOCK_SIZE = 16


def parse_mix(mix):
    """[(query_len, context)] per request, decodes first (vLLM's order)."""
    reqs = []
    for term in mix.split("+"):
        k = lambda s: int(float(s[:-1]) * 1024) if s.endswith("k") else int(s)  # noqa: E731
        m = re.fullmatch(r"d(\d+)@(\w+)", term)
        if m:
            reqs += [(1, k(m.group(2)))] * int(m.group(1))
            continue
        m = re.fullmatch(r"p(\d+)x(\w+)", term)
        if m:
            reqs += [(k(m.group(2)), 0)] * int(m.group(1))
            continue
        m = re.fullmatch(r"c(\d+)x(\w+)@(\w+)", term)
        if m:
            reqs += [(k(m.group(2)), k(m.group(3)))] * int(m.group(1))
            continue
        raise SystemExit(f"--case: cannot parse mix term {term!r} (dN@C, pNxL, cNxL@C)")
    return sorted(reqs, key=lambda r: r[0] > 1)


def build_case(torch, fe, preset, mix, num_blocks, device, forward_fn):
    hq, hkv, d, mamba = PRESETS[preset]
    reqs = parse_mix(mix)
    rng = np.random.default_rng(0)
    need = [-(-(q + c) // BLOCK_SIZE) for q, c in reqs]
    if sum(need) + 1 > num_blocks:
        raise SystemExit(f"{preset}:{mix} needs {sum(need) + 1} blocks; raise --num-blocks")
    ids = 1 + rng.permutation(num_blocks - 1)[: sum(need)]
    table = np.zeros((len(reqs), max(need)), np.int32)
    slots, qsl, pos = [], [0], 0
    for r, ((q, c), n) in enumerate(zip(reqs, need)):
        table[r, :n] = ids[pos:pos + n]
        pos += n
        for p in range(c, c + q):
            slots.append(int(table[r, p // BLOCK_SIZE]) * BLOCK_SIZE + p % BLOCK_SIZE)
        qsl.append(qsl[-1] + q)
    T = qsl[-1]
    c = fe.contract("vllm-0.12.0")
    t = c["triton"]
    mod = fe._module(t["module"])
    md_cls = fe._metadata_class("TritonAttentionMetadata", t["metadata_fields"], t["module"])

    def stand_in(args):
        """reshape_and_cache in plain torch (slot -> block, offset) and output = query."""
        kv, sm = args["kv_cache"], args["attn_metadata"].slot_mapping
        n = sm.shape[0]
        blocks, offsets = sm // BLOCK_SIZE, sm % BLOCK_SIZE
        kv[blocks, 0, offsets] = args["key"][:n]
        kv[blocks, 1, offsets] = args["value"][:n]
        args["output"].copy_(args["query"])
        return args["output"]

    body = (lambda args: forward_fn(**args)) if forward_fn else stand_in
    impl_cls = type("TritonAttentionImpl", (), {"forward": fe._forward_function(t["forward_signature"], body)})
    mod.TritonAttentionImpl, mod.TritonAttentionMetadata = impl_cls, md_cls
    sys.modules["vllm"].__version__ = c["version"]
    impl = object.__new__(impl_cls)
    impl.num_heads, impl.num_kv_heads, impl.head_size, impl.scale = hq, hkv, d, d ** -0.5
    impl.sliding_window, impl.kv_cache_dtype, impl.logits_soft_cap = (-1, -1), "auto", 0.0
    impl.alibi_slopes = impl.sinks = impl.kv_sharing_target_layer_name = None
    impl.attn_type = "decoder"
    bf16 = torch.bfloat16
    kv = torch.randn(num_blocks, 2, BLOCK_SIZE, hkv, d, dtype=bf16, device=device)
    i32 = lambda a: torch.as_tensor(np.asarray(a, np.int32), device=device)  # noqa: E731
    seq_lens = [q + c for q, c in reqs]
    md = md_cls(**{f.name: None for f in __import__("dataclasses").fields(md_cls)})
    md.num_actual_tokens, md.max_query_len, md.max_seq_len = T, max(q for q, _ in reqs), max(seq_lens)
    md.query_start_loc, md.seq_lens, md.block_table = i32(qsl), i32(seq_lens), i32(table)
    md.slot_mapping = torch.as_tensor(np.asarray(slots, np.int64), device=device)
    md.use_cascade, md.common_prefix_len = False, 0
    one = torch.ones(1, dtype=torch.float32, device=device)
    layer = type("Layer", (), {})()
    layer.layer_name, layer._k_scale, layer._v_scale, layer._q_scale = "model.layers.0.self_attn.attn", one, one, one
    args = dict(query=torch.randn(T, hq, d, dtype=bf16, device=device), key=torch.randn(T, hkv, d, dtype=bf16,
                device=device), value=torch.randn(T, hkv, d, dtype=bf16, device=device), kv_cache=kv)
    output = torch.empty(T, hq, d, dtype=bf16, device=device)
    kind = "triton"
    if mamba:
        kind = "hybrid"
        I, N, K, R = mamba
        H = hq * d
        lin = lambda o, i, bias=True: type("Linear", (), {"weight": torch.randn(o, i, device=device) * 0.01,  # noqa
                                                          "bias": torch.zeros(o, device=device) if bias else None})()
        adapter = type("Adapter", (), {})()
        adapter.ssm_mode = "benchmark"
        adapter.in_proj, adapter.x_proj = lin(2 * I, H), lin(R + 2 * N, I, False)
        adapter.dt_proj, adapter.out_proj = lin(I, R), lin(H, I)
        adapter.conv1d = type("Conv", (), {"weight": torch.randn(I, 1, K, device=device), "bias": torch.zeros(I, device=device)})()
        adapter.A = -torch.rand(I, N, device=device) - 0.1
        adapter.D = torch.ones(I, device=device)
        adapter.kv_cache = [(torch.randn(num_blocks, K - 1, I, dtype=bf16, device=device),
                             torch.randn(num_blocks, I, N, dtype=torch.float32, device=device))]
        adapter.forward_history_branch_decode = lambda h, attn_metadata=None: torch.zeros_like(h)
        layer.ssm_adapter = adapter
        hmod = fe._module("vllm.v1.attention.backends.hybrid_attn")
        inner = impl

        def hybrid_body(a):
            inner.forward(a["layer"], a["query"], a["key"], a["value"], a["kv_cache"], a["attn_metadata"].triton_metadata,
                          output=a["output"])
            n = a["attn_metadata"].num_actual_tokens
            a["output"][:n] += a["layer"].ssm_adapter.forward_history_branch_decode(a["query"][:n])
            return a["output"]
        seed = fe.contract("seed-hybrid")
        hcls = type("HybridAttentionImpl", (), {"forward": fe._forward_function(seed["hybrid"]["forward_signature"],
                                                                                 hybrid_body)})
        hmod.HybridAttentionImpl = hcls
        himpl = object.__new__(hcls)
        himpl.__dict__.update(impl.__dict__)
        himpl._triton_impl = impl
        mmd = type("Mamba1AttentionMetadata", (), {"num_decodes": sum(q == 1 for q, _ in reqs)})()
        hmd = type("HybridAttentionMetadata", (), {})()
        hmd.triton_metadata, hmd.mamba_metadata, hmd.num_actual_tokens = md, mmd, T
        return kind, himpl, layer, args, hmd, output
    return kind, impl, layer, args, md, output


def timed(torch, fn, repeats, device):
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", action="append", help="PRESET:MIX (default: the README table's cases)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--num-blocks", type=int, default=20000, help="KV-cache blocks in the engine's cache")
    p.add_argument("--forward", help="module:function with vLLM's forward signature (default: a stand-in)")
    p.add_argument("--dir", help="capture directory (default: a temporary one, removed at the end)")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    import torch
    import fake_engine as fe
    import hybridtb_capture as hc
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        print("warning: no CUDA device; the numbers are CPU numbers", file=sys.stderr)
    forward_fn = None
    if a.forward:
        module, _, name = a.forward.partition(":")
        forward_fn = getattr(importlib.import_module(module), name)
    directory = a.dir or tempfile.mkdtemp(prefix="hybridtb_capture_cost_")
    results = []
    try:
        for spec in a.case or DEFAULT_CASES:
            preset, _, mix = spec.partition(":")
            kind, impl, layer, args, md, output = build_case(torch, fe, preset, mix, a.num_blocks, device, forward_fn)
            cls = type(impl)
            original = cls.forward
            call = lambda: cls.forward(impl, layer, args["query"], args["key"], args["value"], args["kv_cache"], md,  # noqa
                                       output=output)
            call()  # warm-up
            plain = timed(torch, call, a.repeats, device)
            cap = hc.Capturer(directory, max_files=1 << 30, max_bytes=1 << 62)
            hc._State.capturer = cap
            hc.patch(cls, kind)
            inner_cls = type(impl._triton_impl) if kind == "hybrid" else None
            inner_original = inner_cls.forward if inner_cls else None
            if inner_cls:  # the hybrid capture takes the attention output from the inner call
                hc.patch(inner_cls, "triton")
            sizes, captured = [], []
            for _ in range(a.repeats + 1):
                captured.append(timed(torch, call, 1, device))
                files = [f for f in os.listdir(directory) if f.endswith(".h5")]
                if len(files) != 1:
                    raise SystemExit(f"{spec}: expected one capture file, found {files}; index: "
                                     f"{open(os.path.join(directory, 'index.jsonl')).read()[-2000:]}")
                sizes.append(os.path.getsize(os.path.join(directory, files[0])))
                os.remove(os.path.join(directory, files[0]))
            cls.forward = original
            if inner_cls:
                inner_cls.forward = inner_original
            row = {"case": spec, "kind": kind, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
                   "torch": torch.__version__, "forward_ms": round(plain, 3),
                   "captured_step_ms": round(float(np.median(captured[1:])), 3),
                   "capture_overhead_ms": round(float(np.median(captured[1:])) - plain, 3),
                   "bytes_per_file": int(np.median(sizes)), "num_blocks_in_cache": a.num_blocks,
                   "forward": a.forward or "stand-in"}
            results.append(row)
            print(f"{spec:32s} forward {row['forward_ms']:9.3f} ms  captured {row['captured_step_ms']:9.3f} ms  "
                  f"file {row['bytes_per_file'] / 2**20:8.2f} MiB")
    finally:
        if not a.dir:
            shutil.rmtree(directory, ignore_errors=True)
    if a.json:
        with open(a.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
