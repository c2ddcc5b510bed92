#!/usr/bin/env python3
"""PyTorch and vLLM peers inside the benchmark suite's results: time each cuda case's step, add it.

    python3 experiments/peers/suite_peer.py RESULTS.json --out RESULTS_WITH_PEER.json [--hybridtb PATH] [--vllm DIR]
    python3 experiments/peers/suite_peer.py RESULTS.json --plan      # what would be timed, no torch needed
    python3 experiments/peers/suite_peer.py --self-test               # the unit checks, no torch or GPU needed

Reads a `hybridtb_bench` results file (schema hybridtb-bench-results, experiments/README.md) and, for
every `cuda` case with status ok whose step plain PyTorch expresses, times the same step on the GPU:

- attention: one `torch.nn.functional.scaled_dot_product_attention` call per group of equal requests
  (all decodes at one context in one call, all prefills of one length in one call, ...), GQA through
  `enable_gqa=True` (torch >= 2.5; older torch: K/V `repeat_interleave`d inside the timed step);
  fresh prefills `is_causal=True`; chunks continuing a context the lower-right causal bias
  (`torch.nn.attention.bias.causal_lower_right`, else a dense boolean mask); windowed decodes read only
  the in-window keys; windowed prefills and chunks where the window binds a dense boolean mask (built
  outside the timed region). Before the attention, the step writes the new K/V rows into the cache
  (a copy into contiguous tensors), as our step's KV-cache write does.
- K/V are **contiguous** [requests, kv_heads, keys, head] tensors per group holding only the keys the
  step reads (the in-window ones): the peer gets the easy version; the cuda backend reads a paged cache
  through the block table. Q arrives in SDPA's layout; outputs stay per group (no gather into one
  [tokens, heads·head] tensor).
- ssm_mode mamba1 on decode-only steps: vLLM's MambaMixer decode in plain float32 PyTorch (in_proj,
  the conv-state update + SiLU, x_proj, dt_proj + softplus, the selective state update shared with
  torch_mamba1_peer.py, the gate, out_proj) on the query rows, then the add into the attention output;
  contiguous [requests, ...] states (no slot indirection), restored before every iteration.
- path `graph`: the same step captured once in a `torch.cuda.CUDAGraph` and timed as `replay()`.

Skipped, each with a `peer_skip_reason`: the reference backend and cases that did not run;
speculative decodes; fp8/int8 KV caches; ALiBi, soft cap and sinks (no SDPA form); encoder-only
attention; every SSM mode but mamba1, and mamba1 on steps with prefills or chunks or with
mamba_cache_mode != none; a setting the peer does not know; a step that needs more GPU memory than is free.

Timing mirrors hybridtb_bench's cuda timing: two untimed warm-up steps; then per iteration the state
restore (mamba1), an L2 flush (a read of 256 MiB of zeros, whose clean lines leave no write-back for the
step to pay), a device synchronize (the GPU is idle),
and CUDA events around the step on the current stream, so the time covers the host's launches and the
GPU work, as our step's latency (planning + launches + GPU work). Each repetition runs iterations until
`min_time_s` of timed work (the suite's repetitions and 0.05 s by default) and reports their mean; the
peer's median is the median of the repetitions. ratio = peer median / our latency_median_s (like for
like: both include the host's launches; our median_s where a results file has no latency) and
ratio_gpu_time = peer median / our median_s (our GPU time alone, behind hybridtb_bench's gate kernel)
(> 1: hybridtb faster).
One timing per case name serves its fused and two_kernel paths (the same step); graph is timed apart.

The model geometry (heads, head size, window, scale, dtype, ...) comes from the case's preset, as
`hybridtb gen --list-presets` prints it (the CLI of the build that ran the suite: --hybridtb PATH, else
the build named in the results' command, else the newest build*/harness/cli/hybridtb), with the
case's settings applied in order, as `hybridtb gen --set` does.

With --vllm DIR (an unpacked vLLM release, the folder holding vllm/), vLLM's own Triton kernels are a
second peer, with their own ratio: the step as vLLM's Triton backend runs it (its KV-cache write, then
its unified attention, both imported by vllm_kernels.py) on a paged cache with shuffled physical blocks
and one block-table row per request (vllm_attention_peer.PagedStep), so it reads the same layout as the
cuda backend. It covers what vLLM's kernels cover: speculative decodes, fp8 / per-token-head KV caches,
ALiBi, soft cap, sinks, any window and block size; it skips SSM branches and linear-attention layers
(not part of vLLM's attention kernel), encoder-only layers and the graph path. Timing as the PyTorch
peer's (L2 flush, idle device, CUDA events around the step). On every case: `vllm_peer` {impl, median_s,
times_s, iterations, q1_s, q3_s, rel_iqr, ratio, ratio_gpu_time, calls, timing} or `vllm_peer_skip_reason`
(or `vllm_peer_error`), and a top-level `vllm_peer_environment`.

Output: the input file with, on every case, either `peer` {impl, median_s, times_s, iterations,
q1_s, q3_s, rel_iqr, ratio, calls, timing} or `peer_skip_reason` (or `peer_error` when timing
failed), and a top-level `peer_environment` (date, device, torch, CUDA, how K/V and GQA are handled,
the L2 flush, repetitions). Everything else is copied unchanged. Written atomically.
Exit status: 0 success; 2 usage error, unreadable input, no hybridtb CLI, no torch or no CUDA device;
1 a peer failure (a selected case failed to time or an SDPA form disagreed with the float32 check;
the output is still written, the failure recorded in the case).
"""
import argparse
import collections
import glob
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import peer_common  # noqa: E402  (needs no torch at import)

IMPL = "torch sdpa (contiguous K/V)"
KV_NOTE = ("the peer reads contiguous [requests, kv_heads, keys, head] K/V holding only the keys each step "
           "reads; hybridtb's cuda backend reads a paged KV cache through the block table")
MAX_INT32 = 2**31 - 1


class UsageError(Exception):
    """Bad arguments or input: exit 2."""


# --------------------------------------------------------------------------------------------------
# The mix grammar of `hybridtb gen` (harness/include/hybridtb/mix.h, harness/src/mix.cpp).
# --------------------------------------------------------------------------------------------------

class MixError(ValueError):
    pass


Term = collections.namedtuple("Term", "kind count query_len context_len")  # kind: d s c p
_ORDER = {"d": 0, "s": 0, "c": 1, "p": 2}  # vLLM's order: decodes, chunks (extends), fresh prefills
_FORM = {"d": "dN@C", "s": "sNxK@C", "c": "cNxL@C", "p": "pNxL"}
_NAME = {"d": "decode", "s": "speculative decode", "c": "chunk", "p": "prefill"}


def _parse_term(mix, term, offset, number):
    def fail(at, what):
        raise MixError(f"mix '{mix}': term {number} '{term}' at character {offset + at + 1}: {what}")

    pos = 0

    def read_number(what, suffix):
        nonlocal pos
        start = pos
        value = 0
        while pos < len(term) and term[pos].isdigit() and term[pos].isascii():
            value = value * 10 + int(term[pos])
            if value > MAX_INT32:
                fail(start, f"{what} is larger than {MAX_INT32}")
            pos += 1
        if pos == start:
            got = f", got '{term[pos]}'" if pos < len(term) else ", got the end"
            fail(start, f"expected digits for {what}{got}")
        if pos < len(term) and term[pos] in "kK":
            if not suffix:
                fail(pos, f"the suffix 'k' is for lengths and contexts, not for {what}")
            pos += 1
            value *= 1024
            if value > MAX_INT32:
                fail(start, f"{what} is larger than {MAX_INT32}")
        return value

    def expect(c, where, kind):
        nonlocal pos
        if pos < len(term) and term[pos] == c:
            pos += 1
            return
        got = f", got '{term[pos]}'" if pos < len(term) else ", got the end"
        fail(pos, f"expected '{c}' {where} of a {_NAME[kind]} term ({_FORM[kind]}){got}")

    if not term:
        fail(0, "empty term (two '+' in a row, or a '+' at an end)")
    kind = term[0]
    if kind not in _ORDER:
        fail(0, f"a term starts with 'd' (decodes), 's' (speculative decodes), 'c' (chunks) or 'p' (prefills), "
                f"got '{kind}'")
    pos = 1
    count = read_number("the count N", False)
    if count < 1:
        fail(1, "the count N must be >= 1")
    query_len, context_len = 1, 0
    if kind != "d":
        expect("x", "after the count", kind)
        at = pos
        query_len = read_number("the tokens per request K" if kind == "s" else "the length L", True)
        if kind == "s" and query_len < 2:
            fail(at, "K = 1 + num_speculative_tokens must be >= 2 (use dN@C for plain decodes)")
        if query_len < 1:
            fail(at, "the length L must be >= 1")
    if kind != "p":
        expect("@", "after the count" if kind == "d" else "after the length", kind)
        at = pos
        context_len = read_number("the context C", True)
        if kind == "c" and context_len < 1:
            fail(at, "a chunk continues a request, so its context C must be >= 1 (use pNxL for a fresh prefill)")
    if pos != len(term):
        fail(pos, f"unexpected '{term[pos]}' after a complete {_NAME[kind]} term ({_FORM[kind]})")
    if context_len + query_len > MAX_INT32:
        fail(0, f"context + tokens = {context_len + query_len} exceeds {MAX_INT32} (seq_lens are int32)")
    return Term(kind, count, query_len, context_len)


def parse_mix(text):
    """The terms of a mix in vLLM's order (a stable sort: decodes, chunks, prefills); MixError if malformed."""
    terms = []
    start = 0
    for number, raw in enumerate(text.split("+"), 1):
        stripped = raw.strip(" \t")
        first = start + (len(raw) - len(raw.lstrip(" \t"))) if stripped else start
        terms.append(_parse_term(text, stripped, first, number))
        start += len(raw) + 1
    terms.sort(key=lambda t: _ORDER[t.kind])
    tokens = sum(t.count * t.query_len for t in terms)
    if tokens > MAX_INT32:
        raise MixError(f"mix '{text}': {tokens} tokens in all exceed {MAX_INT32} (query_start_loc is int32)")
    return terms


