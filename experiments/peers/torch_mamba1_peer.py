#!/usr/bin/env python3
"""PyTorch peer for the mamba1 SSM benchmark (optimized/bench/bench_ssm.cu).

Times, on the shapes of hybridtb_bench_ssm (Mamba-2.8B: d_inner I = 5120, state N = 16, float32
scan inputs and state, as our kernels read them), a straightforward PyTorch implementation of
  (a) the decode state update (vLLM's selective_state_update), 64 and 256 sequences, as one plain
      tensor expression over a contiguous [S, I, N] state updated in place:
          Δ = softplus(dt + dt_bias);  dA = exp(Δ·A);  state = state·dA + (Δ·x)·B
          y = (state·C).sum(-1) + D·x;  y = y·silu(z)
  (b) the prefill selective scan (selective_scan_fn) of one request of 8k and 32k tokens, in the form
      of mamba_ssm's selective_scan_ref: per chunk of 1024 tokens, exp(Δ·A) and (Δ·x)·B are
      materialised as [L, I, N] tensors, then an eager sequential loop over the chunk's tokens
      (h = h·dA[t] + dBx[t] in place, y[t] = h·C[t] with torch.mv), then + D·x and the gate.
      The loop runs eagerly (no torch.compile, no CUDA graph): this is the plain implementation.
The peer gets the easy version where it matters: a contiguous state (no slot indirection), no
block-boundary state writes.

Timing: CUDA events around each call, a 256 MiB L2-flush read before every sample and the state
restored (both outside the events), warm-up, median of the samples.

    python3 experiments/peers/torch_mamba1_peer.py --out peer-ssm.json [--quick]

Case names ("name") match hybridtb_bench_ssm's JSON, so peer_ratio_ssm.py can join the two.
torch is imported only when this runs (it is on the GPU machine, not on the build machines).
"""
import argparse
import json
import sys

from peer_common import environment, sample_us, selective_state_update

I, N = 5120, 16
CHUNK = 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    if not torch.cuda.is_available():
        print("torch_mamba1_peer: no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    dev = "cuda"
    f32 = torch.float32
    flush = torch.zeros(64 << 20, dtype=torch.float32, device=dev)  # 256 MiB

    def uniform(shape, low, high):
        return torch.rand(shape, device=dev, dtype=f32) * (high - low) + low

    # Weights as the benchmark draws them.
    A = -torch.exp(uniform((I, N), 0.0, 2.77))
    D = uniform((I,), 0.5, 1.5)
    dt_bias = uniform((I,), -0.1, 0.1)

    def median_us(fn, restore, samples, warmup):
        # The flush is a read (clean lines, as bench_ssm does), after the restore.
        return sample_us(fn, samples, warmup, flush.sum, restore)

    def decode_step(state, x, dt, z, B, C):
        return selective_state_update(state, x, dt, z, B, C, A, D, dt_bias)

    def prefill_scan(state, x, dt, z, B, C):
        T = x.shape[0]
        delta = F.softplus(dt + dt_bias)  # [T, I]
        dx = delta * x
        ys = torch.empty(T, I, device=dev, dtype=f32)
        h = state  # [I, N], updated in place (the final state)
        for begin in range(0, T, CHUNK):
            end = min(T, begin + CHUNK)
            dA = torch.exp(delta[begin:end].unsqueeze(-1) * A)  # [L, I, N]
            dBx = dx[begin:end].unsqueeze(-1) * B[begin:end].unsqueeze(1)  # [L, I, N]
            for k in range(end - begin):
                h.mul_(dA[k]).add_(dBx[k])
                torch.mv(h, C[begin + k], out=ys[begin + k])
        return (ys + D * x) * F.silu(z)

    report = {
        "peer": "pytorch",
        "environment": environment(),
        "shape": {"I": I, "N": N, "dtype": "float32"},
        "cases": [],
    }
    print(f"{'case':<18} {'peer':<12} {'median_us':>11} {'GB/s':>9}")

    def record(name, kind, peer, bytes_moved, fn, restore, samples, warmup, extra):
        entry = {"name": name, "kind": kind, "peer": peer, "bytes": bytes_moved, **extra}
        try:
            med, lo, hi = median_us(fn, restore, samples, warmup)
            entry.update(median_us=med, min_us=lo, max_us=hi, samples=samples,
                         GBps=bytes_moved / (med * 1e-6) / 1e9)
            print(f"{name:<18} {peer:<12} {med:>11.1f} {entry['GBps']:>9.1f}", flush=True)
        except Exception as e:  # e.g. out of memory: record, go on
            entry["skipped"] = f"{type(e).__name__}: {e}"[:300]
            print(f"{name:<18} {peer:<12} skipped: {entry['skipped'][:80]}", flush=True)
        report["cases"].append(entry)
        torch.cuda.empty_cache()

    for seqs in (64, 256):
        state0 = uniform((seqs, I, N), -1.0, 1.0)
        state = state0.clone()
        x = uniform((seqs, I), -1.0, 1.0)
        dt = uniform((seqs, I), -4.6, -2.3)
        z = uniform((seqs, I), -1.0, 1.0)
        B = uniform((seqs, N), -1.0, 1.0)
        C = uniform((seqs, N), -1.0, 1.0)
        bytes_moved = seqs * (2.0 * I * N * 4 + 4.0 * I * 4 + 2.0 * N * 4)  # as bench_ssm counts
        record(f"decode {seqs} seqs", "decode", "torch_eager", bytes_moved,
               lambda: decode_step(state, x, dt, z, B, C), lambda: state.copy_(state0),
               20 if args.quick else 50, 5, {"seqs": seqs})
        del state0, state

    for tokens in (8192, 32768):
        state0 = uniform((I, N), -1.0, 1.0)
        state = state0.clone()
        x = uniform((tokens, I), -1.0, 1.0)
        dt = uniform((tokens, I), -4.6, -2.3)
        z = uniform((tokens, I), -1.0, 1.0)
        B = uniform((tokens, N), -1.0, 1.0)
        C = uniform((tokens, N), -1.0, 1.0)
        bytes_moved = tokens * (4.0 * I * 4 + 2.0 * N * 4)  # as bench_ssm counts (minimal traffic)
        record(f"prefill {tokens // 1024}k", "prefill", "torch_eager", bytes_moved,
               lambda: prefill_scan(state, x, dt, z, B, C), lambda: state.copy_(state0),
               3 if args.quick else 5, 1, {"tokens": tokens, "form": "chunked materialise + eager token loop"})
        del x, dt, z, B, C

    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
