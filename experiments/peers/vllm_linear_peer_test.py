#!/usr/bin/env python3
"""CPU test of vllm_linear_peer.py (no torch, no GPU): its --dry-run on small fake vLLM release trees
written here, in both layouts the peer knows (FLA under vllm/third_party/ with fused_post_conv_prep,
as 0.33; under vllm/model_executor/layers/fla/ with the model file's fused_gdn_gating, as 0.12), and
on broken ones: each must fail with exit 2 and a message naming the missing folder, file, function,
parameter, module or stand-in name. Also --extract-wheel on a fake wheel (only the needed files come
out, and the result passes the dry run), the option errors (--ours, --cases, --mamba-chunk, --fla,
--json), the cases the benchmark's JSON adds, and the benchmark's input hash on Python integers.

    python3 experiments/peers/vllm_linear_peer_test.py WORKDIR

Prints one line per check and "N passed, N failed"; exit 1 if any failed.
"""
import json
import os
import shutil
import subprocess
import sys
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
PEER = os.path.join(HERE, "vllm_linear_peer.py")
sys.path.insert(0, HERE)

# A release laid out as vLLM 0.33: every file only as deep as the peer's import analysis looks.
RELEASE_033 = {
    "vllm/__init__.py": "import heavy_runtime_that_must_not_be_needed\n",
    "vllm/_version.py": "__version__ = version = '9.33.1'\n",
    "vllm/utils/__init__.py": "import another_heavy_package\n",
    "vllm/utils/math_utils.py": "def cdiv(a, b):\n    return -(a // -b)\n",
    "vllm/third_party/flash_linear_attention/ops/__init__.py": "from .chunk import chunk_gated_delta_rule\n",
    "vllm/third_party/flash_linear_attention/ops/chunk.py": (
        "import torch\n"
        "from vllm.triton_utils import tl, triton\n"
        "from .utils import input_guard\n"
        "from .wy_fast import recompute_w_u_fwd\n"
        "def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,\n"
        "                           cu_seqlens=None, chunk_indices=None, chunk_offsets=None,\n"
        "                           use_qk_l2norm_in_kernel=False, core_attn_out=None):\n"
        "    return None\n"),
    "vllm/third_party/flash_linear_attention/ops/utils.py": (
        "from vllm.platforms import current_platform\n"
        "if current_platform.is_xpu():\n"
        "    from vllm.xpu_only_module import xpu_thing\n"
        "device = 'cuda' if current_platform.is_cuda_alike() else 'cpu'\n"
        "def input_guard(fn):\n"
        "    return fn\n"),
    "vllm/third_party/flash_linear_attention/ops/wy_fast.py": (
        "from vllm.utils.math_utils import cdiv\n"
        "def recompute_w_u_fwd():\n"
        "    from vllm.module_only_a_function_needs import helper\n"
        "    return helper\n"),
    "vllm/third_party/flash_linear_attention/ops/index.py": (
        "from vllm.utils.gpu_sync_debug import gpu_sync_allowed\n"
        "from vllm.utils.torch_utils import async_tensor_h2d\n"
        "def prepare_chunk_indices(cu_seqlens, chunk_size):\n    return None\n"
        "def prepare_chunk_offsets(cu_seqlens, chunk_size):\n    return None\n"),
    "vllm/third_party/flash_linear_attention/ops/fused_gdn_prefill_post_conv.py": (
        "from vllm.triton_utils import tl, triton\n"
        "def fused_post_conv_prep(conv_output, a, b, A_log, dt_bias, num_k_heads, head_k_dim, head_v_dim,\n"
        "                         apply_l2norm=True, output_g_exp=False):\n    return None\n"),
    "vllm/model_executor/layers/mamba/ops/__init__.py": "def helper_only_in_init():\n    return 1\n",
    "vllm/model_executor/layers/mamba/ops/ssd_combined.py": (
        "import torch\n"
        "from packaging import version\n"
        "from vllm.triton_utils import triton\n"
        "from .ssd_bmm import _bmm_chunk_fwd\n"
        "def mamba_chunk_scan_combined_varlen(x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens,\n"
        "        last_chunk_indices, seq_idx, out, D=None, z=None, dt_bias=None, initial_states=None,\n"
        "        dt_softplus=False, dt_limit=(0.0, float('inf')), return_intermediate_states=False,\n"
        "        state_dtype=None, final_states_out=None, final_state_indices=None):\n"
        "    return None\n"),
    "vllm/model_executor/layers/mamba/ops/ssd_bmm.py": (
        "from .mamba_ssm import softplus\n"
        "def _bmm_chunk_fwd():\n    return softplus\n"),
    "vllm/model_executor/layers/mamba/ops/mamba_ssm.py": (
        "import vllm.envs as envs\n"
        "from vllm import _custom_ops as ops\n"
        "from vllm.logger import init_logger\n"
        "from vllm.v1.attention.backends.utils import NULL_BLOCK_ID\n"
        "TRITON3 = True\n"
        "if TRITON3:\n"
        "    def softplus(dt):\n        return dt\n"
        "else:\n"
        "    def softplus(dt):\n        return -dt\n"),
    "vllm/v1/attention/backends/utils.py": "import heavy_backend_stuff\nNULL_BLOCK_ID = 0\nPAD_SLOT_ID = -1\n",
    # The attention kernels vllm_kernels.py imports (for --extract-wheel).
    "vllm/v1/attention/ops/triton_unified_attention.py": (
        "import vllm.envs as envs\n"
        "from vllm.v1.attention.ops.triton_attention_helpers import helper\n"
        "from vllm.v1.kv_cache_interface import KVQuantMode\n"
        "def unified_attention(q, k, v):\n    return None\n"),
    "vllm/v1/attention/ops/triton_attention_helpers.py": "def helper():\n    return 0\n",
    "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py": "def triton_reshape_and_cache_flash():\n    return 0\n",
    "vllm/v1/kv_cache_interface.py": "import enum\nclass KVQuantMode(enum.IntEnum):\n    NONE = 0\n",
    "vllm/v1/attention/backends/triton_attn.py": "MIN_LAUNCH_GRID_SIZE_2D = 128\n",
    # Not needed by either peer: --extract-wheel must leave these out.
    "vllm/entrypoints/api_server.py": "import fastapi\n",
    "vllm/model_executor/models/llama.py": "import transformers\n",
}

