#!/usr/bin/env python3
"""PyTorch peer for the CUDA attention benchmark.

Times `torch.nn.functional.scaled_dot_product_attention` (SDPA, whichever fused backend torch picks)
and FlexAttention (compiled, with a sliding-window block mask) on the shapes of
optimized/bench/bench_attention.cpp: Llama-3-8B (32 query / 8 kv heads, head 128), bf16.

The peer gets the easy version of the problem on purpose: the KV cache is gathered into contiguous
[batch, kv_heads, keys, head] tensors OUTSIDE the timed region (a paged kernel must follow the block
table inside it), and for windowed decodes SDPA gets only the in-window keys. Windowed prefills run
SDPA with a dense boolean mask (its memory-efficient kernel) and FlexAttention with a block mask. Bytes and FLOPs
are counted with the same formulas as the CUDA benchmark (in-window keys read once per kv head,
plus Q and O; 4·D·Hq per visible query-key pair), so GB/s and TFLOP/s compare directly.

Timing as hybridtb_bench_attention's and vllm_attention_peer.py's: warm-up, then before each sample
an L2 flush by a 256 MiB read (peer_common.read_flush: clean lines, so no write-back lands in the
timed call, and the GPU busy while the host enqueues it), CUDA events around the call, median.

    python3 experiments/peers/torch_attention_peer.py --out peer.json [--quick] [--no-flex]

Case names match hybridtb_bench_attention's, so harness/scripts/gpu-check.sh can print ratios.
"""
import argparse
import json
import sys

import torch
import torch.nn.functional as F

from peer_common import environment, read_flush, sample_us

HQ, HKV, D = 32, 8, 128
DTYPE = torch.bfloat16

# (name, kind, [(context_len, query_len), ...], window); window 0 = none.
CASES = [
    ("decode 64x4k", "decode", [(4095, 1)] * 64, 0),
    ("decode 256x4k", "decode", [(4095, 1)] * 256, 0),
    ("decode 64x4k w4096", "decode", [(4095, 1)] * 64, 4096),
    ("decode 1x32k", "decode", [(32767, 1)] * 1, 0),
    ("decode 4x32k", "decode", [(32767, 1)] * 4, 0),
    ("decode 8x32k", "decode", [(32767, 1)] * 8, 0),
    ("decode 64x32k", "decode", [(32767, 1)] * 64, 0),
    ("decode 64x32k w4096", "decode", [(32767, 1)] * 64, 4096),
    ("prefill 1x2k", "prefill", [(0, 2048)], 0),
    ("prefill 1x4k", "prefill", [(0, 4096)], 0),
    ("prefill 1x8k", "prefill", [(0, 8192)], 0),
    ("prefill 1x8k w4096", "prefill", [(0, 8192)], 4096),
    ("prefill 1x32k", "prefill", [(0, 32768)], 0),
    ("prefill 1x32k w4096", "prefill", [(0, 32768)], 4096),
    ("mixed 2048+64x4k", "mixed", [(4095, 1)] * 64 + [(0, 2048)], 0),
    # Speculative decode steps: each request's 1 + num_speculative_tokens query rows.
    ("speculative 64x4@4k", "decode", [(4092, 4)] * 64, 0),
    ("speculative 64x2@8k + 64x8k", "decode", [(8190, 2)] * 64 + [(8191, 1)] * 64, 0),
]


def counts(requests, window, kv_element_bytes=2):
    """Visible (query, key) pairs and distinct in-window keys, as bench_attention.cpp counts them (a
    1-byte cache's K/V at kv_element_bytes 1)."""
    pairs = 0
    kv_tokens = 0
    for context, qlen in requests:
        for i in range(qlen):
            p = context + i
            pairs += min(window, p + 1) if window > 0 else p + 1
        first = max(0, context - window + 1) if window > 0 else 0
        kv_tokens += context + qlen - first
    tokens = sum(q for _, q in requests)
    bytes_moved = kv_tokens * HKV * D * 2 * kv_element_bytes + 2 * tokens * HQ * D * 2
    flops = 4.0 * D * HQ * pairs
    return bytes_moved, flops


def median_us(fn, samples, flush):
    return sample_us(fn, samples, 3, flush)


def rand(*shape):
    return torch.randn(*shape, device="cuda", dtype=DTYPE)


def sdpa(q, k, v, causal):
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)


