"""Shared pieces of the PyTorch peers (torch_attention_peer.py, torch_mamba1_peer.py, suite_peer.py):
the environment record, CUDA-event timing of one call, and the mamba1 decode state update.

torch is imported inside the functions only, so importing this module needs no torch (suite_peer.py's
--self-test and --plan run without it).
"""
import datetime
import statistics


def environment():
    """The peer's environment: UTC date, device name, torch and CUDA versions."""
    import torch

    prop = torch.cuda.get_device_properties(0)
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": prop.name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }


class EventTimer:
    """CUDA events around one call on the current stream: time_s(fn) records the start event, calls fn,
    records the stop event and waits for it. Whatever ran before (an L2 flush, a state restore) is
    outside the events; with idle=True the device is synchronized first, so the time also covers the
    host's launch work of fn (the GPU starts idle), as hybridtb_bench times the cuda backend."""

    def __init__(self):
        import torch

        self._torch = torch
        self.start = torch.cuda.Event(enable_timing=True)
        self.stop = torch.cuda.Event(enable_timing=True)

    def time_s(self, fn, idle=False):
        if idle:
            self._torch.cuda.synchronize()
        self.start.record()
        fn()
        self.stop.record()
        self.stop.synchronize()
        return self.start.elapsed_time(self.stop) * 1e-3


def kernel_breakdown(fn, calls, flush):
    """The GPU kernels one call of fn launches, from torch.profiler over `calls` calls (each after
    flush(), whose own kernels are left out): a list of {"name", "us" (mean time per call), "launches"
    (per call)}, longest first. Call it after the warm-up, so autotuning runs are not counted."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush()
            torch.cuda.synchronize()
            with torch.profiler.record_function("hybridtb_peer_call"):
                fn()
            torch.cuda.synchronize()
    flush_names = set()
    with profile(activities=[ProfilerActivity.CUDA]) as flush_prof:
        flush()
        torch.cuda.synchronize()
    for event in flush_prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            flush_names.add(event.key)
    totals = {}
    for event in prof.key_averages():
        if event.device_type != torch.autograd.DeviceType.CUDA or event.key in flush_names:
            continue
        us = getattr(event, "device_time_total", None)
        if us is None:
            us = event.cuda_time_total
        name, launches = event.key, event.count
        total, count = totals.get(name, (0.0, 0))
        totals[name] = (total + us, count + launches)
    rows = [{"name": name, "us": total / calls, "launches": count / calls} for name, (total, count) in totals.items()]
    return sorted(rows, key=lambda r: -r["us"])


def read_flush(nbytes=256 << 20):
    """The L2 flush every GPU timing here uses (hybridtb's ReadFlusher, bench_kernels.h): a read of a
    zero-filled buffer far larger than L2. The lines it leaves are clean, so no write-back of its own
    competes with the timed call, and the GPU is busy with it while the host enqueues that call."""
    import torch

    buffer = torch.zeros(nbytes // 4, dtype=torch.float32, device="cuda")
    return buffer.sum


def sample_us(fn, samples, warmup, flush, restore=None):
    """The peers' timing loop: `warmup` untimed calls (each after restore()), a device sync, then
    `samples` timed calls, each after restore() and flush() (outside the events). Returns
    (median, min, max) in microseconds."""
    import torch

    for _ in range(warmup):
        if restore is not None:
            restore()
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(samples):
        if restore is not None:
            restore()
        flush()  # evict L2 outside the timed region
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e3)
    return statistics.median(times), min(times), max(times)


def selective_state_update(state, x, dt, z, B, C, A, D, dt_bias):
    """The mamba1 decode state update (vLLM's selective_state_update) as one plain tensor expression over
    a contiguous state [S, I, N], updated in place; x, dt, z: [S, I], B, C: [S, N], A: [I, N]
    (= -exp(A_log)), D, dt_bias: [I]. Returns the gated output [S, I]:
        Δ = softplus(dt + dt_bias);  dA = exp(Δ·A);  state = state·dA + (Δ·x)·B
        y = (state·C).sum(-1) + D·x;  y = y·silu(z)"""
    import torch.nn.functional as F

    delta = F.softplus(dt + dt_bias)  # [S, I]
    dA = (delta.unsqueeze(-1) * A).exp()  # [S, I, N]
    state.mul_(dA).add_((delta * x).unsqueeze(-1) * B.unsqueeze(1))
    y = (state * C.unsqueeze(1)).sum(-1) + D * x
    return y * F.silu(z)