# The 0.12 layout: FLA under model_executor/layers/fla/ops, no post-conv preparation, the gating
# kernel in the Qwen3-Next model file (whose own imports need the whole of vLLM).
RELEASE_012 = {
    "vllm/__init__.py": "from vllm.engine.arg_utils import AsyncEngineArgs\n",
    "vllm/_version.py": "__version__ = version = '9.12.0'\n",
    "vllm/model_executor/layers/fla/ops/chunk.py": (
        "from einops import rearrange\n"
        "from .utils import input_guard\n"
        "def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,\n"
        "                           cu_seqlens=None, head_first=False, use_qk_l2norm_in_kernel=False):\n"
        "    return None\n"),
    "vllm/model_executor/layers/fla/ops/utils.py": "def input_guard(fn):\n    return fn\n",
    "vllm/model_executor/models/qwen3_next.py": (
        "from vllm.config import VllmConfig\n"
        "from vllm.triton_utils import tl, triton\n"
        "@triton.jit\n"
        "def fused_gdn_gating_kernel(g, beta_output, A_log, a, b, dt_bias, seq_len):\n    pass\n"
        "def fused_gdn_gating(A_log, a, b, dt_bias, beta=1.0, threshold=20.0):\n    return None\n"),
    "vllm/model_executor/layers/mamba/ops/ssd_combined.py": (
        "from .mamba_ssm import softplus\n"
        "def mamba_chunk_scan_combined_varlen(x, dt, A, B, C, chunk_size, cu_seqlens, cu_chunk_seqlens,\n"
        "        last_chunk_indices, seq_idx, out, D=None, z=None, dt_bias=None, initial_states=None,\n"
        "        dt_softplus=False, dt_limit=(0.0, float('inf')), return_intermediate_states=False,\n"
        "        state_dtype=None):\n    return None\n"),
    "vllm/model_executor/layers/mamba/ops/mamba_ssm.py": (
        "from vllm.attention.backends.utils import PAD_SLOT_ID\n"
        "def softplus(dt):\n    return dt\n"),
    "vllm/attention/backends/utils.py": "PAD_SLOT_ID = -1\n",
}


