#!/usr/bin/env python3
"""vLLM's own Triton kernels as a peer of the CUDA attention benchmark (hybridtb_bench_attention).

Times vLLM's unified attention (and, apart, its KV-cache write + unified attention, the step as vLLM's
Triton backend runs it) imported from an unpacked vLLM release by vllm_kernels.py, on the shapes of
optimized/bench/bench_attention.cpp (the case list is torch_attention_peer.CASES): Llama-3-8B
(32 query / 8 kv heads, head 128), bf16, block 16, a paged KV cache whose physical blocks are
shuffled (block 0 the null block), one block-table row per request. Unlike the PyTorch peer this
one reads the same paged layout as ours, through the block table, inside the timed region.

The 1-byte KV-cache rows of the benchmark (BYTE_CASES: fp8 e4m3 / e5m2 with per-tensor scales, int8 /
fp8 per token-head) run the same kernels on a cache of that dtype, as vLLM's Triton backend takes
it (the cast to the model dtype inside the kernel); their bytes count K/V at one per element, as
the benchmark counts them.

Launch parameters as vLLM's Triton backend sets them: window (w-1, 0), per-tensor descales of 1,
and on releases with split-K scratch buffers the builder's threshold MIN_LAUNCH_GRID_SIZE_2D //
num_kv_heads and NUM_PAR_SOFTMAX_SEGMENTS segments (both read from that release's
v1/attention/backends/triton_attn.py), scratch for every query token.

Timing as hybridtb_bench_attention times ours: two warm-up calls, then before each sample an L2
flush by a 256 MiB read (peer_common.read_flush), CUDA events around the call, median. Entries:
peer "vllm" (the attention call alone, like-for-like with the benchmark's kernel) and peer
"vllm_step" (the KV write of the step's new tokens + the attention).

    python3 experiments/peers/vllm_attention_peer.py --vllm DIR --out peer-vllm.json [--quick]
"""
import argparse
import ast
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from peer_common import environment, read_flush, sample_us  # noqa: E402
from torch_attention_peer import CASES, D, HKV, HQ, counts  # noqa: E402
from vllm_kernels import load  # noqa: E402

BS = 16

# The benchmark's 1-byte KV-cache rows (bench_attention.cpp): (name, kind, requests, window,
# kv_cache_dtype).
BYTE_CASES = [
    ("prefill 1x4k fp8_e4m3", "prefill", [(0, 4096)], 0, "fp8_e4m3"),
    ("prefill 1x4k fp8_e5m2", "prefill", [(0, 4096)], 0, "fp8_e5m2"),
    ("prefill 1x4k int8_pth", "prefill", [(0, 4096)], 0, "int8_per_token_head"),
    ("prefill 1x4k fp8_pth", "prefill", [(0, 4096)], 0, "fp8_per_token_head"),
    ("prefill 1x8k fp8_e4m3", "prefill", [(0, 8192)], 0, "fp8_e4m3"),
    ("prefill 1x32k fp8_e4m3", "prefill", [(0, 32768)], 0, "fp8_e4m3"),
    ("prefill 1x32k w4096 fp8_e4m3", "prefill", [(0, 32768)], 4096, "fp8_e4m3"),
    ("decode 64x4k fp8_e4m3", "decode", [(4095, 1)] * 64, 0, "fp8_e4m3"),
    ("decode 64x4k int8_pth", "decode", [(4095, 1)] * 64, 0, "int8_per_token_head"),
    ("decode 64x4k fp8_pth", "decode", [(4095, 1)] * 64, 0, "fp8_per_token_head"),
    ("decode 8x32k fp8_e4m3", "decode", [(32767, 1)] * 8, 0, "fp8_e4m3"),
]


def builder_constants(root):
    """MIN_LAUNCH_GRID_SIZE_2D and NUM_PAR_SOFTMAX_SEGMENTS from the release's Triton backend (None if absent)."""
    path = os.path.join(root, "vllm", "v1", "attention", "backends", "triton_attn.py")
    if not os.path.isfile(path):
        return None, None
    found = {}
    for node in ast.parse(open(path).read(), path).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for t in node.targets:
                if getattr(t, "id", None) in ("MIN_LAUNCH_GRID_SIZE_2D", "NUM_PAR_SOFTMAX_SEGMENTS"):
                    found[t.id] = node.value.value
    return found.get("MIN_LAUNCH_GRID_SIZE_2D"), found.get("NUM_PAR_SOFTMAX_SEGMENTS")