def build_sdpa_case(kind, requests, window):
    """Returns a callable running the step with SDPA, or None where SDPA has no fused form."""
    decodes = [(c, q) for c, q in requests if q == 1]
    prefills = [(c, q) for c, q in requests if q > 1]
    calls = []
    if decodes:
        keys = decodes[0][0] + 1
        if window > 0:
            keys = min(keys, window)
        q = rand(len(decodes), HQ, 1, D)
        k = rand(len(decodes), HKV, keys, D)
        v = rand(len(decodes), HKV, keys, D)
        calls.append(lambda q=q, k=k, v=v: sdpa(q, k, v, False))
    for context, qlen in prefills:
        if context > 0:
            return None  # no fused SDPA form for a causal mask offset by a context
        q = rand(1, HQ, qlen, D)
        k = rand(1, HKV, qlen, D)
        v = rand(1, HKV, qlen, D)
        if window == 0:
            calls.append(lambda q=q, k=k, v=v: sdpa(q, k, v, True))
        else:
            # A sliding window needs an explicit mask: SDPA then runs its memory-efficient kernel on a
            # dense boolean [q, k] mask (built outside the timed region).
            pos = torch.arange(qlen, device="cuda")
            mask = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < window)
            calls.append(lambda q=q, k=k, v=v, m=mask: F.scaled_dot_product_attention(q, k, v, attn_mask=m,
                                                                                        enable_gqa=True))

    def run():
        for call in calls:
            call()

    return run


def build_flex_case(kind, requests, window, flex, create_block_mask):
    """FlexAttention: one call per group of equal requests, causal (+ sliding window) block mask."""
    calls = []
    groups = {}
    for c, q in requests:
        groups.setdefault((c, q), 0)
        groups[(c, q)] += 1
    # FlexAttention's generated kernels index with int32: split a group so no tensor reaches 2^31
    # elements (64 sequences x 8 kv heads x 32k keys x 128 is exactly 2^31).
    split_groups = []
    for (context, qlen), count in groups.items():
        per_call = max(1, (2**31 - 1) // (HKV * (context + qlen) * D))
        while count > 0:
            split_groups.append((context, qlen, min(count, per_call)))
            count -= per_call
    for context, qlen, count in split_groups:
        keys = context + qlen
        offset = context  # query i sits at position context + i

        def mask_mod(b, h, q_idx, kv_idx, offset=offset):
            visible = kv_idx <= q_idx + offset
            if window > 0:
                visible = visible & (q_idx + offset - kv_idx < window)
            return visible

        block_mask = create_block_mask(mask_mod, B=None, H=None, Q_LEN=qlen, KV_LEN=keys, device="cuda")
        q = rand(count, HQ, qlen, D)
        k = rand(count, HKV, keys, D)
        v = rand(count, HKV, keys, D)
        calls.append(lambda q=q, k=k, v=v, m=block_mask: flex(q, k, v, block_mask=m, enable_gqa=True))

    def run():
        for call in calls:
            call()

    return run


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--no-flex", action="store_true", help="skip FlexAttention (compilation takes a while)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("torch_attention_peer: no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    flex = create_block_mask = None
    if not args.no_flex:
        try:
            from torch.nn.attention.flex_attention import create_block_mask, flex_attention

            # One compiled kernel per shape; the default recompile limit (8) would silently fall back
            # to the unfused implementation that materialises the whole score matrix.
            for limit in ("recompile_limit", "cache_size_limit"):  # the name changed across versions
                if hasattr(torch._dynamo.config, limit):
                    setattr(torch._dynamo.config, limit, 256)
            flex = torch.compile(flex_attention, dynamic=False)
        except Exception as e:  # older torch: report it, keep SDPA
            print(f"FlexAttention unavailable: {e}", file=sys.stderr)
    flush = read_flush()
    samples = 10 if args.quick else 30
    report = {
        "peer": "pytorch",
        "environment": environment(),
        "shape": {"num_heads": HQ, "num_kv_heads": HKV, "head_size": D, "dtype": "bfloat16"},
        "timing": "3 warm-up calls, then per sample a 256 MiB read (L2 flush), CUDA events around the call; median",
        "cases": [],
    }
    print(f"{'case':<22} {'peer':<6} {'median_us':>10} {'GB/s':>9} {'TFLOP/s':>9}")
    for name, kind, requests, window in CASES:
        bytes_moved, flops = counts(requests, window)
        builders = [("sdpa", lambda: build_sdpa_case(kind, requests, window))]
        if flex is not None:
            builders.append(("flex", lambda: build_flex_case(kind, requests, window, flex, create_block_mask)))
        for peer, build in builders:
            entry = {"name": name, "kind": kind, "window": window, "peer": peer, "bytes": bytes_moved, "flops": flops}
            try:
                run = build()
                if run is None:
                    entry["skipped"] = "no fused SDPA form for a causal mask offset by a context"
                else:
                    med, lo, hi = median_us(run, samples, flush)
                    entry.update(median_us=med, min_us=lo, max_us=hi, samples=samples,
                                 GBps=bytes_moved / (med * 1e-6) / 1e9, TFLOPs=flops / (med * 1e-6) / 1e12)
                    print(f"{name:<22} {peer:<6} {med:>10.1f} {entry['GBps']:>9.1f} {entry['TFLOPs']:>9.1f}",
                          flush=True)
            except Exception as e:  # e.g. out of memory for the dense fallback: record, go on
                entry["skipped"] = f"{type(e).__name__}: {e}"[:300]
            if "skipped" in entry:
                print(f"{name:<22} {peer:<6} skipped: {entry['skipped'][:80]}", flush=True)
            report["cases"].append(entry)
            torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