class Checks:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, ok, what, detail=""):
        print(f"{'ok  ' if ok else 'FAIL'} {what}" + (f"\n     {detail}" if not ok and detail else ""))
        if ok:
            self.passed += 1
        else:
            self.failed += 1


def write_tree(root, files):
    shutil.rmtree(root, ignore_errors=True)
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    return root


def peer(*args):
    done = subprocess.run([sys.executable, PEER, *args], capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def expect_error(c, what, args, *needles):
    rc, out, err = peer(*args)
    c.check(rc == 2 and all(n in err for n in needles),
            f"{what}: exit 2 naming {', '.join(repr(n) for n in needles)}",
            f"exit {rc}; stderr: {err.strip()[-400:]}; stdout tail: {out.strip()[-300:]}")


def with_change(base, changes):
    files = dict(base)
    for rel, text in changes.items():
        if text is None:
            files.pop(rel)
        else:
            files[rel] = text
    return files


def main():
    if len(sys.argv) != 2:
        print("usage: vllm_linear_peer_test.py WORKDIR", file=sys.stderr)
        return 2
    work = os.path.abspath(sys.argv[1])
    os.makedirs(work, exist_ok=True)
    c = Checks()
    fla = "vllm/third_party/flash_linear_attention/ops"
    mamba = "vllm/model_executor/layers/mamba/ops"

    # --- a good 0.33-like release ---
    r33 = write_tree(os.path.join(work, "release-033"), RELEASE_033)
    rc, out, err = peer("--vllm", r33, "--dry-run", "--no-fla")
    c.check(rc == 0, "0.33 layout: dry run exits 0", f"exit {rc}: {err}")
    c.check("vLLM release: 9.33.1" in out, "0.33 layout: the version from vllm/_version.py", out[:300])
    c.check(f"GDN: {fla}/chunk.py: chunk_gated_delta_rule(q, k, v, g, beta, scale, initial_state, "
            "output_final_state, cu_seqlens, chunk_indices, chunk_offsets, use_qk_l2norm_in_kernel, core_attn_out)"
            in out, "0.33 layout: the GDN entry point and its signature", out)
    c.check(f"preparation: post_conv_prep ({fla}/fused_gdn_prefill_post_conv.py); chunk indices from index.py" in out,
            "0.33 layout: fused_post_conv_prep and the release's chunk indices", out)
    c.check(f"Mamba-2: {mamba}/ssd_combined.py: mamba_chunk_scan_combined_varlen(x, dt, A, B, C, chunk_size" in out
            and "final_states_out, final_state_indices), chunk 128" in out,
            "0.33 layout: the Mamba-2 entry point, its signature and the default SSD chunk", out)
    files_line = next((line for line in out.splitlines() if "files imported from the release" in line), "")
    wanted = [f"{fla}/chunk.py", f"{fla}/utils.py", f"{fla}/wy_fast.py", f"{fla}/index.py",
              f"{fla}/fused_gdn_prefill_post_conv.py", "vllm/utils/math_utils.py", f"{mamba}/ssd_combined.py",
              f"{mamba}/ssd_bmm.py", f"{mamba}/mamba_ssm.py"]
    c.check("(9)" in files_line and all(w in files_line for w in wanted),
            "0.33 layout: exactly the files the entry points import, followed through the release", files_line)
    c.check("vllm/utils/__init__.py" not in out and "ops/__init__.py" not in files_line,
            "0.33 layout: no package __init__ is imported (packages are registered empty)", out)
    stand_ins = next((line for line in out.splitlines() if "stand-ins:" in line), "")
    c.check(all(s in stand_ins for s in ("vllm._custom_ops", "vllm.envs", "vllm.logger", "vllm.platforms",
                                         "vllm.triton_utils", "vllm.utils.gpu_sync_debug", "vllm.utils.torch_utils",
                                         "vllm.v1.attention.backends.utils")),
            "0.33 layout: the runtime modules reached are the stand-ins", stand_ins)
    c.check("third-party modules: packaging, torch" in out, "0.33 layout: the third-party modules needed at load", out)
    c.check("module_only_a_function_needs" in out and "(lazy import)" in out,
            "0.33 layout: a missing module imported inside a function is a note, not an error", out)
    c.check("xpu_only_module" not in out, "0.33 layout: an import under `if current_platform.is_xpu()` is skipped", out)
    for name in ("gdn prefill 8k qwen3-next", "gdn prefill 8k hv8", "gdn prefill 64k hv8", "mamba2 prefill 8k",
                 "mamba2 prefill 32k"):
        c.check(any(line.strip().startswith(name) for line in out.splitlines()), f"0.33 layout: case '{name}' listed")
    c.check("(16, 32, 128, 128)       8192 tokens  peers: vllm" in out and "65536 tokens" in out
            and "(24, 128, 256, 1)" in out and "32768 tokens" in out,
            "0.33 layout: the cases' shapes, lengths and peers", out)
    c.check("FLA: skipped: --no-fla" in out and out.rstrip().endswith("dry run: nothing timed"),
            "0.33 layout: FLA skipped with its reason; nothing timed", out[-300:])

    # --- a good 0.12-like release ---
    r12 = write_tree(os.path.join(work, "release-012"), RELEASE_012)
    rc, out, err = peer("--vllm", os.path.join(r12, "vllm"), "--dry-run", "--no-fla")
    c.check(rc == 0, "0.12 layout (given as the vllm/ folder itself): dry run exits 0", f"exit {rc}: {err}")
    c.check("GDN: vllm/model_executor/layers/fla/ops/chunk.py: chunk_gated_delta_rule(" in out
            and "head_first" in out and "preparation: gdn_gating (vllm/model_executor/models/qwen3_next.py)" in out,
            "0.12 layout: FLA under model_executor/layers/fla, gating from the model file's definitions", out)
    c.check("vllm/model_executor/models/qwen3_next.py" not in next(
        (line for line in out.splitlines() if "files imported" in line), ""),
        "0.12 layout: the model file is not imported (only its gating definitions are executed)", out)
    c.check("vllm.attention.backends.utils" in out and "third-party modules: einops" in out,
            "0.12 layout: PAD_SLOT_ID's constants stand-in (a negative literal) and einops", out)

    root = write_tree(os.path.join(work, "broken"), with_change(RELEASE_012, {
        "vllm/model_executor/models/qwen3_next.py": RELEASE_012["vllm/model_executor/models/qwen3_next.py"].replace(
            "    return None\n", "    return cdiv(a.shape[0], 8)\n")}))
    expect_error(c, "0.12 layout: the gating definitions use a name of their module",
                 ["--vllm", root, "--dry-run", "--no-fla"],
                 "vllm/model_executor/models/qwen3_next.py: fused_gdn_gating_kernel and fused_gdn_gating use cdiv")

    # --- FLA ---
    fla_root = write_tree(os.path.join(work, "fla-wheel"), {
        "fla/__init__.py": "__version__ = '7.7.7'\n",
        "fla/ops/gated_delta_rule/chunk.py": "def chunk_gated_delta_rule(q, k, v, g, beta, **kwargs):\n    pass\n"})
    rc, out, err = peer("--vllm", r33, "--dry-run", "--fla", fla_root)
    c.check(rc == 0 and f"FLA: fla 7.7.7 at {fla_root}" in out and "peers: vllm, fla" in out,
            "--fla: an unpacked fla-core wheel is found and runs beside vLLM on the GDN cases", out + err)
    expect_error(c, "--fla folder without fla/", ["--vllm", r33, "--dry-run", "--fla", r33], "--fla", "no fla/ package")
    no_chunk = write_tree(os.path.join(work, "fla-empty"), {"fla/__init__.py": "", "fla/ops/__init__.py": ""})
    expect_error(c, "--fla without the kernels", ["--vllm", r33, "--dry-run", "--fla", no_chunk], "--fla",
                 "fla/ops/gated_delta_rule/chunk.py")

    # --- broken releases ---
    missing = os.path.join(work, "no-such-release")
    expect_error(c, "missing --vllm folder", ["--vllm", missing, "--dry-run"], "--vllm", missing)
    empty = write_tree(os.path.join(work, "not-a-release"), {"README": "x"})
    expect_error(c, "a folder without vllm/", ["--vllm", empty, "--dry-run"], "--vllm", "no vllm/ package folder")

    def broken(what, changes, *needles, extra=()):
        root = write_tree(os.path.join(work, "broken"), with_change(RELEASE_033, changes))
        expect_error(c, what, ["--vllm", root, "--dry-run", "--no-fla", *extra], *needles)

    broken("no chunk.py", {f"{fla}/chunk.py": None}, "no chunk.py under vllm/third_party/flash_linear_attention/ops")
    broken("chunk.py without chunk_gated_delta_rule", {f"{fla}/chunk.py": "def chunk_gated_delta_rule_fwd():\n    pass\n"},
           f"{fla}/chunk.py defines no function chunk_gated_delta_rule")
    broken("chunk_gated_delta_rule without use_qk_l2norm_in_kernel",
           {f"{fla}/chunk.py": "def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None,\n"
                               "    output_final_state=False, cu_seqlens=None):\n    pass\n"},
           "chunk_gated_delta_rule has no parameter use_qk_l2norm_in_kernel")
    broken("no ssd_combined.py", {f"{mamba}/ssd_combined.py": None}, f"no {mamba}/ssd_combined.py")
    broken("only the pre-0.11 Mamba-2 API",
           {f"{mamba}/ssd_combined.py": "def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size):\n    pass\n"},
           "defines no function mamba_chunk_scan_combined_varlen", "before vLLM 0.11")
    broken("a helper module the kernel imports is missing", {f"{fla}/wy_fast.py": None},
           f"{fla}/chunk.py:4: imports vllm.third_party.flash_linear_attention.ops.wy_fast",
           "wy_fast.py missing")
    broken("a name the stand-in does not provide",
           {f"{fla}/utils.py": "from vllm.triton_utils import tl, not_a_triton_util\ndef input_guard(fn):\n    return fn\n"},
           f"{fla}/utils.py:1: imports not_a_triton_util from vllm.triton_utils, which its stand-in does not provide")
    broken("a name only a package __init__ defines",
           {f"{mamba}/ssd_bmm.py": "from vllm.model_executor.layers.mamba.ops import helper_only_in_init\n"
                                   "def _bmm_chunk_fwd():\n    return 0\n"},
           "imports helper_only_in_init from the package vllm.model_executor.layers.mamba.ops",
           "whose __init__.py the loader does not run")
    broken("a name the imported module does not define",
           {f"{mamba}/ssd_bmm.py": "from .mamba_ssm import no_such_function\ndef _bmm_chunk_fwd():\n    return 0\n"},
           "imports no_such_function from vllm.model_executor.layers.mamba.ops.mamba_ssm",
           f"{mamba}/mamba_ssm.py does not define")
    broken("an import that runs on CUDA of a missing module",
           {f"{fla}/utils.py": "from vllm.platforms import current_platform\nif current_platform.is_cuda():\n"
                               "    from vllm.cuda_only_missing import x\ndef input_guard(fn):\n    return fn\n"},
           "imports vllm.cuda_only_missing", "has no stand-in")
    broken("a constants stand-in without the constant",
           {"vllm/v1/attention/backends/utils.py": "OTHER = 1\n"},
           "imports NULL_BLOCK_ID from vllm.v1.attention.backends.utils", "it provides: OTHER")
    broken("an unparsable kernel file", {f"{fla}/cumsum.py": "def broken(:\n",
                                         f"{fla}/chunk.py": RELEASE_033[f"{fla}/chunk.py"] + "from .cumsum import x\n"},
           f"{fla}/cumsum.py: cannot be parsed")
    # A broken Mamba-2 side does not stop the GDN cases when only those are selected.
    root = write_tree(os.path.join(work, "broken"), with_change(RELEASE_033, {f"{mamba}/ssd_combined.py": None}))
    rc, out, err = peer("--vllm", root, "--dry-run", "--no-fla", "--cases", "^gdn")
    c.check(rc == 0 and "Mamba-2: unavailable: no vllm/model_executor/layers/mamba/ops/ssd_combined.py" in out
            and "mamba2 prefill" not in out.split("cases (")[1],
            "--cases ^gdn on a release without Mamba-2: exit 0, Mamba-2 reported unavailable", out + err)
    # A current_platform attribute the stand-in lacks is a warning (the path may never run).
    root = write_tree(os.path.join(work, "broken"), with_change(RELEASE_033, {
        f"{fla}/utils.py": "from vllm.platforms import current_platform\nX = current_platform.is_fancy_device()\n"
                           "def input_guard(fn):\n    return fn\n"}))
    rc, out, err = peer("--vllm", root, "--dry-run", "--no-fla")
    c.check(rc == 0 and f"warning: {fla}/utils.py:2: current_platform.is_fancy_device is not in the platform stand-in"
            in out, "a current_platform attribute the stand-in lacks: a warning naming it", out + err)

    # --- options ---
    ours = os.path.join(work, "bench-linear.json")
    with open(ours, "w") as f:
        json.dump({"gpu": "NVIDIA H200", "cases": [
            {"name": "gdn prefill 8k hv8", "median_us": 610.0, "prefill_us": 560.0},
            {"name": "gdn prefill 16k hv8", "median_us": 1200.0},
            {"name": "mamba2 prefill 8k", "median_us": 950.5},
            {"name": "gdn decode 64 seqs fp32", "median_us": 40.0}]}, f)
    rc, out, err = peer("--vllm", r33, "--dry-run", "--no-fla", "--ours", ours)
    c.check(rc == 0 and "ours: 610.0 us" in out and "ours: 950.5 us" in out
            and any(line.strip().startswith("gdn prefill 16k hv8") and "16384 tokens" in line and "ours: 1200.0 us"
                    in line for line in out.splitlines()) and "decode" not in out.split("cases (")[1],
            "--ours: our medians beside the cases; a prefill case of another length joins the list, decodes do not",
            out + err)
    bad = os.path.join(work, "bad.json")
    with open(bad, "w") as f:
        f.write("{not json")
    expect_error(c, "--ours not JSON", ["--vllm", r33, "--dry-run", "--ours", bad], "--ours", "not JSON")
    with open(bad, "w") as f:
        json.dump({"results": []}, f)
    expect_error(c, "--ours without cases", ["--vllm", r33, "--dry-run", "--ours", bad], "--ours", "no \"cases\" list")
    expect_error(c, "--ours missing", ["--vllm", r33, "--dry-run", "--ours", bad + ".missing"], "--ours", "cannot read")
    expect_error(c, "--cases matching nothing", ["--vllm", r33, "--dry-run", "--cases", "rwkv"], "--cases 'rwkv'",
                 "matches no case")
    expect_error(c, "--cases not a regex", ["--vllm", r33, "--dry-run", "--cases", "(gdn"], "--cases", "not a regular")
    expect_error(c, "--mamba-chunk not a power of two", ["--vllm", r33, "--dry-run", "--mamba-chunk", "100"],
                 "--mamba-chunk 100", "power of two")
    expect_error(c, "--samples 0", ["--vllm", r33, "--dry-run", "--samples", "0"], "--samples 0")
    expect_error(c, "no --vllm", ["--dry-run"], "--vllm DIR is required")
    expect_error(c, "a run without --json", ["--vllm", r33, "--no-fla"], "--json FILE is required")
    expect_error(c, "--hybridtb not executable", ["--vllm", r33, "--dry-run", "--hybridtb", ours], "--hybridtb", ours)
    rc, out, err = peer("--vllm", r33, "--dry-run", "--bogus-option")
    c.check(rc == 2 and "--bogus-option" in err, "an unknown option: exit 2 naming it", err)

    # --- --extract-wheel ---
    wheel = os.path.join(work, "vllm-9.33.1-cp38-abi3-manylinux_2_28_x86_64.whl")
    with zipfile.ZipFile(wheel, "w") as zf:
        for rel, text in RELEASE_033.items():
            zf.writestr(rel, text)
        zf.writestr(f"{mamba}/configs/launch.json", "{}")
        zf.writestr("vllm/_C.abi3.so", b"\0" * 1024)
    dest = os.path.join(work, "extracted")
    shutil.rmtree(dest, ignore_errors=True)
    rc, out, err = peer("--extract-wheel", wheel, "--vllm", dest)
    got = sorted(os.path.relpath(os.path.join(d, f), dest) for d, _, fs in os.walk(dest) for f in fs)
    expected = sorted(["vllm/_version.py", "vllm/utils/math_utils.py", "vllm/v1/attention/backends/utils.py",
                       "vllm/v1/attention/ops/triton_unified_attention.py",
                       "vllm/v1/attention/ops/triton_attention_helpers.py",
                       "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py", "vllm/v1/kv_cache_interface.py",
                       "vllm/v1/attention/backends/triton_attn.py", f"{mamba}/configs/launch.json"]
                      + [rel for rel in RELEASE_033 if rel.startswith((fla + "/", mamba + "/"))])
    c.check(rc == 0 and got == expected and f"extracted {len(expected)} files" in out,
            "--extract-wheel: the kernel folders, what they import, the attention files; nothing else",
            f"exit {rc} {err}\n     got {got}\n     expected {expected}")
    rc, out2, err = peer("--vllm", dest, "--dry-run", "--no-fla")
    c.check(rc == 0 and "files imported from the release (9)" in out2, "the extracted tree passes the dry run", out2 + err)
    expect_error(c, "--extract-wheel of a non-wheel", ["--extract-wheel", ours, "--vllm", dest], "--extract-wheel",
                 "not a wheel")

    # --- the benchmark's input hash on Python integers ---
    import vllm_linear_peer as p

    def reference_hash(i, seed):  # fill_kernel's uint32 arithmetic, written directly
        h = ((i * 2654435761) & 0xFFFFFFFF) ^ seed
        h ^= h >> 16
        h = (h * 0x85EBCA6B) & 0xFFFFFFFF
        return h ^ (h >> 13)

    samples = [0, 1, 2, 12345, 2 ** 31 - 1, 2 ** 31, 2 ** 32 - 1, 2 ** 32 + 7, 3_000_000_017]
    c.check(all(p.bench_hash(i, s) == reference_hash(i & 0xFFFFFFFF, s) for i in samples for s in (21, 42, 47)),
            "bench_hash (int64-safe) equals fill_kernel's uint32 hash")
    c.check(all(p.mul32(a, b) == (a * b) % 2 ** 32 for a in samples if a < 2 ** 32 for b in (2654435761, 0x85EBCA6B, 1)),
            "mul32 is the product mod 2^32 for 32-bit operands")
    c.check(p.f32(0.1) != 0.1 and p.f32(0.5) == 0.5 and abs(p.f32(0.1) - 0.1) < 1e-8, "f32 rounds to float32")

    # --- the report written after each case: a run stopped later keeps the finished cases ---
    path = os.path.join(work, "report.json")
    report = {"cases": [{"name": "a"}]}
    p.write_report(report, path, complete=False)
    with open(path) as f:
        partial = json.load(f)
    report["cases"].append({"name": "b"})
    p.write_report(report, path, complete=True)
    with open(path) as f:
        whole = json.load(f)
    c.check(partial == {"cases": [{"name": "a"}], "complete": False}
            and whole == {"cases": [{"name": "a"}, {"name": "b"}], "complete": True}
            and not os.path.exists(path + ".tmp"),
            "write_report: the cases so far with complete false, then all with complete true, no .tmp left",
            f"{partial} / {whole}")

    print(f"{c.passed} passed, {c.failed} failed")
    return 1 if c.failed else 0


if __name__ == "__main__":
    sys.exit(main())