class PagedStep:
    """One step as vLLM's Triton backend sees it: a paged cache whose physical blocks are shuffled
    (block 0 the null block, zeros as vLLM allocates it), one block-table row per request, the step's
    new tokens. requests: [(context_len, query_len), ...]. Also used by suite_peer.py --vllm for the
    standard suite's cases (any dtype, KV-cache dtype, block size, window, soft cap, ALiBi, sinks)."""

    def __init__(self, kernels, requests, window, hq=HQ, hkv=HKV, d=D, dtype="bfloat16", kv_cache_dtype="auto",
                 block_size=BS, scale=None, softcap=0.0, alibi=False, sinks=False, seed=0, split_k=(None, None)):
        g = torch.Generator(device="cpu").manual_seed(seed)
        bs = block_size
        blocks_per = [(c + q + bs - 1) // bs for c, q in requests]
        total = sum(blocks_per)
        ids = (torch.randperm(total, generator=g) + 1).to(torch.int32)  # block 0: the null block
        table = torch.zeros((len(requests), max(blocks_per)), dtype=torch.int32)
        slots, qsl, seq_lens = [], [0], []
        at = 0
        for r, (context, qlen) in enumerate(requests):
            n = blocks_per[r]
            table[r, :n] = ids[at:at + n]
            at += n
            for i in range(qlen):
                p = context + i
                slots.append(int(table[r, p // bs]) * bs + p % bs)
            qsl.append(qsl[-1] + qlen)
            seq_lens.append(context + qlen)
        tokens = qsl[-1]
        dev = "cuda"
        model = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[dtype]
        storage = {"auto": model, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
                   "fp8_per_token_head": torch.float8_e4m3fn, "int8_per_token_head": torch.int8}[kv_cache_dtype]
        shape = (total + 1, 2, bs, hkv, d)
        if storage == torch.int8:
            self.kv_cache = torch.randint(-127, 128, shape, dtype=torch.int8, device=dev)
        elif storage in (torch.float8_e4m3fn, torch.float8_e5m2):  # fp8 has no randn: slabs of 4096 blocks
            self.kv_cache = torch.empty(shape, dtype=storage, device=dev)
            for b in range(0, shape[0], 4096):
                part = self.kv_cache[b:b + 4096]
                part.copy_(torch.randn(part.shape, dtype=model, device=dev).to(storage))
        else:  # drawn in the cache's own dtype: no float32 copy of a cache that may fill half the GPU
            self.kv_cache = torch.randn(shape, dtype=storage, device=dev)
        self.kv_cache[0].zero_()
        self.key_cache, self.value_cache = self.kv_cache[:, 0], self.kv_cache[:, 1]
        self.k_scale_cache = self.v_scale_cache = None
        if kv_cache_dtype.endswith("per_token_head"):
            self.k_scale_cache = torch.rand((total + 1, bs, hkv), dtype=torch.float32, device=dev) * 0.02 + 0.01
            self.v_scale_cache = torch.rand((total + 1, bs, hkv), dtype=torch.float32, device=dev) * 0.02 + 0.01
        self.q = torch.randn((tokens, hq, d), dtype=model, device=dev)
        self.k = torch.randn((tokens, hkv, d), dtype=model, device=dev)
        self.v = torch.randn((tokens, hkv, d), dtype=model, device=dev)
        self.out = torch.empty_like(self.q)
        self.block_table = table.to(dev)
        self.slots = torch.tensor(slots, dtype=torch.int64, device=dev)
        self.qsl = torch.tensor(qsl, dtype=torch.int32, device=dev)
        self.seq_lens = torch.tensor(seq_lens, dtype=torch.int32, device=dev)
        self.max_q = max(q for _, q in requests)
        self.max_k = max(seq_lens)
        self.one = torch.ones(1, dtype=torch.float32, device=dev)
        self.alibi = (torch.tensor([2.0 ** (-8.0 * (h + 1) / hq) for h in range(hq)], dtype=torch.float32, device=dev)
                      if alibi else None)
        self.sinks = torch.linspace(-2.0, 2.0, hq, dtype=torch.float32, device=dev) if sinks else None
        self.kernels = kernels
        self.window = window
        self.kv_cache_dtype = kv_cache_dtype
        self.scale = scale if scale is not None else 1.0 / d ** 0.5
        self.softcap = softcap
        self.split_k = split_k

    def attention(self):
        self.kernels.attention(self.q, self.key_cache, self.value_cache, self.out, self.qsl, self.max_q, self.seq_lens,
                               self.max_k, self.scale, self.window, self.block_table, self.softcap, self.one, self.one,
                               self.kv_cache_dtype, alibi_slopes=self.alibi, sinks=self.sinks,
                               k_scale_cache=self.k_scale_cache, v_scale_cache=self.v_scale_cache,
                               seq_threshold_3d=self.split_k[0], num_par_softmax_segments=self.split_k[1])

    def write(self):
        self.kernels.write_kv(self.k, self.v, self.key_cache, self.value_cache, self.slots, self.kv_cache_dtype,
                              self.one, self.one, self.k_scale_cache, self.v_scale_cache)

    def step(self):
        self.write()
        self.attention()


def split_k_for(kernels, num_kv_heads):
    """(seq_threshold_3d, num_par_softmax_segments) as the release's Triton builder sets them (no CUDA graphs)."""
    grid_2d, segments = builder_constants(kernels.root)
    return (grid_2d // num_kv_heads if grid_2d else None), segments


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", required=True, help="unpacked vLLM release (the folder holding vllm/)")
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("vllm_attention_peer: no CUDA device", file=sys.stderr)
        return 2
    kernels = load(args.vllm)
    threshold, segments = split_k_for(kernels, HKV)
    reps = 10 if args.quick else 30
    flush = read_flush()
    report = {"peer": "vllm", "environment": dict(environment(), triton=__import__("triton").__version__,
                                                   vllm=kernels.describe(), vllm_files=kernels.source_files),
              "shape": {"num_heads": HQ, "num_kv_heads": HKV, "head_size": D, "dtype": "bfloat16", "block_size": BS},
              "split_k": {"seq_threshold_3d": threshold, "num_par_softmax_segments": segments},
              "timing": "2 warm-up calls, then per sample a 256 MiB read (L2 flush), CUDA events around the "
                        "call; median",
              "cases": []}
    print(f"{'case':<22} {'peer':<10} {'median_us':>10} {'GB/s':>9} {'TFLOP/s':>9}")
    for name, kind, requests, window, kv in [c + ("auto",) for c in CASES] + BYTE_CASES:
        bytes_moved, flops = counts(requests, window, 2 if kv == "auto" else 1)
        try:
            s = PagedStep(kernels, requests, window, kv_cache_dtype=kv, split_k=(threshold, segments))
            for peer, fn in (("vllm", s.attention), ("vllm_step", s.step)):
                med, lo, hi = sample_us(fn, reps, 2, flush)
                entry = {"name": name, "kind": kind, "window": window, "kv_cache_dtype": kv, "peer": peer,
                         "bytes": bytes_moved, "flops": flops, "median_us": med, "min_us": lo, "max_us": hi,
                         "samples": reps,
                         "GBps": bytes_moved / (med * 1e-6) / 1e9, "TFLOPs": flops / (med * 1e-6) / 1e12}
                report["cases"].append(entry)
                print(f"{name:<22} {peer:<10} {med:>10.1f} {entry['GBps']:>9.1f} {entry['TFLOPs']:>9.1f}", flush=True)
            assert not torch.isnan(s.out).any(), f"{name}: vLLM's output has NaN"
            del s
        except Exception as e:  # out of memory and the like: record, go on
            report["cases"].append({"name": name, "kind": kind, "window": window, "kv_cache_dtype": kv,
                                    "peer": "vllm", "skipped": f"{type(e).__name__}: {e}"[:300]})
            print(f"{name:<22} vllm       skipped: {type(e).__name__}: {str(e)[:80]}", flush=True)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