def _with_suffix(value):
    return f"{value // 1024}k" if value > 0 and value % 1024 == 0 else str(value)


def canonical_mix(terms):
    """The canonical form (mix.h to_string): normalised order, multiples of 1024 written with k."""
    out = []
    for t in terms:
        if t.kind == "d":
            out.append(f"d{t.count}@{_with_suffix(t.context_len)}")
        elif t.kind == "p":
            out.append(f"p{t.count}x{_with_suffix(t.query_len)}")
        else:
            out.append(f"{t.kind}{t.count}x{_with_suffix(t.query_len)}@{_with_suffix(t.context_len)}")
    return "+".join(out)


# --------------------------------------------------------------------------------------------------
# Presets and settings (harness/src/presets.cpp): `hybridtb gen --list-presets`, then --set in order.
# --------------------------------------------------------------------------------------------------

class SettingError(ValueError):
    pass


def parse_presets(text):
    """{name: [key=value, ...]} from the output of `hybridtb gen --list-presets`:
    a 'Presets' header, then per preset '  NAME: description' and an indented line of settings."""
    presets = {}
    lines = text.splitlines()
    inside = False
    name = None
    for line in lines:
        if line.startswith("Presets"):
            inside = True
            continue
        if not inside:
            continue
        if line.startswith("Settings"):
            break
        m = re.match(r"^  ([A-Za-z0-9_.+-]+): ", line)
        if m:
            name = m.group(1)
            presets[name] = []
        elif name is not None and line.startswith("    ") and line.strip():
            presets[name] += line.split()
    return presets


def presets_from_cli(hybridtb):
    try:
        proc = subprocess.run([hybridtb, "gen", "--list-presets"], capture_output=True, text=True, timeout=60)
    except OSError as e:
        raise UsageError(f"cannot run {hybridtb}: {e}")
    if proc.returncode != 0:
        raise UsageError(f"{hybridtb} gen --list-presets exited {proc.returncode}: {proc.stderr.strip()[:300]}")
    presets = parse_presets(proc.stdout)
    if not presets:
        raise UsageError(f"{hybridtb} gen --list-presets printed no presets")
    return presets


def find_hybridtb(explicit, results):
    """The hybridtb CLI: --hybridtb, else the build that ran the suite (environment.command's
    .../experiments/hybridtb_bench → .../harness/cli/hybridtb), else the newest build*/harness/cli/hybridtb."""
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise UsageError(f"--hybridtb {explicit}: not an executable file")
        return explicit
    candidates = []
    command = ((results.get("environment") or {}).get("command") or "").split()
    if command and os.path.basename(command[0]) == "hybridtb_bench":
        build = os.path.dirname(os.path.dirname(command[0]))
        for base in ("", ROOT, os.getcwd()):
            candidates.append(os.path.join(base, build, "harness", "cli", "hybridtb"))
    found = [c for c in candidates if os.path.isfile(c) and os.access(c, os.X_OK)]
    if found:
        return found[0]
    builds = [p for p in glob.glob(os.path.join(ROOT, "build*", "harness", "cli", "hybridtb")) if os.access(p, os.X_OK)]
    if builds:
        return max(builds, key=os.path.getmtime)
    raise UsageError("no hybridtb CLI found (build*/harness/cli/hybridtb, or the build named in the results' "
                     "command): pass --hybridtb PATH")


def _parse_int(key, text):
    digits, factor = text, 1
    if digits[-1:] in ("k", "K"):
        digits, factor = digits[:-1], 1024
    if not re.fullmatch(r"-?[0-9]+", digits or ""):
        raise SettingError(f"--set {key}={text}: expected an integer (optionally with a k suffix)")
    return int(digits) * factor


def _parse_float(key, text):
    try:
        value = float(text)
    except ValueError:
        raise SettingError(f"--set {key}={text}: expected a number")
    if not math.isfinite(value):
        raise SettingError(f"--set {key}={text}: expected a finite number")
    return value


_INT_KEYS = {"num_heads", "num_kv_heads", "head_size", "block_size", "sliding_window", "mamba_block_size",
             "num_speculative_tokens", "max_num_seqs"}
_WORD_KEYS = {"alibi_slopes", "sinks", "dtype", "kv_cache_dtype", "attn_type", "mamba_cache_mode", "cudagraph_mode",
              "cudagraph_capture_sizes", "use_alibi_sqrt"}


def new_layer():
    """LayerSettings' defaults before a preset (presets.cpp)."""
    return {"num_heads": 0, "num_kv_heads": 0, "head_size": 0, "block_size": 16, "scale": None, "sliding_window": 0,
            "logits_soft_cap": 0.0, "alibi_slopes": "off", "use_alibi_sqrt": "false", "sinks": "off",
            "dtype": "bfloat16", "kv_cache_dtype": "auto", "attn_type": "decoder", "ssm_mode": "none", "ssm": {},
            "mamba_cache_mode": "none", "mamba_block_size": 0, "num_speculative_tokens": 0, "cudagraph_mode": "none",
            "cudagraph_capture_sizes": "", "max_num_seqs": 256}


def apply_setting(layer, key_value):
    """One `--set key=value`, as presets.cpp apply_setting (SettingError for what the peer cannot read)."""
    key, eq, value = key_value.partition("=")
    key, value = key.strip(" \t"), value.strip(" \t")
    if not eq or not value:
        raise SettingError(f"--set '{key_value}': expected key=value")
    if key.startswith("ssm."):
        v = _parse_int(key, value)
        if v <= 0:
            raise SettingError(f"--set {key}={value}: SSM parameters must be > 0")
        layer["ssm"][key[4:]] = v
    elif key == "ssm_mode":
        if value != layer["ssm_mode"]:
            layer["ssm"] = {}  # another mode: its own parameters
        layer["ssm_mode"] = value
    elif key == "scale":
        if value == "auto":
            layer["scale"] = None
        elif value.startswith("1/sqrt(") and value.endswith(")"):
            layer["scale"] = 1.0 / math.sqrt(_parse_float(key, value[7:-1]))
        else:
            layer["scale"] = _parse_float(key, value)
    elif key == "logits_soft_cap":
        layer[key] = _parse_float(key, value)
    elif key in _INT_KEYS:
        layer[key] = _parse_int(key, value)
    elif key in _WORD_KEYS:
        layer[key] = value
    else:
        raise SettingError(f"--set {key}={value}: a setting the peer does not know")


def make_layer(preset_settings, case_settings):
    """The layer of a case: the preset's settings, then the case's, then presets.cpp finish()."""
    layer = new_layer()
    for s in list(preset_settings) + list(case_settings):
        apply_setting(layer, s)
    if layer["scale"] is None and layer["head_size"] > 0:
        layer["scale"] = 1.0 / math.sqrt(layer["head_size"])
    if layer["ssm_mode"] == "mamba1":  # Mamba's conventions for what was not given
        hidden = layer["num_heads"] * layer["head_size"]
        layer["ssm"].setdefault("intermediate_size", 2 * hidden)
        layer["ssm"].setdefault("state_size", 16)
        layer["ssm"].setdefault("conv_kernel", 4)
        layer["ssm"].setdefault("dt_rank", (hidden + 15) // 16)
    return layer


# --------------------------------------------------------------------------------------------------
# Case selection and the plan of one step (pure Python).
# --------------------------------------------------------------------------------------------------

Call = collections.namedtuple("Call", "kind count query_len context_len key_begin keys mask")
# kind: decode | prefill | chunk; keys: how many keys the call reads, from absolute position key_begin;
# mask: none (one query sees every key given), causal (is_causal), lower_right (causal offset by the
# context), window (a dense boolean mask: the window binds inside the keys given).


def plan_call(kind, count, query_len, context_len, window):
    """The SDPA call for `count` equal requests: which keys, which mask."""
    total = context_len + query_len
    key_begin = max(0, context_len - window + 1) if window > 0 else 0
    if query_len == 1:
        mask = "none"
    elif window > 0 and total > window:
        mask = "window"
    elif context_len == 0:
        mask = "causal"
    else:
        mask = "lower_right"
    return Call(kind, count, query_len, context_len, key_begin, total - key_begin, mask)


def describe_call(c):
    what = {"decode": f"{c.count} decode{'s' * (c.count > 1)} at context {c.context_len}",
            "prefill": f"{c.count} prefill{'s' * (c.count > 1)} of {c.query_len}",
            "chunk": f"{c.count} chunk{'s' * (c.count > 1)} of {c.query_len} at context {c.context_len}"}[c.kind]
    form = {"none": "sdpa", "causal": "sdpa is_causal", "lower_right": "sdpa causal_lower_right",
            "window": "sdpa dense window mask"}[c.mask]
    return f"{what}: {form}, keys {c.key_begin}..{c.key_begin + c.keys - 1}"


_TORCH_DTYPES = {"bfloat16": 2, "float16": 2, "float32": 4}


def plan_case(case, presets):
    """(plan, None) for a case the peer times, or (None, reason)."""
    if case.get("backend") != "cuda":
        return None, f"backend {case.get('backend')}: the peer is timed beside the cuda backend only"
    if case.get("status") != "ok":
        return None, f"the case did not run (status {case.get('status')})"
    path = case.get("path")
    if path not in ("fused", "two_kernel", "graph"):
        return None, f"path {path}: unknown to the peer"
    preset = case.get("preset")
    if preset not in presets:
        return None, f"preset {preset} is not in the hybridtb CLI's preset list"
    try:
        terms = parse_mix(case.get("mix", ""))
    except MixError as e:
        return None, str(e)
    try:
        layer = make_layer(presets[preset], case.get("settings", []))
    except SettingError as e:
        return None, str(e)
    if any(t.kind == "s" for t in terms):
        return None, "speculative decodes (sNxK@C): not modelled by the peer"
    if layer["kv_cache_dtype"] != "auto":
        return None, f"KV cache {layer['kv_cache_dtype']}: the peer reads K/V in the model dtype only"
    if layer["dtype"] not in _TORCH_DTYPES:
        return None, f"dtype {layer['dtype']}: unknown to the peer"
    if layer["alibi_slopes"] != "off":
        return None, "ALiBi: no SDPA form (it would need a dense bias per head)"
    if layer["logits_soft_cap"] != 0.0:
        return None, "logits soft cap: no SDPA form"
    if layer["sinks"] != "off":
        return None, "attention sinks: no SDPA form"
    if layer["attn_type"] != "decoder":
        return None, f"attn_type {layer['attn_type']}: the peer models decoder attention only"
    hq, hkv, d = layer["num_heads"], layer["num_kv_heads"], layer["head_size"]
    if hq <= 0 or hkv <= 0 or d <= 0 or hq % hkv:
        return None, f"geometry {hq}/{hkv}/{d}: not a valid GQA layout"
    ssm = None
    if layer["ssm_mode"] != "none":
        if layer["ssm_mode"] != "mamba1":
            return None, f"ssm_mode {layer['ssm_mode']}: the peer implements ssm_mode none and mamba1 decode steps only"
        if any(t.kind != "d" for t in terms):
            return None, "ssm_mode mamba1 with prefills or chunks: the peer implements the mamba1 decode step only"
        if layer["mamba_cache_mode"] != "none":
            return None, f"ssm_mode mamba1 with mamba_cache_mode {layer['mamba_cache_mode']}: not modelled by the peer"
        p = layer["ssm"]
        ssm = {"mode": "mamba1", "hidden": hq * d, "intermediate_size": p["intermediate_size"],
               "state_size": p["state_size"], "conv_kernel": p["conv_kernel"], "dt_rank": p["dt_rank"],
               "requests": sum(t.count for t in terms)}
        if ssm["conv_kernel"] < 2:
            return None, "ssm_mode mamba1 with conv_kernel < 2: not a valid layer"
    if path == "graph" and any(t.kind != "d" for t in terms):
        return None, "path graph on a step with prefills or chunks (graphs are for decode steps)"
    window = layer["sliding_window"]
    kinds = {"d": "decode", "p": "prefill", "c": "chunk"}
    groups = collections.OrderedDict()
    for t in terms:  # equal requests share one call (the order of first appearance)
        key = (t.kind, t.query_len, t.context_len)
        groups[key] = groups.get(key, 0) + t.count
    calls = [plan_call(kinds[k], n, q, c, window) for (k, q, c), n in groups.items()]
    plan = {"num_heads": hq, "num_kv_heads": hkv, "head_size": d, "scale": layer["scale"], "window": window,
            "dtype": layer["dtype"], "calls": calls, "ssm": ssm, "graph": path == "graph"}
    return plan, None


def plan_vllm_case(case, presets):
    """(plan, None) for a case vLLM's Triton kernels time, or (None, reason)."""
    if case.get("backend") != "cuda":
        return None, f"backend {case.get('backend')}: the peer is timed beside the cuda backend only"
    if case.get("status") != "ok":
        return None, f"the case did not run (status {case.get('status')})"
    path = case.get("path")
    if path == "graph":
        return None, "path graph: vLLM's kernels are timed eagerly"
    if path not in ("fused", "two_kernel"):
        return None, f"path {path}: unknown to the peer"
    preset = case.get("preset")
    if preset not in presets:
        return None, f"preset {preset} is not in the hybridtb CLI's preset list"
    try:
        terms = parse_mix(case.get("mix", ""))
        layer = make_layer(presets[preset], case.get("settings", []))
    except (MixError, SettingError) as e:
        return None, str(e)
    if layer["ssm_mode"] != "none":
        return None, f"ssm_mode {layer['ssm_mode']}: vLLM's attention kernel has no SSM branch or linear layer"
    if layer["attn_type"] != "decoder":
        return None, f"attn_type {layer['attn_type']}: vLLM runs it through another kernel"
    if layer["dtype"] not in _TORCH_DTYPES:
        return None, f"dtype {layer['dtype']}: unknown to the peer"
    hq, hkv, d = layer["num_heads"], layer["num_kv_heads"], layer["head_size"]
    if hq <= 0 or hkv <= 0 or d <= 0 or hq % hkv:
        return None, f"geometry {hq}/{hkv}/{d}: not a valid GQA layout"
    requests = []
    for t in terms:
        context = 0 if t.kind == "p" else t.context_len
        requests += [(context, t.query_len)] * t.count
    plan = {"num_heads": hq, "num_kv_heads": hkv, "head_size": d, "scale": layer["scale"],
            "window": layer["sliding_window"], "dtype": layer["dtype"], "kv_cache_dtype": layer["kv_cache_dtype"],
            "block_size": layer["block_size"], "softcap": layer["logits_soft_cap"],
            "alibi": layer["alibi_slopes"] != "off", "sinks": layer["sinks"] != "off", "requests": requests}
    return plan, None


def vllm_plan_bytes(plan):
    """GPU memory of the paged step: the cache (every block of every request), new K/V, Q, output, scratch."""
    e = _TORCH_DTYPES[plan["dtype"]]
    kv_e = e if plan["kv_cache_dtype"] == "auto" else 1
    hq, hkv, d, bs = plan["num_heads"], plan["num_kv_heads"], plan["head_size"], plan["block_size"]
    blocks = sum((c + q + bs - 1) // bs for c, q in plan["requests"]) + 1
    tokens = sum(q for _, q in plan["requests"])
    total = blocks * 2 * bs * hkv * d * kv_e + 4 * blocks * bs * hkv * 2
    total += tokens * (2 * hkv * d + 2 * hq * d) * e + tokens * hq * 16 * (d + 2) * 4
    return total


def plan_bytes(plan, gqa_copies=False):
    """GPU memory the step's tensors take (K/V caches, new K/V, Q, outputs, masks, mamba1 weights and states;
    with gqa_copies, the K/V repeated to the query heads)."""
    e = _TORCH_DTYPES[plan["dtype"]]
    hq, hkv, d = plan["num_heads"], plan["num_kv_heads"], plan["head_size"]
    total = 0
    for c in plan["calls"]:
        total += c.count * hkv * d * e * 2 * (c.keys + c.query_len)  # caches + new rows
        total += c.count * hq * d * e * c.query_len * 2  # q + output
        if gqa_copies and hq != hkv:
            total += c.count * hq * d * e * c.keys * 2  # K/V repeat_interleave'd to the query heads
        if c.mask in ("window", "lower_right"):
            total += c.query_len * c.keys * (1 + 4)  # the boolean mask and an additive float copy
    s = plan["ssm"]
    if s:
        h, i, n, k, r, S = (s["hidden"], s["intermediate_size"], s["state_size"], s["conv_kernel"], s["dt_rank"],
                            s["requests"])
        weights = 2 * i * h + 2 * i + i * k + i + (r + 2 * n) * i + i * r + i + i * n + i + h * i + h
        states = S * i * (k - 1) + S * i * n
        temps = S * (2 * i + i * k + r + 2 * n + 4 * i + 2 * i * n + h)
        total += 4 * (weights + 2 * states + temps)
    return total


_DEFAULT_SETTINGS = {"ssm_mode=none", "sliding_window=0", "dtype=bfloat16", "kv_cache_dtype=auto"}


def case_label(case):
    """preset mix and the settings that are not the defaults."""
    extra = [s for s in case.get("settings", []) if s not in _DEFAULT_SETTINGS]
    return " ".join([str(case.get("preset")), str(case.get("mix"))] + extra)


def case_key(case):
    """One peer timing per (case name, graph or eager): fused and two_kernel share the step."""
    return (case.get("name"), case.get("path") == "graph")


# --------------------------------------------------------------------------------------------------
# The PyTorch side (imported only when timing).
# --------------------------------------------------------------------------------------------------

class PeerFailure(Exception):
    """A selected case failed to time, or an SDPA form disagreed with the float32 check: exit 1."""


class TorchPeer:
    def __init__(self, device, repetitions, min_time_s, flush_bytes=None):
        import torch
        import torch.nn.functional as F

        self.torch, self.F = torch, F
        self.device = device
        self.cuda = device == "cuda"
        self.repetitions = repetitions
        self.min_time_s = min_time_s
        self.gqa = self._gqa_mode()
        self.lower_right = self._lower_right_fn()
        self.checked = {}
        self.last_ssm = None
        if self.cuda:
            prop = torch.cuda.get_device_properties(0)
            l2 = getattr(prop, "L2_cache_size", 0) or (128 << 20)
            self.flush_bytes = flush_bytes or max(2 * l2, 256 << 20)
            self.flush = peer_common.read_flush(self.flush_bytes)
            self.timer = peer_common.EventTimer()
        else:
            self.flush_bytes = 0
            self.flush = None
            self.timer = None

    # -- capabilities ------------------------------------------------------------------------------
    def _gqa_mode(self):
        torch, F = self.torch, self.F
        q = torch.zeros(1, 2, 1, 8, device=self.device)
        k = torch.zeros(1, 1, 3, 8, device=self.device)
        try:
            F.scaled_dot_product_attention(q, k, k, enable_gqa=True)
            return "enable_gqa"
        except TypeError:
            return "repeat_interleave"

    def _lower_right_fn(self):
        try:
            from torch.nn.attention.bias import causal_lower_right

            return causal_lower_right
        except ImportError:
            return None

    def environment(self):
        torch = self.torch
        env = {"impl": IMPL, "kv": KV_NOTE, "torch": torch.__version__, "cuda": torch.version.cuda,
               "gqa": ("enable_gqa=True" if self.gqa == "enable_gqa" else
                       "K/V repeat_interleave'd to the query heads inside the timed step"),
               "allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
               "repetitions": self.repetitions, "min_time_s": self.min_time_s}
        if self.cuda:
            env.update(peer_common.environment())
            env["l2_flush_bytes"] = self.flush_bytes
            env["timing"] = ("cuda_events: per iteration restore, L2 flush (a 256 MiB read), device sync, "
                             "events around the step; repetition = mean over iterations (min_time_s), median over "
                             "repetitions")
        else:
            import datetime
            import platform

            env.update(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       device=f"cpu ({platform.processor() or platform.machine()})",
                       timing="wall clock (perf_counter), no L2 flush: --device cpu is for testing, not for numbers")
        return env

    # -- building a step ---------------------------------------------------------------------------
    def _dtype(self, name):
        return {"bfloat16": self.torch.bfloat16, "float16": self.torch.float16, "float32": self.torch.float32}[name]

    def sdpa(self, q, k, v, hq, hkv, scale, mask=None, causal=False):
        F = self.F
        if hq != hkv:
            if self.gqa == "enable_gqa":
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                                      enable_gqa=True)
            k = k.repeat_interleave(hq // hkv, dim=1)
            v = v.repeat_interleave(hq // hkv, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)

    def window_mask(self, query_len, context_len, key_begin, keys, window):
        """Dense boolean [query_len, keys]: query i (position context+i) sees key key_begin+j iff it is at or
        before it and, with a window, less than `window` behind."""
        torch = self.torch
        p = torch.arange(query_len, device=self.device)[:, None] + context_len
        k = torch.arange(keys, device=self.device)[None, :] + key_begin
        visible = k <= p
        if window > 0:
            visible &= p - k < window
        return visible

    def mask_for(self, call, window, use_lower_right=True):
        """(attn_mask, is_causal) for a call."""
        if call.mask == "none":
            return None, False
        if call.mask == "causal":
            return None, True
        if call.mask == "lower_right" and use_lower_right and self.lower_right is not None:
            return self.lower_right(call.query_len, call.keys), False
        return self.window_mask(call.query_len, call.context_len, call.key_begin, call.keys,
                                window if call.mask == "window" else 0), False

    def check_forms(self, plan):
        """Each SDPA form the plan uses, on a small problem of its geometry, against a float32 softmax:
        a form that disagrees fails the run (PeerFailure), except the lower-right causal bias, which falls
        back to the dense mask. Cached per geometry and form."""
        torch = self.torch
        hq, hkv, d, scale = plan["num_heads"], plan["num_kv_heads"], plan["head_size"], plan["scale"]
        dtype = self._dtype(plan["dtype"])
        window = plan["window"]
        gen = torch.Generator(device=self.device).manual_seed(1)
        for call in plan["calls"]:
            key = (hq, hkv, d, plan["dtype"], scale, call.mask, window if call.mask == "window" else 0)
            if key in self.checked:
                continue
            small_w = min(window, 24) if call.mask == "window" else 0
            small = {"none": plan_call("decode", 2, 1, 37, small_w),
                     "causal": plan_call("prefill", 2, 40, 0, 0),
                     "lower_right": plan_call("chunk", 2, 24, 40, 0),
                     "window": plan_call("chunk", 2, 24, 40, small_w)}[call.mask]
            if call.mask == "none" and window > 0:
                small = plan_call("decode", 2, 1, 37, min(window, 24))
            q = torch.randn(2, hq, small.query_len, d, generator=gen, device=self.device).to(dtype)
            k = torch.randn(2, hkv, small.keys, d, generator=gen, device=self.device).to(dtype)
            v = torch.randn(2, hkv, small.keys, d, generator=gen, device=self.device).to(dtype)
            vis = self.window_mask(small.query_len, small.context_len, small.key_begin, small.keys,
                                   small_w if small.mask == "window" else 0)
            kf = k.float().repeat_interleave(hq // hkv, dim=1)
            vf = v.float().repeat_interleave(hq // hkv, dim=1)
            s = (q.float() @ kf.transpose(-1, -2)) * scale
            ref = torch.softmax(s.masked_fill(~vis, float("-inf")), dim=-1) @ vf
            tol = 1e-4 if dtype == torch.float32 else 3e-2

            def err(use_lower_right=True):
                mask, causal = self.mask_for(small, small_w, use_lower_right)
                out = self.sdpa(q, k, v, hq, hkv, scale, mask, causal)
                return (out.float() - ref).abs().max().item()

            try:
                e = err()
            except Exception as ex:  # noqa: BLE001 (a form torch cannot run)
                if call.mask != "lower_right":
                    raise PeerFailure(f"SDPA form '{call.mask}' fails on {hq}/{hkv}/{d} {plan['dtype']}: {ex}")
                e = math.inf
            use_lower_right = True
            if call.mask == "lower_right" and not e <= tol:
                use_lower_right = False
                e = err(False)
            if not e <= tol:
                raise PeerFailure(f"SDPA form '{call.mask}' on {hq}/{hkv}/{d} {plan['dtype']}: max abs error {e:.3g} "
                                  f"against a float32 softmax (tolerance {tol})")
            self.checked[key] = use_lower_right

    def build(self, plan):
        """(step, restore, calls): the step as a callable, the restore of what it mutates, its calls described."""
        torch = self.torch
        F = self.F
        self.check_forms(plan)
        hq, hkv, d, scale, window = (plan["num_heads"], plan["num_kv_heads"], plan["head_size"], plan["scale"],
                                     plan["window"])
        dtype = self._dtype(plan["dtype"])
        dev = self.device

        def randn(*shape):
            return torch.randn(*shape, device=dev, dtype=dtype)

        ssm = plan["ssm"]
        q_all = None
        if ssm is not None:  # decode-only: one hidden tensor [S, Hq·D]; each group's query is a view of its rows
            q_all = randn(ssm["requests"], hq * d)
        steps = []
        described = []
        row = 0
        for call in plan["calls"]:
            n, L = call.count, call.query_len
            if q_all is not None:
                q = q_all[row:row + n].view(n, hq, 1, d)
            else:
                q = randn(n, hq, L, d)
            row += n
            kc, vc = randn(n, hkv, call.keys, d), randn(n, hkv, call.keys, d)
            kn, vn = randn(n, hkv, L, d), randn(n, hkv, L, d)
            check_key = (hq, hkv, d, plan["dtype"], scale, call.mask, window if call.mask == "window" else 0)
            use_lower_right = self.checked.get(check_key, True)
            mask, causal = self.mask_for(call, window, use_lower_right)
            first_new = call.keys - L
            text = describe_call(call)
            if call.mask == "lower_right" and not use_lower_right:
                text = text.replace("causal_lower_right", "dense causal mask (lower-right bias failed its check)")
            described.append(text)

            def one(q=q, kc=kc, vc=vc, kn=kn, vn=vn, mask=mask, causal=causal, first_new=first_new):
                kc[:, :, first_new:].copy_(kn)  # the KV-cache write of the step's new rows
                vc[:, :, first_new:].copy_(vn)
                return self.sdpa(q, kc, vc, hq, hkv, scale, mask, causal)

            steps.append(one)

        if ssm is None:
            def step():
                return [one() for one in steps]

            return step, None, described

        # mamba1 decode (vLLM's MambaMixer, decode branch) on the query rows, float32 as our kernels compute.
        f32 = torch.float32
        S, H = ssm["requests"], ssm["hidden"]
        I, N, K, R = ssm["intermediate_size"], ssm["state_size"], ssm["conv_kernel"], ssm["dt_rank"]

        def normal(*shape, std):
            return torch.randn(*shape, device=dev, dtype=f32) * std

        def uniform(*shape, low, high):
            return torch.rand(*shape, device=dev, dtype=f32) * (high - low) + low

        w = {"in_proj": normal(2 * I, H, std=H ** -0.5), "in_proj_bias": normal(2 * I, std=0.1),
             "conv_w": normal(I, K, std=K ** -0.5), "conv_b": normal(I, std=0.1),
             "x_proj": normal(R + 2 * N, I, std=I ** -0.5), "dt_proj": normal(I, R, std=R ** -0.5),
             "dt_bias": uniform(I, low=-6.9, high=-2.25), "A": -torch.exp(uniform(I, N, low=0.0, high=math.log(16.0))),
             "D": uniform(I, low=0.5, high=1.5), "out_proj": normal(H, I, std=I ** -0.5),
             "out_proj_bias": normal(H, std=0.1)}
        conv0, ssm0 = torch.randn(S, I, K - 1, device=dev, dtype=f32), torch.randn(S, I, N, device=dev, dtype=f32)
        conv_state, ssm_state = conv0.clone(), ssm0.clone()
        rows = [(c.count) for c in plan["calls"]]

        def restore():
            conv_state.copy_(conv0)
            ssm_state.copy_(ssm0)

        def mamba1(hidden):
            xz = F.linear(hidden.float(), w["in_proj"], w["in_proj_bias"])  # [S, 2I]
            x, z = xz[:, :I], xz[:, I:]
            window_ = torch.cat([conv_state, x.unsqueeze(-1)], dim=-1)  # [S, I, K]: saved inputs, then the token
            c = F.silu((window_ * w["conv_w"]).sum(-1) + w["conv_b"])
            conv_state.copy_(window_[:, :, 1:])
            dbc = F.linear(c, w["x_proj"])  # [S, R + 2N]
            dt = F.linear(dbc[:, :R], w["dt_proj"])
            B, C = dbc[:, R:R + N], dbc[:, R + N:]
            y = peer_common.selective_state_update(ssm_state, c, dt, z, B, C, w["A"], w["D"], w["dt_bias"])
            return F.linear(y, w["out_proj"], w["out_proj_bias"])  # [S, H]

        def step():
            contribution = mamba1(q_all).to(dtype)
            outs = []
            begin = 0
            for one, n in zip(steps, rows):  # the hybrid add: attention output + the SSM contribution
                outs.append(one().reshape(n, H) + contribution[begin:begin + n])
                begin += n
            return outs

        # For --self-test: the pieces, to check the mixer against a per-element loop.
        self.last_ssm = {"weights": w, "conv0": conv0, "ssm0": ssm0, "conv_state": conv_state, "ssm_state": ssm_state,
                         "hidden": q_all, "mamba1": mamba1}
        described.append(f"mamba1 decode of {S} requests (I {I}, N {N}, K {K}, dt_rank {R}): float32 eager, "
                         f"then added into the attention output")
        return step, restore, described

    # -- timing ------------------------------------------------------------------------------------
    def _iteration_s(self, fn, restore):
        if restore is not None:
            restore()
        if self.cuda:
            self.flush()  # evict L2 by a read, as hybridtb_bench's flush (clean lines: no write-back in the step)
            return self.timer.time_s(fn, idle=True)
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    def measure(self, step, restore, graph):
        """Per repetition the mean over iterations until min_time_s of timed work; returns (times, iterations)."""
        torch = self.torch
        fn = step
        with torch.inference_mode(False), torch.no_grad():
            if graph:
                if not self.cuda:
                    raise PeerFailure("path graph needs CUDA")
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):
                        if restore is not None:
                            restore()
                        step()
                torch.cuda.current_stream().wait_stream(side)
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                if restore is not None:
                    restore()
                with torch.cuda.graph(g):
                    step()
                fn = g.replay
            for _ in range(2):  # untimed warm-up steps
                if restore is not None:
                    restore()
                fn()
            if self.cuda:
                torch.cuda.synchronize()
            times, iterations = [], []
            for _ in range(self.repetitions):
                total, n = 0.0, 0
                while total < self.min_time_s or n == 0:
                    total += self._iteration_s(fn, restore)
                    n += 1
                times.append(total / n)
                iterations.append(n)
        return times, iterations

    def free_bytes(self):
        if not self.cuda:
            return None
        free, _ = self.torch.cuda.mem_get_info()
        return free

    def release(self):
        self.last_ssm = None
        if self.cuda:
            self.torch.cuda.empty_cache()


def quartiles(values):
    v = sorted(values)
    if len(v) == 1:
        return v[0], v[0], v[0]
    q = statistics.quantiles(v, n=4, method="inclusive")
    return q[0], statistics.median(v), q[2]


# --------------------------------------------------------------------------------------------------
# Driver
# --------------------------------------------------------------------------------------------------

def load_results(path):
    try:
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"{path}: cannot read JSON: {e}")
    if not isinstance(doc, dict) or doc.get("schema") != "hybridtb-bench-results":
        raise UsageError(f"{path}: not a hybridtb_bench results file (schema hybridtb-bench-results)")
    if not isinstance(doc.get("cases"), list):
        raise UsageError(f"{path}: no cases list")
    return doc


def select_cases(doc, presets, pattern=None):
    """[(index, plan or None, reason or None)] for every case, in order."""
    regex = re.compile(pattern) if pattern else None
    out = []
    for i, case in enumerate(doc["cases"]):
        plan, reason = plan_case(case, presets)
        if plan is not None and regex and not regex.search(f"{case.get('backend')}/{case.get('path')}/{case.get('name')}"):
            plan, reason = None, f"not selected (--filter {pattern})"
        out.append((i, plan, reason))
    return out


def annotate(doc, selection, timings, environment):
    """A copy of doc with `peer` / `peer_skip_reason` / `peer_error` on every case and `peer_environment`.
    `timings`: {case_key: {"times_s", "iterations", "calls", "impl"} or {"error": text} or {"skip": text}}."""
    out = json.loads(json.dumps(doc))  # deep copy; the input's values stay as they were
    for i, plan, reason in selection:
        case = out["cases"][i]
        if plan is None:
            case["peer_skip_reason"] = reason
            continue
        t = timings.get(case_key(case))
        if t is None:
            case["peer_skip_reason"] = "not timed"
        elif "error" in t:
            case["peer_error"] = t["error"]
        elif "skip" in t:
            case["peer_skip_reason"] = t["skip"]
        else:
            q1, med, q3 = quartiles(t["times_s"])
            # Like for like: the peer's time includes its host launches, as our latency does.
            ours_gpu = case.get("median_s")
            ours = case.get("latency_median_s", ours_gpu)
            case["peer"] = {"impl": t["impl"], "median_s": med, "times_s": t["times_s"],
                            "iterations": t["iterations"], "q1_s": q1, "q3_s": q3,
                            "rel_iqr": (q3 - q1) / med if med > 0 else None,
                            "ratio": med / ours if ours else None,
                            "ratio_gpu_time": med / ours_gpu if ours_gpu else None,
                            "calls": t["calls"], "timing": t["timing"]}
    out["peer_environment"] = environment
    return out


def annotate_vllm(out, doc, presets, timings, environment):
    """`vllm_peer` / `vllm_peer_skip_reason` / `vllm_peer_error` on every case of `out` (in place), and
    `vllm_peer_environment`. `timings` as annotate's, keyed by case name."""
    for i, case in enumerate(out["cases"]):
        plan, reason = plan_vllm_case(doc["cases"][i], presets)
        if plan is None:
            case["vllm_peer_skip_reason"] = reason
            continue
        t = timings.get(case.get("name"))
        if t is None:
            case["vllm_peer_skip_reason"] = "not timed"
        elif "error" in t:
            case["vllm_peer_error"] = t["error"]
        elif "skip" in t:
            case["vllm_peer_skip_reason"] = t["skip"]
        else:
            q1, med, q3 = quartiles(t["times_s"])
            ours_gpu = case.get("median_s")
            ours = case.get("latency_median_s", ours_gpu)
            case["vllm_peer"] = {"impl": t["impl"], "median_s": med, "times_s": t["times_s"],
                                 "iterations": t["iterations"], "q1_s": q1, "q3_s": q3,
                                 "rel_iqr": (q3 - q1) / med if med > 0 else None,
                                 "ratio": med / ours if ours else None,
                                 "ratio_gpu_time": med / ours_gpu if ours_gpu else None,
                                 "calls": t["calls"], "timing": t["timing"]}
    out["vllm_peer_environment"] = environment
    return out


def time_vllm(args, doc, presets, peer):
    """Times every case vLLM's kernels cover; returns (timings by case name, environment, failures)."""
    import triton
    import vllm_attention_peer
    from vllm_kernels import load

    kernels = load(args.vllm)
    environment = {"impl": kernels.describe(), "vllm_files": kernels.source_files, "triton": triton.__version__,
                   "kv": "paged cache, shuffled physical blocks, one block-table row per request (the cuda backend's "
                         "layout); the step = vLLM's KV-cache write + its unified attention",
                   "timing": "as the PyTorch peer: per iteration L2 flush (a 256 MiB read), device sync, CUDA "
                             "events around the step; repetition = mean over iterations (min_time_s), median over "
                             "repetitions"}
    timings, failed = {}, 0
    print(f"{'case (vLLM Triton peer)':<70} {'ours_us':>10} {'vllm_us':>10} {'vllm/ours':>9}")
    for case in doc["cases"]:
        plan, _ = plan_vllm_case(case, presets)
        name = case.get("name")
        if plan is None or name in timings:
            continue
        reps = args.repetitions or int(case.get("repetitions") or 5)
        peer.repetitions = reps
        free = peer.free_bytes()
        need = vllm_plan_bytes(plan)
        if free is not None and need > 0.9 * free:
            timings[name] = {"skip": f"needs ~{need / 2**30:.1f} GiB of GPU memory, {free / 2**30:.1f} GiB free"}
            continue
        try:
            s = vllm_attention_peer.PagedStep(
                kernels, plan["requests"], plan["window"], hq=plan["num_heads"], hkv=plan["num_kv_heads"],
                d=plan["head_size"], dtype=plan["dtype"], kv_cache_dtype=plan["kv_cache_dtype"],
                block_size=plan["block_size"], scale=plan["scale"], softcap=plan["softcap"], alibi=plan["alibi"],
                sinks=plan["sinks"], split_k=vllm_attention_peer.split_k_for(kernels, plan["num_kv_heads"]))
            times, iterations = peer.measure(s.step, None, False)
            calls = [f"{kernels.describe()}: KV write of {len(s.slots)} tokens, then unified attention over "
                     f"{len(plan['requests'])} requests"]
            timings[name] = {"times_s": times, "iterations": iterations, "calls": calls, "impl": kernels.describe(),
                             "timing": "cuda_events"}
            med = statistics.median(times)
            ours = case.get("latency_median_s", case.get("median_s"))
            print(f"{case_label(case)[:70]:<70} {ours * 1e6:>10.1f} {med * 1e6:>10.1f} {med / ours:>9.2f}", flush=True)
        except Exception as e:  # noqa: BLE001 (out of memory, a kernel error: record, go on, exit 1)
            timings[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
            failed += 1
            print(f"{case_label(case)[:70]:<70} FAILED: {timings[name]['error'][:200]}", flush=True)
        finally:
            s = None
            peer.release()
    return timings, environment, failed


def write_atomically(path, doc):
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp-peer", dir=directory)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)  # hybridtb_bench's layout: the input's bytes stay as they were
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def print_plan(doc, selection):
    covered = 0
    for i, plan, reason in selection:
        case = doc["cases"][i]
        label = f"{case.get('backend')}/{case.get('path')}/{case.get('name')}"
        if plan is None:
            print(f"skip   {label}: {reason}")
            continue
        covered += 1
        print(f"time   {label}  (~{plan_bytes(plan) / 2**30:.2f} GiB)")
        for c in plan["calls"]:
            print(f"         {describe_call(c)}")
        if plan["ssm"]:
            print(f"         + mamba1 decode of {plan['ssm']['requests']} requests")
    print(f"{covered} of {len(selection)} cases timed by the peer, {len(selection) - covered} skipped")


def run(args):
    doc = load_results(args.results)
    presets = presets_from_cli(find_hybridtb(args.hybridtb, doc))
    selection = select_cases(doc, presets, args.filter)
    if args.plan:
        print_plan(doc, selection)
        return 0
    if not args.out:
        raise UsageError("--out is required (or --plan)")
    try:
        import torch
    except ImportError as e:
        print(f"suite_peer: cannot import torch ({e}): the peer runs on the GPU machine", file=sys.stderr)
        return 2
    if args.device == "cuda" and not torch.cuda.is_available():
        print("suite_peer: no CUDA device (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    peer = TorchPeer(args.device, args.repetitions or 5, args.min_time)
    environment = peer.environment()
    environment["repetitions"] = args.repetitions or "the case's (hybridtb_bench's repetitions)"
    results_gpu = ((doc.get("environment") or {}).get("gpu") or {}).get("name")
    environment["results_gpu"] = results_gpu
    environment["same_device_as_results"] = results_gpu == environment.get("device")
    if args.device == "cuda" and results_gpu != environment.get("device"):
        print(f"suite_peer: warning: the results ran on {results_gpu}, the peer runs on {environment.get('device')}: "
              f"the ratios compare different GPUs", file=sys.stderr)
    environment["results_file"] = os.path.basename(args.results)
    environment["command"] = " ".join([os.path.relpath(__file__, os.getcwd())] + sys.argv[1:])

    timings = {}
    failed = 0
    by_key = collections.OrderedDict()
    for i, plan, _ in selection:
        if plan is not None:
            by_key.setdefault(case_key(doc["cases"][i]), (i, plan))
    print(f"{'case':<70} {'path':<10} {'ours_us':>10} {'peer_us':>10} {'peer/ours':>9}")
    for key, (i, plan) in by_key.items():
        case = doc["cases"][i]
        reps = args.repetitions or int(case.get("repetitions") or 5)
        peer.repetitions = reps
        if plan["graph"] and not peer.cuda:
            timings[key] = {"skip": "path graph needs CUDA (--device cpu)"}
            continue
        need = plan_bytes(plan, peer.gqa != "enable_gqa")
        free = peer.free_bytes()
        label = case_label(case)
        if free is not None and need > 0.9 * free:
            timings[key] = {"skip": f"needs ~{need / 2**30:.1f} GiB of GPU memory, {free / 2**30:.1f} GiB free"}
            print(f"{label[:70]:<70} {case.get('path'):<10} skipped: {timings[key]['skip']}", flush=True)
            continue
        try:
            step, restore, calls = peer.build(plan)
            times, iterations = peer.measure(step, restore, plan["graph"])
            impl = IMPL + (" + mamba1 (float32 eager)" if plan["ssm"] else "") + (", CUDA graph" if plan["graph"] else "")
            timings[key] = {"times_s": times, "iterations": iterations, "calls": calls, "impl": impl,
                            "timing": "cuda_events" if peer.cuda else "wall_clock"}
            med = statistics.median(times)
            for j, p2, _ in selection:
                c2 = doc["cases"][j]
                if p2 is not None and case_key(c2) == key:
                    print(f"{label[:70]:<70} {c2.get('path'):<10} {c2['median_s'] * 1e6:>10.1f} {med * 1e6:>10.1f} "
                          f"{med / c2['median_s']:>9.2f}", flush=True)
        except PeerFailure as e:
            timings[key] = {"error": str(e)}
            failed += 1
            print(f"{label[:70]:<70} FAILED: {e}", flush=True)
        except Exception as e:  # noqa: BLE001 (out of memory, a torch error: record, go on, exit 1)
            timings[key] = {"error": f"{type(e).__name__}: {e}"[:500]}
            failed += 1
            print(f"{label[:70]:<70} FAILED: {timings[key]['error'][:200]}", flush=True)
        finally:
            step = restore = None
            peer.release()
    out = annotate(doc, selection, timings, environment)
    if args.vllm:
        vllm_timings, vllm_environment, vllm_failed = time_vllm(args, doc, presets, peer)
        failed += vllm_failed
        annotate_vllm(out, doc, presets, vllm_timings, vllm_environment)
    write_atomically(args.out, out)
    timed = sum(1 for c in out["cases"] if "peer" in c)
    print(f"suite_peer: {timed} cases with a peer, {sum(1 for c in out['cases'] if 'peer_skip_reason' in c)} skipped, "
          f"{failed} timing failures -> {args.out}")
    return 1 if failed else 0


# --------------------------------------------------------------------------------------------------
# --self-test: the pure-Python parts on synthetic input (no torch, no GPU); with torch importable, the
# SDPA forms and the mamba1 step on the CPU as well.
# --------------------------------------------------------------------------------------------------

# `hybridtb gen --list-presets` as the CLI prints it (the parser's fixture; the CLI's own output is
# parsed too when a build is found).
_PRESETS_FIXTURE = """
Presets (--preset NAME, a comma list, or all):
  llama3-8b: Llama-3-8B: GQA 32/8, head 128, full causal attention
      num_heads=32 num_kv_heads=8 head_size=128
  mistral-7b: Mistral-7B-v0.1: GQA 32/8, head 128, sliding window 4096 on every layer
      num_heads=32 num_kv_heads=8 head_size=128 sliding_window=4096
  gemma3-local-128: a Gemma-3-27B local layer: 32/16, head 128, window 1024, scale 1/sqrt(168)
      num_heads=32 num_kv_heads=16 head_size=128 sliding_window=1024 scale=1/sqrt(168)
  gpt-oss: a gpt-oss sliding layer: 64/8, head 64, window 128, learned sinks (a fixed spread here)
      num_heads=64 num_kv_heads=8 head_size=64 sliding_window=128 sinks=on
  hymba-small: Hymba-1.5B's geometry: 25/5 heads of 64 (hidden 1600), window 1024, mamba1 branch (intermediate 3200, state 16, conv 4, dt_rank 100)
      num_heads=25 num_kv_heads=5 head_size=64 sliding_window=1024 ssm_mode=mamba1 ssm.intermediate_size=3200 ssm.state_size=16 ssm.conv_kernel=4 ssm.dt_rank=100

Settings (--set key=value, repeatable, applied after the preset):
  num_heads = int
      query heads Hq
"""


def _synthetic_case(backend, path, preset, mix, settings, status="ok", median_s=1e-4):
    return {"backend": backend, "path": path, "preset": preset, "mix": mix, "settings": settings, "status": status,
            "name": "/".join([preset, mix] + settings), "median_s": median_s, "repetitions": 5, "group": "g"}


def _std(ssm="none", window=0, dtype="bfloat16", kv="auto"):
    return [f"ssm_mode={ssm}", f"sliding_window={window}", f"dtype={dtype}", f"kv_cache_dtype={kv}"]


def self_test(verbose=False, hybridtb=None):
    checks = []

    def check(name, condition, detail=""):
        checks.append((name, bool(condition), detail))
        if verbose or not condition:
            print(f"{'ok  ' if condition else 'FAIL'} {name}{(': ' + str(detail)) if detail and not condition else ''}")

    def raises(fn, exc, fragment):
        try:
            fn()
        except exc as e:
            return fragment in str(e), str(e)
        return False, "no exception"

    # -- the mix grammar ------------------------------------------------------------------------------
    m = parse_mix("p2x2048 + d64@4096")
    check("mix: order and k", m == [Term("d", 64, 1, 4096), Term("p", 2, 2048, 0)], m)
    check("mix: canonical", canonical_mix(m) == "d64@4k+p2x2k", canonical_mix(m))
    for text in ("d64@4k+c1x512@8k+p2x2k", "s8x4@1k", "s64x2@8k+d64@8k", "d1@1k", "c1x2k@4k", "d5@100+p3x17"):
        check(f"mix: canonical fixed point {text}", canonical_mix(parse_mix(canonical_mix(parse_mix(text))))
              == canonical_mix(parse_mix(text)))
    check("mix: s64x2@8k+d64@8k keeps written order within decodes",
          parse_mix("s64x2@8k+d64@8k") == [Term("s", 64, 2, 8192), Term("d", 64, 1, 8192)])
    check("mix: chunk after decodes", [t.kind for t in parse_mix("p1x1+c2x3@4+d1@7")] == ["d", "c", "p"])
    check("mix: tabs and K", parse_mix("\td8@1K ") == [Term("d", 8, 1, 1024)])
    for bad, fragment in (("d64@4k+p2y", "term 2 'p2y' at character 10: expected 'x' after the count of a prefill"),
                          ("", "empty term"), ("d64@4k+", "empty term"), ("x1", "a term starts with"),
                          ("d0@4", "the count N must be >= 1"), ("s4x1@8", "K = 1 + num_speculative_tokens"),
                          ("c1x4@0", "context C must be >= 1"), ("d4k@8", "the suffix 'k' is for lengths"),
                          ("p1x0", "the length L must be >= 1"), ("d1@2x", "unexpected 'x' after a complete decode"),
                          ("d1@99999999999", "larger than"), ("p1x2097152k", "larger than")):
        ok, detail = raises(lambda bad=bad: parse_mix(bad), MixError, fragment)
        check(f"mix error: {bad!r}", ok, detail)

    # -- presets and settings -------------------------------------------------------------------------
    presets = parse_presets(_PRESETS_FIXTURE)
    check("presets: parsed", sorted(presets) == ["gemma3-local-128", "gpt-oss", "hymba-small", "llama3-8b",
                                                 "mistral-7b"], sorted(presets))
    layer = make_layer(presets["gemma3-local-128"], _std(window=1024))
    check("settings: scale 1/sqrt(168)", abs(layer["scale"] - 168 ** -0.5) < 1e-15, layer["scale"])

    # -- the vLLM peer's plan -------------------------------------------------------------------------
    plan, reason = plan_vllm_case(_synthetic_case("cuda", "fused", "llama3-8b", "s8x4@1k+d2@100",
                                                  _std(kv="fp8_e4m3")), presets)
    check("vllm plan: speculative decodes with an fp8 cache are timed", plan is not None, reason)
    check("vllm plan: one (context, query_len) per request, prefill context 0",
          plan is not None and plan["requests"] == [(1024, 4)] * 8 + [(100, 1)] * 2, plan and plan["requests"])
    plan, _ = plan_vllm_case(_synthetic_case("cuda", "fused", "llama3-8b", "d1@10+p2x30", _std()), presets)
    check("vllm plan: prefills start at context 0", plan is not None and plan["requests"][1:] == [(0, 30)] * 2,
          plan and plan["requests"])
    plan, _ = plan_vllm_case(_synthetic_case("cuda", "fused", "gpt-oss", "d4@1k", _std(window=128)), presets)
    check("vllm plan: sinks and window from the preset", plan is not None and plan["sinks"] and plan["window"] == 128)
    for case, fragment in ((_synthetic_case("cuda", "fused", "hymba-small", "d8@1k", _std(ssm="mamba1")), "ssm_mode"),
                           (_synthetic_case("cuda", "graph", "llama3-8b", "d8@1k", _std()), "graph"),
                           (_synthetic_case("reference", "fused", "llama3-8b", "d8@1k", _std()), "backend")):
        plan, reason = plan_vllm_case(case, presets)
        check(f"vllm plan: skips ({fragment})", plan is None and fragment in reason, reason)
    layer = make_layer(presets["llama3-8b"], _std() + ["head_size=64"])
    check("settings: auto scale follows head_size", abs(layer["scale"] - 0.125) < 1e-15, layer["scale"])
    layer = make_layer(presets["hymba-small"], ["ssm_mode=prefix_sum", "ssm_mode=mamba1"])
    check("settings: switching mode drops ssm.*, mamba1 defaults",
          layer["ssm"] == {"intermediate_size": 3200, "state_size": 16, "conv_kernel": 4, "dt_rank": 100}, layer["ssm"])
    layer = make_layer(presets["hymba-small"], ["ssm_mode=mamba1", "ssm.intermediate_size=32", "num_heads=2",
                                                "head_size=32"])
    check("settings: same mode keeps ssm.*", layer["ssm"]["intermediate_size"] == 32 and layer["ssm"]["dt_rank"] == 100,
          layer["ssm"])
    layer = make_layer(presets["llama3-8b"], ["sliding_window=4k", "ssm_mode=mamba1"])
    check("settings: k suffix, mamba1 defaults from hidden",
          layer["sliding_window"] == 4096 and layer["ssm"] == {"intermediate_size": 8192, "state_size": 16,
                                                               "conv_kernel": 4, "dt_rank": 256}, layer)
    ok, detail = raises(lambda: make_layer([], ["windw=3"]), SettingError, "does not know")
    check("settings: unknown key", ok, detail)
    ok, detail = raises(lambda: make_layer([], ["sliding_window=abc"]), SettingError, "expected an integer")
    check("settings: bad integer", ok, detail)

    # -- case selection -------------------------------------------------------------------------------
    C = _synthetic_case
    cases = [
        C("cuda", "fused", "llama3-8b", "d64@4k", _std()),  # 0 covered
        C("reference", "fused", "llama3-8b", "d64@4k", _std()),  # 1 backend
        C("cuda", "fused", "llama3-8b", "p1x4k", _std(), status="skipped"),  # 2 did not run
        C("cuda", "fused", "llama3-8b", "s8x4@4k", _std()),  # 3 speculative
        C("cuda", "fused", "llama3-8b", "d8@1k", _std(kv="fp8_e4m3")),  # 4 fp8
        C("cuda", "fused", "llama3-8b", "d8@1k", _std(kv="int8_per_token_head")),  # 5 int8
        C("cuda", "fused", "gpt-oss", "d64@8k", _std(window=128)),  # 6 sinks
        C("cuda", "fused", "llama3-8b", "d8@1k", _std() + ["alibi_slopes=on"]),  # 7 alibi
        C("cuda", "fused", "llama3-8b", "d8@1k", _std() + ["logits_soft_cap=30"]),  # 8 soft cap
        C("cuda", "fused", "hymba-small", "d8@1k+p1x128", _std(ssm="mamba1", window=1024)),  # 9 mamba1 + prefill
        C("cuda", "fused", "hymba-small", "d8@1k", _std(ssm="prefix_sum", window=1024)),  # 10 other SSM
        C("cuda", "fused", "hymba-small", "d8@1k", _std(ssm="mamba1", window=1024)),  # 11 mamba1 decode: covered
        C("cuda", "two_kernel", "hymba-small", "d8@1k", _std(ssm="mamba1", window=1024)),  # 12 covered, shares 11
        C("cuda", "graph", "hymba-small", "d8@1k", _std(ssm="mamba1", window=1024)),  # 13 covered, own timing
        C("cuda", "fused", "llama3-8b", "d64@4k+c1x2k@4k", _std(window=1024)),  # 14 mixed windowed: covered
        C("cuda", "fused", "llama3-8b", "d8@1k", _std(dtype="float16")),  # 15 fp16: covered
        C("cuda", "fused", "unknown-preset", "d8@1k", _std()),  # 16 preset
        C("cuda", "fused", "llama3-8b", "d8@1k", _std() + ["attn_type=encoder_only"]),  # 17 encoder-only
        C("cuda", "fused", "llama3-8b", "d8@1k", _std(), status="error"),  # 18 error
        C("cuda", "fused", "llama3-8b", "d8@1k+d8@1k+d4@2k", _std()),  # 19 groups merge
        C("cuda", "fused", "hymba-small", "d8@1k", _std(ssm="mamba1", window=1024) + ["mamba_cache_mode=all"]),  # 20
        C("cuda", "fused", "llama3-8b", "d8@1k", _std() + ["frobnicate=1"]),  # 21 unknown setting
        C("cuda", "fused", "mistral-7b", "p1x16k", _std(window=4096)),  # 22 windowed prefill: covered
    ]
    doc = {"schema": "hybridtb-bench-results", "version": 1, "environment": {"gpu": {"name": "X"}}, "cases": cases,
           "ceilings": {}}
    selection = select_cases(doc, presets)
    reasons = {i: r for i, _, r in selection}
    plans = {i: p for i, p, _ in selection}
    expect_covered = {0, 11, 12, 13, 14, 15, 19, 22}
    check("selection: covered set", {i for i, p in plans.items() if p} == expect_covered,
          sorted(i for i, p in plans.items() if p))
    for i, fragment in ((1, "cuda backend only"), (2, "did not run (status skipped)"), (3, "speculative"),
                        (4, "fp8_e4m3"), (5, "int8_per_token_head"), (6, "sinks"), (7, "ALiBi"), (8, "soft cap"),
                        (9, "prefills or chunks"), (10, "prefix_sum"), (16, "preset unknown-preset"),
                        (17, "encoder_only"), (18, "status error"), (20, "mamba_cache_mode all"),
                        (21, "frobnicate")):
        check(f"selection: case {i} reason mentions {fragment!r}", reasons[i] and fragment in reasons[i], reasons[i])
    check("selection: every skipped case has a reason", all((p is None) == bool(r) for _, p, r in selection))
    p0 = plans[0]
    check("plan: d64@4k one call, all keys", p0["calls"] == [Call("decode", 64, 1, 4096, 0, 4097, "none")], p0["calls"])
    check("plan: llama3 geometry", (p0["num_heads"], p0["num_kv_heads"], p0["head_size"], p0["dtype"]) ==
          (32, 8, 128, "bfloat16"))
    p14 = plans[14]
    check("plan: windowed mixed step", p14["calls"] == [Call("decode", 64, 1, 4096, 3073, 1024, "none"),
                                                         Call("chunk", 1, 2048, 4096, 3073, 3071, "window")],
          p14["calls"])
    check("plan: fp16", plans[15]["dtype"] == "float16")
    check("plan: equal requests merge, contexts apart",
          plans[19]["calls"] == [Call("decode", 16, 1, 1024, 0, 1025, "none"), Call("decode", 4, 1, 2048, 0, 2049, "none")],
          plans[19]["calls"])
    check("plan: mamba1 decode", plans[11]["ssm"] == {"mode": "mamba1", "hidden": 1600, "intermediate_size": 3200,
                                                      "state_size": 16, "conv_kernel": 4, "dt_rank": 100,
                                                      "requests": 8} and plans[13]["graph"], plans[11]["ssm"])
    check("plan: windowed prefill", plans[22]["calls"] == [Call("prefill", 1, 16384, 0, 0, 16384, "window")],
          plans[22]["calls"])
    check("plan: calls", plan_call("chunk", 1, 512, 4096, 0).mask == "lower_right"
          and plan_call("prefill", 4, 2048, 0, 0).mask == "causal"
          and plan_call("prefill", 1, 1024, 0, 1024).mask == "causal"  # the window does not bind
          and plan_call("prefill", 1, 1025, 0, 1024).mask == "window"
          and plan_call("decode", 8, 1, 8192, 128) == Call("decode", 8, 1, 8192, 8065, 128, "none")
          and plan_call("decode", 8, 1, 100, 128) == Call("decode", 8, 1, 100, 0, 101, "none"))
    check("plan: memory d64@4k ~ 1 GiB", 0.9e9 < plan_bytes(p0) < 1.3e9, plan_bytes(p0))
    check("case key: fused and two_kernel share, graph apart",
          case_key(cases[11]) == case_key(cases[12]) != case_key(cases[13]))
    filt = select_cases(doc, presets, r"llama3-8b/d64@4k/")
    check("selection: --filter", [i for i, p, _ in filt if p] == [0], [i for i, p, _ in filt if p])

    # -- annotate -------------------------------------------------------------------------------------
    timings = {case_key(cases[0]): {"times_s": [2e-4, 1e-4, 3e-4, 2e-4, 2e-4], "iterations": [5] * 5, "calls": ["x"],
                                    "impl": IMPL, "timing": "cuda_events"},
               case_key(cases[11]): {"times_s": [5e-5], "iterations": [9], "calls": [], "impl": IMPL,
                                     "timing": "cuda_events"},
               case_key(cases[13]): {"error": "RuntimeError: boom"},
               case_key(cases[14]): {"skip": "needs ~90 GiB"}}
    out = annotate(doc, selection, timings, {"device": "X"})
    check("annotate: input unchanged", "peer" not in doc["cases"][0] and "peer_environment" not in doc)
    check("annotate: ratio = peer / ours", abs(out["cases"][0]["peer"]["ratio"] - 2.0) < 1e-12,
          out["cases"][0].get("peer"))
    check("annotate: quartiles", (out["cases"][0]["peer"]["q1_s"], out["cases"][0]["peer"]["q3_s"]) == (2e-4, 2e-4))
    check("annotate: shared timing on both paths", out["cases"][11]["peer"]["median_s"] ==
          out["cases"][12]["peer"]["median_s"] == 5e-5)
    check("annotate: error recorded", out["cases"][13].get("peer_error") == "RuntimeError: boom")
    check("annotate: runtime skip", out["cases"][14].get("peer_skip_reason") == "needs ~90 GiB")
    check("annotate: untimed covered case", out["cases"][15].get("peer_skip_reason") == "not timed")
    check("annotate: every case has exactly one of peer / peer_skip_reason / peer_error",
          all(sum(k in c for k in ("peer", "peer_skip_reason", "peer_error")) == 1 for c in out["cases"]))
    check("annotate: everything else copied", all({k: v for k, v in c.items() if not k.startswith("peer")} == o
                                                  for c, o in zip(out["cases"], doc["cases"])))
    check("annotate: peer_environment", out["peer_environment"] == {"device": "X"})
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r.json")
        write_atomically(path, out)
        with open(path) as f:
            check("write: round trip", json.load(f) == out)
        check("write: no temporary left", os.listdir(tmp) == ["r.json"], os.listdir(tmp))
        bad = os.path.join(tmp, "bad.json")
        with open(bad, "w") as f:
            json.dump({"schema": "other"}, f)
        ok, detail = raises(lambda: load_results(bad), UsageError, "not a hybridtb_bench results file")
        check("load: wrong schema", ok, detail)

    # -- the CLI's own preset list (when a build is here) ---------------------------------------------
    builds = [p for p in glob.glob(os.path.join(ROOT, "build*", "harness", "cli", "hybridtb")) if os.access(p, os.X_OK)]
    cli = hybridtb or (max(builds, key=os.path.getmtime) if builds else None)
    if cli:
        live = presets_from_cli(cli)
        for name, settings in presets.items():
            check(f"presets: fixture {name} matches the CLI", live.get(name) == settings, (live.get(name), settings))
        check("presets: the CLI lists llama3-8b 32/8/128",
              live.get("llama3-8b", [])[:3] == ["num_heads=32", "num_kv_heads=8", "head_size=128"])
        committed = sorted(glob.glob(os.path.join(ROOT, "experiments", "results", "*.json")))
        for path in committed:
            try:
                doc = load_results(path)
            except UsageError:
                continue
            sel = select_cases(doc, live)
            check(f"committed results {os.path.basename(path)}: every case planned or skipped with a reason",
                  all((p is None) == bool(r) for _, p, r in sel))
            check(f"committed results {os.path.basename(path)}: canonical mixes",
                  all(canonical_mix(parse_mix(c["mix"])) == c["mix"] for c in doc["cases"]))
    else:
        print("note: no hybridtb CLI (--hybridtb, build*/harness/cli/hybridtb): the CLI's preset list was not checked")

    # -- torch on the CPU, when importable ------------------------------------------------------------
    try:
        import torch  # noqa: F401
    except ImportError:
        print("note: torch is not importable here: the SDPA forms and the mamba1 step were not run")
    else:
        _torch_self_test(check, presets)

    failed = sum(1 for _, ok, _ in checks if not ok)
    print(f"suite_peer self-test: {len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


def _torch_self_test(check, presets):
    """The SDPA forms against a float32 softmax, the mamba1 step against a per-request loop, and one step of
    every kind built and timed, all on the CPU at small sizes."""
    import torch

    torch.manual_seed(0)
    peer = TorchPeer("cpu", repetitions=2, min_time_s=0.0)
    small = ["num_heads=4", "num_kv_heads=2", "head_size=32"]
    for mix, settings in (("d3@40+c1x16@32+p2x20", _std()), ("d3@40+c1x16@32+p2x20", _std(window=24)),
                          ("d2@64", _std(window=16, dtype="float16")), ("p1x50", _std(window=8, dtype="float32"))):
        case = _synthetic_case("cuda", "fused", "llama3-8b", mix, settings + small)
        plan, reason = plan_case(case, {"llama3-8b": presets["llama3-8b"]})
        try:
            step, restore, calls = peer.build(plan)
            outs = step()
            times, iterations = peer.measure(step, restore, False)
            ok = len(outs) == len(plan["calls"]) and len(times) == 2 and all(t > 0 for t in times)
            check(f"torch cpu: {mix} {settings[1]} {settings[2]}", ok, (calls, times))
        except Exception as e:  # noqa: BLE001
            check(f"torch cpu: {mix} {settings[1]} {settings[2]}", False, f"{type(e).__name__}: {e}")
    check("torch cpu: forms checked", len(peer.checked) >= 4, peer.checked)
    # The window's meaning (README: a window w means keys p-w+1 ... p), element by element.
    for L, ctx, window in ((5, 7, 3), (6, 0, 4), (4, 9, 0), (3, 2, 16)):
        call = plan_call("chunk" if ctx else "prefill", 1, L, ctx, window)
        got = peer.window_mask(L, ctx, call.key_begin, call.keys, window).tolist()
        want = [[(call.key_begin + j <= ctx + i) and (window == 0 or call.key_begin + j >= ctx + i - window + 1)
                 for j in range(call.keys)] for i in range(L)]
        first_seen = min((call.key_begin + j for i in range(L) for j in range(call.keys) if want[i][j]), default=None)
        check(f"torch cpu: window mask L {L} context {ctx} window {window}",
              got == want and first_seen == call.key_begin and call.key_begin + call.keys == ctx + L, (got, want))

    # The mamba1 decode step against an independent per-request loop.
    case = _synthetic_case("cuda", "fused", "hymba-small", "d3@20",
                           _std(ssm="mamba1", window=16) + ["num_heads=2", "num_kv_heads=1", "head_size=32",
                                                            "ssm.intermediate_size=24", "ssm.dt_rank=4",
                                                            "ssm.state_size=5", "ssm.conv_kernel=3"])
    plan, reason = plan_case(case, presets)
    check("torch cpu: mamba1 plan", plan is not None and plan["ssm"]["intermediate_size"] == 24, reason)
    if plan is None:
        return
    plan = dict(plan, dtype="float32")
    step, restore, calls = peer.build(plan)
    pieces = peer.last_ssm
    restore()
    with torch.no_grad():
        got = pieces["mamba1"](pieces["hidden"]).double()
    w = {k: v.double() for k, v in pieces["weights"].items()}
    hidden, conv0, ssm0 = pieces["hidden"].double(), pieces["conv0"].double(), pieces["ssm0"].double()
    I, N, K, R = 24, 5, 3, 4

    def silu(v):
        return v / (1.0 + math.exp(-v))

    worst = 0.0
    for s in range(hidden.shape[0]):  # reference/ssm/mamba1.cpp decode_step, one element at a time
        xz = (w["in_proj"] @ hidden[s] + w["in_proj_bias"]).tolist()
        u, z = xz[:I], xz[I:]
        c, saved_after = [], []
        for i in range(I):
            saved = conv0[s, i].tolist()
            acc = w["conv_b"][i].item() + sum(w["conv_w"][i, j].item() * saved[j] for j in range(K - 1))
            acc += w["conv_w"][i, K - 1].item() * u[i]
            c.append(silu(acc))
            saved_after.append(saved[1:] + [u[i]])
        dbc = [sum(w["x_proj"][r, i].item() * c[i] for i in range(I)) for r in range(R + 2 * N)]
        dt_in, B, Cv = dbc[:R], dbc[R:R + N], dbc[R + N:]
        y = []
        h_after = []
        for i in range(I):
            v = sum(w["dt_proj"][i, r].item() * dt_in[r] for r in range(R)) + w["dt_bias"][i].item()
            delta = v if v > 20 else math.log1p(math.exp(v))
            acc = w["D"][i].item() * c[i]
            row = []
            for n in range(N):
                h = math.exp(delta * w["A"][i, n].item()) * ssm0[s, i, n].item() + delta * c[i] * B[n]
                row.append(h)
                acc += h * Cv[n]
            h_after.append(row)
            y.append(acc * silu(z[i]))
        out = [sum(w["out_proj"][o, i].item() * y[i] for i in range(I)) + w["out_proj_bias"][o].item()
               for o in range(hidden.shape[1])]
        worst = max(worst, max(abs(a - b) for a, b in zip(out, got[s].tolist())),
                    max(abs(a - b) for a, b in zip(sum(saved_after, []), pieces["conv_state"][s].double().flatten().tolist())),
                    max(abs(a - b) for a, b in zip(sum(h_after, []), pieces["ssm_state"][s].double().flatten().tolist())))
    check("torch cpu: mamba1 decode (contribution, conv and ssm states) = per-element loop", worst < 1e-4, worst)
    restore()
    outs = step()
    check("torch cpu: mamba1 hybrid step output shape", [tuple(o.shape) for o in outs] == [(3, 64)],
          [tuple(o.shape) for o in outs])
    times, iterations = peer.measure(step, restore, False)
    check("torch cpu: mamba1 step timed", len(times) == 2, times)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="See the module docstring (experiments/peers/suite_peer.py) for details.")
    parser.add_argument("results", nargs="?", help="hybridtb_bench results JSON")
    parser.add_argument("--out", help="the results with the peer (written atomically)")
    parser.add_argument("--hybridtb", help="the hybridtb CLI (for its preset list); default: the build that ran "
                                           "the suite, else the newest build*/harness/cli/hybridtb")
    parser.add_argument("--filter", help="time only cases whose backend/path/name matches this regex")
    parser.add_argument("--repetitions", type=int, help="repetitions per case (default: the case's, else 5)")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds of timed work per repetition (0.05)")
    parser.add_argument("--vllm", help="an unpacked vLLM release (the folder holding vllm/): its Triton kernels "
                                       "as a second peer (vllm_peer)")
    parser.add_argument("--plan", action="store_true", help="print what would be timed and why cases skip; no torch")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cpu: for testing the script only (wall clock, no flush, no graphs)")
    parser.add_argument("--self-test", action="store_true",
                        help="run the unit checks (no torch or GPU needed; with --hybridtb, check its preset list)")
    parser.add_argument("-v", "--verbose", action="store_true", help="--self-test: print every check")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if args.self_test:
        try:
            if args.hybridtb:
                find_hybridtb(args.hybridtb, {})
            return self_test(args.verbose, args.hybridtb)
        except UsageError as e:
            print(f"suite_peer: {e}", file=sys.stderr)
            return 2
    try:
        if not args.results:
            raise UsageError("RESULTS.json is required (or --self-test)")
        if args.repetitions is not None and args.repetitions < 1:
            raise UsageError("--repetitions must be >= 1")
        if args.min_time < 0:
            raise UsageError("--min-time must be >= 0")
        if args.filter:
            try:
                re.compile(args.filter)
            except re.error as e:
                raise UsageError(f"--filter {args.filter}: {e}")
        return run(args)
    except UsageError as e:
        print(f"suite_peer: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
