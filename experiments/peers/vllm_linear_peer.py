#!/usr/bin/env python3
"""vLLM's and FLA's Triton linear-attention prefill kernels beside ours (hybridtb_bench_linear).

The peers, imported at run time (nothing of vLLM or FLA is in this repository):
  vllm  GDN:    vLLM's copy of FLA's chunk_gated_delta_rule (vllm/third_party/flash_linear_attention/ops/
                in 0.33, vllm/model_executor/layers/fla/ops/ before), called as vLLM's Qwen3-Next GDN
                layer calls it on a prefill: its post-conv preparation (fused_post_conv_prep: split,
                q/k L2 norm and the gates in one kernel, where the release has it; else the model
                file's fused_gdn_gating kernel and the L2 norm inside the chunk kernel), the chunked
                delta rule from a zero initial state, and the final state stored into a pool slot.
        Mamba-2: mamba_chunk_scan_combined_varlen (vllm/model_executor/layers/mamba/ops/ssd_combined.py
                and its ssd_*.py helpers), called as vLLM's MambaMixer2 calls it on a prefill
                (dt_bias and the softplus inside, the D skip, no z gate, the final state written to a
                float32 pool slot), at the model's SSD chunk size (--mamba-chunk).
  fla   GDN:    fla.ops.gated_delta_rule.chunk_gated_delta_rule from the flash-linear-attention /
                fla-core package (installed, or the unpacked wheel given by --fla): gates, sigmoid and
                q/k L2 norm inside its kernels where the version offers that, else the gates in torch.
                Skipped with the reason printed when not importable.

Inputs: the cases of optimized/bench/bench_linear.cu (their names, so ratios join by name), on the
very values that benchmark reads: its hash fill is reproduced here (bench_fill), rounded to bf16
where vLLM's kernels take the model dtype (the activations; A_log, dt_bias and D stay float32).
Like ours, the timed work starts from the conv output (qkv / xBC after conv + SiLU): ours times the
preparation + the chunked prefill (median_us), the peers their preparation + prefill as above.

Timing as the benchmark times ours: warm-up calls (the first one autotunes), then CUDA events
around each call with a 256 MiB L2-flush read before it (outside the events), median of --samples.
ratio = peer median / our median_us from --ours (> 1: hybridtb faster). --kernels N adds each peer's
per-kernel GPU times (torch.profiler, mean of N calls) to its entry, to set beside Nsight Compute's
per-kernel times of ours. Each entry's wall_s gives the seconds of its phases (the timing's first
call compiles and autotunes the peer's Triton kernels for the case, often the longest); the JSON is
rewritten after each case with "complete" false until the last, so a run stopped by a time limit
keeps the cases it finished.

Checks of each peer's output (max error normalised by the largest |value| of the check's output,
and the relative RMS error, within bf16 tolerances — the peers round their activations to bf16):
  - against a float64 re-implementation of the recurrence (the math of reference/ssm/gdn_core.h and
    mamba2_core.h, token by token) on --ref-tokens tokens of random inputs at the case's head shape;
  - against ours, when --hybridtb names the built CLI and h5py is importable: `hybridtb gen` writes a
    fresh prefill of the case's shape (--check-tokens, default the case's length), `hybridtb run
    --backend cuda` computes our output, and the peer gets the same inputs (the conv + SiLU in float32
    torch, rounded to bf16 as vLLM's conv output is).

    python3 experiments/peers/vllm_linear_peer.py --vllm DIR [--fla DIR] [--ours bench-linear.json]
        [--hybridtb build-gpu/harness/cli/hybridtb] --json peer-linear.json
    python3 experiments/peers/vllm_linear_peer.py --vllm DIR --dry-run      # no torch, no GPU
    python3 experiments/peers/vllm_linear_peer.py --extract-wheel vllm-X.whl --vllm DEST

--dry-run reads the release with `ast` only: the kernel files, their signatures, every module they
import (followed through the release, stopping at the stand-ins) and the case list, and exits 0, or
2 naming the missing file, function or module. --extract-wheel copies out of a vLLM wheel exactly the
Python files the two vLLM peers import (this one and vllm_kernels.py's attention), keeping the layout.
--self-test-reference (CPU, numpy + h5py) checks the float64 re-implementation and the input reading
against `hybridtb run --backend reference` on small generated files.
Exit status: 0 every peer ran and every check passed; 1 a peer failed or a check did not pass; 2 bad
options or an unusable release.
"""
import argparse
import ast
import contextlib
import importlib
import importlib.util
import json
import math
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import types
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import vllm_kernels  # noqa: E402  (stdlib only at import: its torch use is inside load())

# --- the cases (optimized/bench/bench_linear.cu) ----------------------------------------------------

GDN_SHAPES = {  # name suffix → (Hk, Hv, dk, dv); value head i reads key head i / (Hv / Hk)
    "qwen3-next": (16, 32, 128, 128),
    "hv8": (4, 8, 128, 128),
}
FALCON_H1 = (24, 128, 256, 1)  # Mamba-2 (Hs heads of P, state N, G groups): gen preset falcon-h1-7b-mamba2
CONV_KERNEL = 4
GDN_CHUNK = 64  # ours (kGdnChunk) and FLA's
# vLLM runs Mamba-2's SSD at the model config's mamba_chunk_size (ModelConfig.get_mamba_chunk_size);
# Falcon-H1's config.json has 128, as ours (kMamba2ChunkTokens).
DEFAULT_MAMBA_CHUNK = 128

# (name, kind, shape, tokens, in the benchmark): the benchmark's prefill cases.
CASES = [
    ("gdn prefill 8k qwen3-next", "gdn_prefill", "qwen3-next", 8192, True),
    ("gdn prefill 8k hv8", "gdn_prefill", "hv8", 8192, True),
    ("gdn prefill 64k hv8", "gdn_prefill", "hv8", 65536, True),
    ("mamba2 prefill 8k", "mamba2_prefill", "falcon-h1-7b", 8192, True),
    ("mamba2 prefill 32k", "mamba2_prefill", "falcon-h1-7b", 32768, True),
]
_GDN_NAME = re.compile(r"^gdn prefill (\d+)k (\S+)$")
_MAMBA2_NAME = re.compile(r"^mamba2 prefill (\d+)k$")

# bench_linear.cu's fills (make_gdn / make_mamba2): (low, high, seed) of each input.
GDN_FILL = {"qkv": (-1.0, 1.0, 21), "a": (-1.0, 1.0, 22), "b": (-1.0, 1.0, 23), "A_log": (-1.0, 1.0, 27),
            "dt_bias": (-0.1, 0.1, 28)}
MAMBA2_FILL = {"dt": (-4.6, -2.3, 41), "xbc": (-1.0, 1.0, 42), "dt_bias": (-0.1, 0.1, 44),
               "A_log": (0.0, 2.77, 45), "D": (0.5, 1.5, 46)}

# A check passes when both errors are within these (bf16 activations: 2^-9 relative rounding per
# stage; the chunked kernels keep several bf16 intermediates).
TOLERANCE = {"rel_rms": 0.03, "max_rel": 0.1}

DEVICE = "cuda"  # where the peers run
OURS_BACKEND = "cuda"  # the hybridtb backend the check against ours runs


class UsageError(Exception):
    """Bad options or an unusable release: exit 2 with the message."""


# --- reading a vLLM release without importing it ------------------------------------------------------

# The modules of the vLLM runtime the linear kernels import, replaced by stand-ins (install_stand_ins),
# with the names each stand-in provides: the dry run checks every `from M import name` against these.
LINEAR_STAND_INS = {
    "vllm.platforms": {"current_platform"},
    "vllm.logger": {"init_logger"},
    "vllm.triton_utils": {"triton", "tl", "tldevice", "HAS_TRITON", "LOG2E", "LOGE2"},
    "vllm.envs": None,  # a module of flags: attribute use is checked against ENV_DEFAULTS
    "vllm._custom_ops": set(),  # compiled ops: imported as a module, called only off the prefill paths
    "vllm.utils.platform_utils": {"num_compute_units", "get_device_name_as_file_name"},
    "vllm.utils.gpu_sync_debug": {"gpu_sync_allowed"},
    "vllm.utils.torch_utils": {"async_tensor_h2d"},
    # Constants modules: every integer constant of the release's own file (read by ast).
    "vllm.v1.attention.backends.utils": "constants",
    "vllm.attention.backends.utils": "constants",
}
# vllm.envs flags the linear kernels read, at vLLM's documented defaults.
ENV_DEFAULTS = {"VLLM_BATCH_INVARIANT": False, "VLLM_TRITON_USE_TD": False, "VLLM_TUNED_CONFIG_FOLDER": None,
                "VLLM_GPU_SYNC_CHECK": None, "VLLM_TRITON_FORCE_FIRST_CONFIG": False}
# The stand-ins vllm_kernels.load installs for the attention kernels (names not checked here: that
# module's own use decides them); used only to pick the files --extract-wheel copies.
ATTENTION_STAND_INS = {name: None for name in (
    "vllm.platforms", "vllm.logger", "vllm.triton_utils", "vllm.envs", "vllm.v1.kv_cache_interface",
    "vllm.model_executor.layers.quantization.utils.quant_utils")}

GDN_OPS_DIRS = ("vllm/third_party/flash_linear_attention/ops", "vllm/model_executor/layers/fla/ops")
SSD_COMBINED = "vllm/model_executor/layers/mamba/ops/ssd_combined.py"
QWEN3_NEXT_MODEL = "vllm/model_executor/models/qwen3_next.py"
# The gating kernel of releases without fused_post_conv_prep, executed from the model file by itself.
GATING_DEFINITIONS = ("fused_gdn_gating_kernel", "fused_gdn_gating")
# Parameters the peer passes by name: an entry point without one of them makes the release unusable
# (others, such as chunk_indices or final_states_out, are passed when the signature has them).
GDN_CHUNK_PARAMS = ("q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state", "cu_seqlens",
                    "use_qk_l2norm_in_kernel")
POST_CONV_PARAMS = ("conv_output", "a", "b", "A_log", "dt_bias", "num_k_heads", "head_k_dim", "head_v_dim",
                    "apply_l2norm")
SSD_PARAMS = ("x", "dt", "A", "B", "C", "chunk_size", "cu_seqlens", "cu_chunk_seqlens", "last_chunk_indices",
              "seq_idx", "out", "D", "z", "dt_bias", "initial_states", "dt_softplus")


def _parse(path):
    try:
        with open(path, encoding="utf-8") as f:
            return ast.parse(f.read(), path)
    except SyntaxError as e:
        raise UsageError(f"{path}: cannot be parsed by Python {sys.version.split()[0]}: {e.msg} (line {e.lineno})")


def _module_file(root, module):
    """(path, is_package) of a module of the release: (file, False) for a module, (its __init__.py or
    None, True) for a package folder, (None, False) if the release has neither."""
    base = os.path.join(root, *module.split("."))
    if os.path.isfile(base + ".py"):
        return base + ".py", False
    if os.path.isdir(base):
        init = os.path.join(base, "__init__.py")
        return (init if os.path.isfile(init) else None), True
    return None, False


def _top_level_names(tree):
    """Names a module defines at its top level (None: a star import makes the set unknowable)."""
    names = set()
    for node in _module_level_nodes(tree.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.add(sub.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                if alias.name == "*":
                    return None
                names.add((alias.asname or alias.name).split(".")[0])
    return names


def _module_level_nodes(body):
    """The statements executed at import: the module body, into if/try/with blocks, not into defs."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
            for field in ("body", "orelse", "finalbody"):
                yield from _module_level_nodes(getattr(node, field, []) or [])
            for handler in getattr(node, "handlers", []) or []:
                yield from _module_level_nodes(handler.body)


def _platform_truth(test):
    """The value of an `if` test at module level on the CUDA stand-in platform, or None if unknown:
    current_platform.is_cuda() / is_cuda_alike() True, the other is_*() False, TYPE_CHECKING False."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _platform_truth(test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        values = [_platform_truth(v) for v in test.values]
        if isinstance(test.op, ast.And):
            return False if False in values else (None if None in values else True)
        return True if True in values else (None if None in values else False)
    if isinstance(test, ast.Name) and test.id == "TYPE_CHECKING":
        return False
    if (isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute)
            and isinstance(test.func.value, ast.Name) and test.func.value.id == "current_platform"):
        name = test.func.attr
        if name in ("is_cuda", "is_cuda_alike"):
            return True
        if name.startswith("is_") and name not in ("is_device_capability", "is_device_capability_family"):
            return False
    return None


def _imports(tree, module, is_package):
    """Every import of a module file: (absolute module, imported name or None, line, context), where
    context is "top" (runs at import), "optional" (in a try that catches ImportError), "unknown" (under
    an if the stand-in platform cannot decide), "skipped" (under an if that is false on CUDA) or "lazy"
    (inside a function)."""
    found = []

    def absolute(node):
        if not node.level:
            return node.module
        parts = module.split(".") if is_package else module.split(".")[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        return ".".join(parts + ([node.module] if node.module else []))

    def visit(body, context):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(node.body, "lazy")
                continue
            if isinstance(node, ast.ClassDef):
                visit(node.body, context)
                continue
            if isinstance(node, ast.Import):
                for alias in node.names:
                    found.append((alias.name, None, node.lineno, context))
            elif isinstance(node, ast.ImportFrom):
                target = absolute(node)
                for alias in node.names:
                    found.append((target, alias.name, node.lineno, context))
            elif isinstance(node, ast.If):
                truth = _platform_truth(node.test) if context == "top" else None
                if context != "top":
                    visit(node.body, context)
                    visit(node.orelse, context)
                elif truth is None:
                    visit(node.body, "unknown")
                    visit(node.orelse, "unknown")
                else:
                    visit(node.body, "top" if truth else "skipped")
                    visit(node.orelse, "skipped" if truth else "top")
            elif isinstance(node, ast.Try):
                catches_import = any(h.type is None or "ImportError" in ast.dump(h.type)
                                     or "ModuleNotFoundError" in ast.dump(h.type) for h in node.handlers)
                visit(node.body, "optional" if catches_import and context == "top" else context)
                for handler in node.handlers:
                    visit(handler.body, "skipped" if catches_import else context)
                visit(node.orelse, context)
                visit(node.finalbody, context)
            elif isinstance(node, (ast.With, ast.For, ast.While)):
                visit(node.body, context)
                visit(getattr(node, "orelse", []) or [], context)

    visit(tree.body, "top")
    return found


class Closure:
    """The release's modules a set of entry modules imports when loaded with the given stand-ins."""

    def __init__(self):
        self.modules = {}  # module → relative path of every release file imported
        self.packages = set()  # packages imported by name alone (registered empty, like every parent)
        self.lazy = {}  # module → relative path of release files imported only inside functions
        self.stand_ins = set()  # stand-in modules reached
        self.third_party = set()  # top-level names of non-stdlib, non-vLLM modules imported at load
        self.errors = []  # "file:line: ..." problems that would stop the import
        self.notes = []  # imports that are lazy, optional or under an undecidable if, and missing
        self.attribute_uses = {}  # ("current_platform" | "envs", attr) → first "file:line"

    def merge(self, other):
        self.modules.update(other.modules)
        self.packages |= other.packages
        self.lazy.update(other.lazy)
        self.stand_ins |= other.stand_ins
        self.third_party |= other.third_party
        self.notes += [n for n in other.notes if n not in self.notes]
        for key, where in other.attribute_uses.items():
            self.attribute_uses.setdefault(key, where)


def _int_constants(tree):
    """{name: value} of the module-level `NAME = <integer literal>` assignments (negative ones too)."""
    values = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            if isinstance(value, int) and not isinstance(value, bool):
                values.update({t.id: value for t in node.targets if isinstance(t, ast.Name)})
    return values


def _is_stdlib(name):
    names = getattr(sys, "stdlib_module_names", None)
    return name in names if names is not None else name in sys.builtin_module_names


def resolve_closure(root, entries, stand_ins):
    """Follows the imports of `entries` (module names of the release) through the release's files,
    stopping at `stand_ins` (module → provided names, None = any, "constants" = the integer constants
    of the release's file). Packages on the way are empty packages at load time (their __init__ does
    not run), so importing a name that only a package's __init__ defines is an error. An import that
    runs at load and cannot be satisfied is an error; one that is lazy (in a function), optional (in a
    try that catches ImportError) or under an `if` the stand-in platform cannot decide is a note."""
    closure = Closure()
    pending = [(m, "(entry)") for m in entries]
    trees = {}

    def tree_of(path):
        if path not in trees:
            trees[path] = _parse(path)
        return trees[path]

    def provided_by_stand_in(name):
        spec = stand_ins[name]
        if spec != "constants":
            return spec
        path, _ = _module_file(root, name)
        if path is None:
            return set()
        return set(_int_constants(tree_of(path)))

    def problem(required, message, context):
        if required:
            closure.errors.append(message)
        elif message not in closure.notes:
            closure.notes.append(f"{message} ({context} import)")

    while pending:
        module, origin = pending.pop()
        if module in closure.modules or module in closure.stand_ins:
            continue
        if module in stand_ins:
            closure.stand_ins.add(module)
            continue
        path, is_package = _module_file(root, module)
        if is_package:  # imported by name alone: an empty package at load time
            closure.packages.add(module)
            continue
        if path is None:
            closure.errors.append(f"{origin}: imports {module}, which is not in the release "
                                  f"({module.replace('.', '/')}.py missing) and has no stand-in")
            continue
        rel = os.path.relpath(path, root)
        closure.modules[module] = rel
        tree = tree_of(path)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                    and node.value.id in ("current_platform", "envs")):
                closure.attribute_uses.setdefault((node.value.id, node.attr), f"{rel}:{node.lineno}")
        for target, name, line, context in _imports(tree, module, False):
            where = f"{rel}:{line}"
            top = target.split(".")[0]
            if top != "vllm":
                if context in ("top", "unknown") and not _is_stdlib(top):
                    closure.third_party.add(top)
                continue
            if context == "skipped":
                continue
            required = context == "top"
            # `from P import name`: a submodule of P (a file, or a stand-in), else an attribute of P.
            if name not in (None, "*"):
                sub = f"{target}.{name}"
                if sub in stand_ins or _module_file(root, sub)[0] is not None:
                    if context != "lazy":
                        pending.append((sub, where))
                    elif sub not in stand_ins:
                        closure.lazy[sub] = os.path.relpath(_module_file(root, sub)[0], root)
                    continue
            if target in stand_ins:
                provided = provided_by_stand_in(target)
                if context != "lazy":
                    closure.stand_ins.add(target)
                if name not in (None, "*") and provided is not None and name not in provided:
                    problem(required, f"{where}: imports {name} from {target}, which its stand-in does not provide "
                                      f"(it provides: {', '.join(sorted(provided)) or 'nothing'})", context)
                continue
            path_t, package_t = _module_file(root, target)
            if package_t:
                if name is None:  # `import vllm.a.b`: the empty package is enough
                    if context != "lazy":
                        closure.packages.add(target)
                    continue
                problem(required, f"{where}: imports {name} from the package {target}, whose __init__.py the "
                                  "loader does not run (only its submodules can be imported)", context)
                continue
            if path_t is None:
                problem(required, f"{where}: imports {target}, which is not in the release "
                                  f"({target.replace('.', '/')}.py missing) and has no stand-in", context)
                continue
            if name not in (None, "*"):
                defined = _top_level_names(tree_of(path_t))
                if defined is not None and name not in defined:
                    problem(required, f"{where}: imports {name} from {target}, which "
                                      f"{os.path.relpath(path_t, root)} does not define", context)
                    continue
            if context != "lazy":
                pending.append((target, where))
            else:
                closure.lazy[target] = os.path.relpath(path_t, root)
    return closure


def _function(root, rel, name):
    """The top-level def `name` of the release file `rel` as an ast node, or None."""
    path = os.path.join(root, rel)
    if not os.path.isfile(path):
        return None
    for node in _parse(path).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    return None


def _free_names(nodes):
    """Names the given defs read that neither they (parameters, assignments, inner defs) nor builtins
    define: what executing them on their own would need from their module."""
    import builtins

    loaded, bound = set(), set()
    for node in nodes:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name):
                (loaded if isinstance(sub.ctx, ast.Load) else bound).add(sub.id)
            elif isinstance(sub, ast.arg):
                bound.add(sub.arg)
            elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and sub not in nodes:
                bound.add(sub.name)
            elif isinstance(sub, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split(".")[0] for a in sub.names)
    return loaded - bound - set(dir(builtins))


def _params(node):
    args = node.args
    return [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs] + (
        ["**" + args.kwarg.arg] if args.kwarg else [])


class Plan:
    """What one release offers the linear peer, read without importing anything (see resolve_release)."""

    def __init__(self, root):
        self.root = root
        self.version = vllm_kernels._version(root)
        self.gdn_error = None  # why the GDN peer cannot run (None: it can)
        self.mamba2_error = None
        self.gdn_ops = None  # the ops folder (relative)
        self.gdn_params = []
        self.gdn_prep = None  # "post_conv_prep" | "gdn_gating" | "torch"
        self.gdn_prep_file = None
        self.gdn_index = False  # chunk_indices/chunk_offsets precomputed by the release's index.py
        self.mamba2_name = None
        self.mamba2_params = []
        self.entries = {"gdn": [], "mamba2": []}
        self.closure = None
        self.warnings = []

    def files(self):
        return sorted(self.closure.modules.values()) if self.closure else []

    def packages(self):
        """Every package above a module the loader imports (registered empty at load time)."""
        names = set(self.closure.packages)
        for module in list(self.closure.modules) + sorted(self.closure.stand_ins) + sorted(self.closure.packages):
            parts = module.split(".")
            names.update(".".join(parts[:i]) for i in range(1, len(parts)))
        return sorted(names - set(self.closure.modules) - self.closure.stand_ins, key=lambda n: (n.count("."), n))


def resolve_release(path):
    """Reads the release at `path` (the folder holding vllm/, or vllm/ itself) by ast: where the GDN and
    Mamba-2 kernels are, their signatures, the preparation path, and the modules the peer would import.
    Raises UsageError naming the option for an unusable folder; a missing kernel sets gdn_error /
    mamba2_error (the cases of that kind then cannot run)."""
    try:
        root = vllm_kernels._package_root(path)
    except FileNotFoundError as e:
        raise UsageError(f"--vllm {path}: {e}")
    plan = Plan(root)
    # GDN: chunk.py of the first ops folder that has one.
    for ops in GDN_OPS_DIRS:
        if os.path.isfile(os.path.join(root, ops, "chunk.py")):
            plan.gdn_ops = ops
            break
    if plan.gdn_ops is None:
        plan.gdn_error = f"no chunk.py under {' or '.join(GDN_OPS_DIRS)}"
    else:
        chunk_rel = f"{plan.gdn_ops}/chunk.py"
        node = _function(root, chunk_rel, "chunk_gated_delta_rule")
        if node is None:
            plan.gdn_error = f"{chunk_rel} defines no function chunk_gated_delta_rule"
        else:
            plan.gdn_params = _params(node)
            missing = [p for p in GDN_CHUNK_PARAMS if p not in plan.gdn_params]
            if missing:
                plan.gdn_error = (f"{chunk_rel}: chunk_gated_delta_rule has no parameter {', '.join(missing)} "
                                  f"(it takes {', '.join(plan.gdn_params)})")
        package = plan.gdn_ops.replace("/", ".")
        plan.entries["gdn"] = [f"{package}.chunk"]
        prep = _function(root, f"{plan.gdn_ops}/fused_gdn_prefill_post_conv.py", "fused_post_conv_prep")
        if prep is not None and all(p in _params(prep) for p in POST_CONV_PARAMS):
            plan.gdn_prep, plan.gdn_prep_file = "post_conv_prep", f"{plan.gdn_ops}/fused_gdn_prefill_post_conv.py"
            plan.entries["gdn"].append(f"{package}.fused_gdn_prefill_post_conv")
        elif all(_function(root, QWEN3_NEXT_MODEL, n) is not None for n in GATING_DEFINITIONS):
            plan.gdn_prep, plan.gdn_prep_file = "gdn_gating", QWEN3_NEXT_MODEL
            # Only these definitions are executed: any other module-level name they use is missing.
            free = _free_names([_function(root, QWEN3_NEXT_MODEL, n) for n in GATING_DEFINITIONS])
            free -= set(GATING_DEFINITIONS) | {"torch", "triton", "tl"}
            if free:
                plan.gdn_error = (f"{QWEN3_NEXT_MODEL}: {' and '.join(GATING_DEFINITIONS)} use "
                                  f"{', '.join(sorted(free))}, which the peer does not provide when it executes them")
        else:
            plan.gdn_prep = "torch"
            plan.warnings.append("no fused_post_conv_prep and no fused_gdn_gating in the release: the GDN gates "
                                 "are computed in torch, the q/k L2 norm inside the chunk kernel")
        if "chunk_indices" in plan.gdn_params and all(
                _function(root, f"{plan.gdn_ops}/index.py", f) is not None
                for f in ("prepare_chunk_indices", "prepare_chunk_offsets")):
            plan.gdn_index = True
            plan.entries["gdn"].append(f"{package}.index")
    # Mamba-2: the varlen entry point of 0.11 and later.
    node = _function(root, SSD_COMBINED, "mamba_chunk_scan_combined_varlen")
    if not os.path.isfile(os.path.join(root, SSD_COMBINED)):
        plan.mamba2_error = f"no {SSD_COMBINED}"
    elif node is None:
        older = _function(root, SSD_COMBINED, "mamba_chunk_scan_combined") is not None
        plan.mamba2_error = (f"{SSD_COMBINED} defines no function mamba_chunk_scan_combined_varlen"
                             + (" (only mamba_chunk_scan_combined, the API before vLLM 0.11, which this peer "
                                "does not call)" if older else ""))
    else:
        plan.mamba2_name = "mamba_chunk_scan_combined_varlen"
        plan.mamba2_params = _params(node)
        missing = [p for p in SSD_PARAMS if p not in plan.mamba2_params]
        if missing:
            plan.mamba2_error = (f"{SSD_COMBINED}: mamba_chunk_scan_combined_varlen has no parameter "
                                 f"{', '.join(missing)} (it takes {', '.join(plan.mamba2_params)})")
        plan.entries["mamba2"] = ["vllm.model_executor.layers.mamba.ops.ssd_combined"]
    # The modules each kind imports; an import problem makes that kind unusable.
    plan.closure = Closure()
    for kind in ("gdn", "mamba2"):
        if not plan.entries[kind] or getattr(plan, f"{kind}_error"):
            continue
        closure = resolve_closure(root, plan.entries[kind], LINEAR_STAND_INS)
        if closure.errors:
            setattr(plan, f"{kind}_error", "; ".join(closure.errors))
            continue
        plan.closure.merge(closure)
    # Attributes of current_platform / envs the files use that the stand-ins lack: fine if only a path
    # the peer does not take uses them, which the dry run cannot tell, so they are warnings.
    platform_attrs = {a for a in dir(LinearPlatform) if not a.startswith("_")}
    for (owner, attr), where in sorted(plan.closure.attribute_uses.items()):
        if owner == "current_platform" and attr not in platform_attrs:
            plan.warnings.append(f"{where}: current_platform.{attr} is not in the platform stand-in")
        if owner == "envs" and attr not in ENV_DEFAULTS:
            plan.warnings.append(f"{where}: envs.{attr} is not in the vllm.envs stand-in")
    return plan


# --- stand-ins and the import (GPU machine) -----------------------------------------------------------

class _DeviceCapability(tuple):
    """(major, minor) with vLLM's to_int(): compares equal to a tuple, as vLLM's NamedTuple does."""

    def __new__(cls, major, minor):
        return super().__new__(cls, (major, minor))

    @property
    def major(self):
        return self[0]

    @property
    def minor(self):
        return self[1]

    def to_int(self):
        return self[0] * 10 + self[1]


class LinearPlatform(vllm_kernels._Platform):
    """vllm_kernels' CUDA platform stand-in plus what the linear kernels ask of vLLM's CudaPlatform."""

    def is_cuda_alike(self):
        return True

    def is_cpu(self):
        return False

    def is_tpu(self):
        return False

    def get_device_capability(self, device_id=0):
        return _DeviceCapability(*self._torch.cuda.get_device_capability(device_id))

    def is_device_capability(self, capability, device_id=0):
        current = self.get_device_capability(device_id)
        return current == tuple(capability) if isinstance(capability, tuple) else current.to_int() == capability

    def num_compute_units(self, device_id=0):
        return self._torch.cuda.get_device_properties(device_id).multi_processor_count

    def get_device_name(self, device_id=0):
        return self._torch.cuda.get_device_name(device_id)


def _module(name, **attributes):
    module = types.ModuleType(name)
    module.__dict__.update(attributes)
    sys.modules[name] = module
    return module


def _constants(root, name):
    """A module of the integer constants the release's own file `name` defines (read by ast)."""
    path, _ = _module_file(root, name)
    return _module(name, **(_int_constants(_parse(path)) if path is not None else {}))


def install_stand_ins(plan):
    """Puts the LINEAR_STAND_INS modules into sys.modules (needs torch and triton)."""
    import torch
    import triton
    import triton.language as tl

    try:
        import triton.language.extra.libdevice as tldevice
    except ImportError:  # older Triton
        tldevice = tl.extra.cuda.libdevice
    platform = LinearPlatform(torch)
    _module("vllm.platforms", current_platform=platform)
    _module("vllm.logger", init_logger=vllm_kernels._logger_factory)
    _module("vllm.triton_utils", triton=triton, tl=tl, tldevice=tldevice, HAS_TRITON=True,
            LOG2E=1.0 / math.log(2.0), LOGE2=math.log(2.0))

    envs = _module("vllm.envs", **ENV_DEFAULTS)

    def missing_flag(name):
        raise AttributeError(f"vllm.envs stand-in: flag {name} is not modelled (vllm_linear_peer.ENV_DEFAULTS)")

    envs.__getattr__ = missing_flag
    custom_ops = _module("vllm._custom_ops")

    def missing_op(name):
        raise AttributeError(f"vllm._custom_ops.{name}: vLLM's compiled ops are not loaded by the peer")

    custom_ops.__getattr__ = missing_op

    def num_compute_units(device_id=0):
        return platform.num_compute_units(device_id)

    def get_device_name_as_file_name(device_id=0):
        return re.sub(r"[\s/]+", "_", platform.get_device_name(device_id))

    _module("vllm.utils.platform_utils", num_compute_units=num_compute_units,
            get_device_name_as_file_name=get_device_name_as_file_name)
    # With vLLM's sync check off (its default) gpu_sync_allowed() only marks a region.
    _module("vllm.utils.gpu_sync_debug", gpu_sync_allowed=contextlib.nullcontext)

    def async_tensor_h2d(data, device=None, dtype=None, out=None):
        # vLLM copies from pinned memory without a sync; the peer calls it only while planning (the
        # chunk indices), outside the timed calls, so a plain copy does.
        if dtype is None and out is not None:
            dtype = out.dtype
        tensor = torch.as_tensor(data, dtype=dtype)
        if out is not None:
            return out.copy_(tensor)
        return tensor.to(device=device)

    _module("vllm.utils.torch_utils", async_tensor_h2d=async_tensor_h2d)
    for name, spec in LINEAR_STAND_INS.items():
        if spec == "constants":
            _constants(plan.root, name)


def _exec_definitions(root, rel, names, namespace):
    """Executes only the top-level definitions `names` of the release file `rel` (e.g. the gating kernel
    of a model file, whose own imports need the whole of vLLM) in `namespace`; returns the namespace."""
    path = os.path.join(root, rel)
    tree = _parse(path)
    body = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in names]
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec"), namespace)
    return namespace


class VllmLinear:
    """The release's GDN and Mamba-2 prefill kernels, imported with the stand-ins (one release per process)."""

    def __init__(self, plan):
        import torch
        import triton
        import triton.language as tl

        self.plan = plan
        self.torch = torch
        root = plan.root
        if "vllm" in sys.modules and getattr(sys.modules["vllm"], "__path__", [None])[0] != os.path.join(root, "vllm"):
            raise RuntimeError("another vLLM release is already loaded in this process")
        for name in [n for n in sys.modules if n == "vllm" or n.startswith("vllm.")]:
            sys.modules.pop(name)
        for package in plan.packages():
            vllm_kernels._package(package, os.path.join(root, *package.split(".")))
        install_stand_ins(plan)
        self.gdn = self.mamba2 = None
        self.errors = {}
        if plan.gdn_error is None:
            try:
                package = plan.gdn_ops.replace("/", ".")
                chunk = importlib.import_module(f"{package}.chunk")
                self.gdn = types.SimpleNamespace(chunk=chunk.chunk_gated_delta_rule, prep=None, gating=None,
                                                 index=None)
                if plan.gdn_prep == "post_conv_prep":
                    self.gdn.prep = importlib.import_module(f"{package}.fused_gdn_prefill_post_conv").fused_post_conv_prep
                elif plan.gdn_prep == "gdn_gating":
                    namespace = _exec_definitions(root, QWEN3_NEXT_MODEL, GATING_DEFINITIONS,
                                                  {"torch": torch, "triton": triton, "tl": tl})
                    self.gdn.gating = namespace["fused_gdn_gating"]
                if plan.gdn_index:
                    self.gdn.index = importlib.import_module(f"{package}.index")
            except Exception as e:  # recorded per case: the Mamba-2 peer may still run
                self.errors["gdn"] = f"{type(e).__name__}: {e}"
                self.gdn = None
        if plan.mamba2_error is None:
            try:
                module = importlib.import_module(plan.entries["mamba2"][0])
                self.mamba2 = getattr(module, plan.mamba2_name)
            except Exception as e:
                self.errors["mamba2"] = f"{type(e).__name__}: {e}"

    def files(self):
        return [os.path.relpath(m.__file__, self.plan.root) for n, m in sorted(sys.modules.items())
                if n.startswith("vllm.") and getattr(m, "__file__", None)]


# --- FLA ------------------------------------------------------------------------------------------------

def locate_fla(path):
    """(folder holding fla/, or None, the reason it is unusable or None), without importing it."""
    if path is not None:
        folder = os.path.abspath(path)
        if os.path.basename(folder) == "fla" and os.path.isdir(os.path.join(folder, "ops")):
            folder = os.path.dirname(folder)
        if not os.path.isdir(os.path.join(folder, "fla")):
            raise UsageError(f"--fla {path}: no fla/ package folder (unpack the fla-core wheel there)")
    else:
        spec = importlib.util.find_spec("fla")
        if spec is None or not spec.submodule_search_locations:
            return None, "the fla package (flash-linear-attention / fla-core) is not installed; --fla DIR names an unpacked wheel"
        folder = os.path.dirname(list(spec.submodule_search_locations)[0])
    rel = "fla/ops/gated_delta_rule/chunk.py"
    if not os.path.isfile(os.path.join(folder, rel)):
        reason = f"{folder}: no {rel} (the kernels are in the fla-core wheel)"
        if path is not None:
            raise UsageError(f"--fla {path}: no {rel} (the kernels are in the fla-core wheel)")
        return None, reason
    if _function(folder, rel, "chunk_gated_delta_rule") is None:
        reason = f"{os.path.join(folder, rel)} defines no function chunk_gated_delta_rule"
        if path is not None:
            raise UsageError(f"--fla {path}: {reason}")
        return None, reason
    return folder, None


def fla_version(folder):
    path = os.path.join(folder, "fla", "__init__.py")
    if os.path.isfile(path):
        for node in _parse(path).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and any(
                    getattr(t, "id", "") == "__version__" for t in node.targets):
                return str(node.value.value)
    return "unknown"


def import_fla(folder):
    """FLA's chunk_gated_delta_rule and how it was imported. First as a package (fla/__init__ imports the
    optional fla.layers / fla.models, fla/ops/__init__ every op family); if that fails, with fla and
    fla.ops registered as empty packages, so only gated_delta_rule and what it imports load."""
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        module = importlib.import_module("fla.ops.gated_delta_rule")
        return module.chunk_gated_delta_rule, "package import"
    except Exception as e:
        first = f"{type(e).__name__}: {e}"
    for name in [n for n in sys.modules if n == "fla" or n.startswith("fla.")]:
        sys.modules.pop(name)
    vllm_kernels._package("fla", os.path.join(folder, "fla"))
    vllm_kernels._package("fla.ops", os.path.join(folder, "fla", "ops"))
    module = importlib.import_module("fla.ops.gated_delta_rule")
    return module.chunk_gated_delta_rule, f"fla/__init__ and fla/ops/__init__ bypassed (the package import failed: {first[:200]})"


# --- the float64 re-implementation (numpy on the CPU self-test, torch on the GPU) ------------------------

class Xp:
    """The few array operations the reference math needs, on numpy or torch alike."""

    def __init__(self, lib):
        self.lib = lib
        self.is_torch = lib.__name__ == "torch"

    def zeros(self, shape, like):
        if self.is_torch:
            return self.lib.zeros(shape, dtype=like.dtype, device=like.device)
        return self.lib.zeros(shape, dtype=like.dtype)

    def f64(self, x):
        return x.to(self.lib.float64) if self.is_torch else x.astype(self.lib.float64)

    def cat(self, parts):
        return self.lib.cat(parts, 0) if self.is_torch else self.lib.concatenate(parts, 0)

    def stack(self, parts):
        return self.lib.stack(parts, 0)

    def repeat(self, x, n, axis):
        return self.lib.repeat_interleave(x, n, dim=axis) if self.is_torch else self.lib.repeat(x, n, axis=axis)

    def sum_last(self, x):
        return x.sum(-1, keepdim=True) if self.is_torch else x.sum(-1, keepdims=True)

    def softplus(self, x):  # threshold 20, as vLLM and reference/ssm/layer_parts.h
        return self.lib.where(x > 20.0, x, self.lib.log1p(self.lib.exp(self.lib.minimum(x, x * 0 + 20.0))))

    def sigmoid(self, x):
        return 1.0 / (1.0 + self.lib.exp(-x))


def conv_silu(xp, x, weight, bias):
    """A fresh request's depthwise causal conv + SiLU in x's dtype: x [T, C] (rows in token order, no
    conv history), weight [C, K] (column K-1 multiplies the current token), bias [C] or None."""
    taps = weight.shape[1]
    padded = xp.cat([xp.zeros((taps - 1, x.shape[1]), like=x), x])
    out = padded[0:x.shape[0]] * weight[:, 0]
    for j in range(1, taps):
        out = out + padded[j:j + x.shape[0]] * weight[:, j]
    if bias is not None:
        out = out + bias
    return out * xp.sigmoid(out)


def gdn_reference(xp, qkv, a, b, A_log, dt_bias, shape):
    """reference/ssm/gdn_core.h's recurrence from the conv output (float64, token by token, zero state):
    q̂ = q / sqrt(Σq² + 1e-6) · dk^-1/2, k̂ = k / sqrt(Σk² + 1e-6), α = exp(−exp(A_log)·softplus(a + dt_bias)),
    β = sigmoid(b); per value head M ← α·M; u = β·(v − M k̂); M ← M + u k̂ᵀ; o = M q̂.
    Returns o [T, Hv·dv] and the final state [Hv, dv, dk]."""
    hk, hv, dk, dv = shape
    t = qkv.shape[0]
    q = qkv[:, :hk * dk].reshape(t, hk, dk)
    k = qkv[:, hk * dk:2 * hk * dk].reshape(t, hk, dk)
    v = qkv[:, 2 * hk * dk:].reshape(t, hv, dv)
    q = q / (xp.sum_last(q * q) + 1e-6) ** 0.5 * dk ** -0.5
    k = k / (xp.sum_last(k * k) + 1e-6) ** 0.5
    q, k = xp.repeat(q, hv // hk, 1), xp.repeat(k, hv // hk, 1)
    alpha = xp.lib.exp(-xp.lib.exp(A_log) * xp.softplus(a + dt_bias))
    beta = xp.sigmoid(b)
    state = xp.zeros((hv, dv, dk), like=qkv)
    out = []
    for i in range(t):
        state = state * alpha[i][:, None, None]
        u = beta[i][:, None] * (v[i] - xp.lib.einsum("hvk,hk->hv", state, k[i]))
        state = state + u[:, :, None] * k[i][:, None, :]
        out.append(xp.lib.einsum("hvk,hk->hv", state, q[i]))
    return xp.stack(out).reshape(t, hv * dv), state


def mamba2_reference(xp, xbc, dt, A_log, dt_bias, D, shape):
    """reference/ssm/mamba2_core.h's recurrence from the conv output (float64, token by token, zero
    state): x | B | C = xbc, Δ = softplus(dt + dt_bias), A = −exp(A_log); per head h (group
    h / (Hs/G)) state ← exp(Δ·A)·state + Δ·x ⊗ B; y = state·C + D·x. Returns y [T, Hs·P], final state."""
    hs, p, n, g = shape
    t = xbc.shape[0]
    x = xbc[:, :hs * p].reshape(t, hs, p)
    B = xp.repeat(xbc[:, hs * p:hs * p + g * n].reshape(t, g, n), hs // g, 1)
    C = xp.repeat(xbc[:, hs * p + g * n:].reshape(t, g, n), hs // g, 1)
    delta = xp.softplus(dt + dt_bias)
    A = -xp.lib.exp(A_log)
    state = xp.zeros((hs, p, n), like=xbc)
    out = []
    for i in range(t):
        state = state * xp.lib.exp(delta[i] * A)[:, None, None] + \
            (delta[i][:, None] * x[i])[:, :, None] * B[i][:, None, :]
        out.append(xp.lib.einsum("hpn,hn->hp", state, C[i]) + D[:, None] * x[i])
    return xp.stack(out).reshape(t, hs * p), state


def errors(xp, got, want):
    """(max |got − want| / max |want|, ‖got − want‖ / ‖want‖, max |got − want|), in float64."""
    got, want = xp.f64(got), xp.f64(want)
    diff = got - want
    scale = float(abs(want).max())
    norm = float((want * want).sum()) ** 0.5
    max_abs = float(abs(diff).max())
    return (max_abs / scale if scale > 0 else max_abs,
            float((diff * diff).sum()) ** 0.5 / norm if norm > 0 else float((diff * diff).sum()) ** 0.5, max_abs)


# --- the benchmark's inputs ------------------------------------------------------------------------------

def mul32(a, b):
    """(a · b) mod 2^32 for a < 2^32 without passing 2^63 (int64 tensors, or Python ints)."""
    return (a * (b & 0xFFFF) + (((a * (b >> 16)) & 0xFFFF) << 16)) & 0xFFFFFFFF


def bench_hash(i, seed):
    """bench_linear.cu's fill_kernel hash of element index i (int64 tensor, or a Python int)."""
    h = mul32(i & 0xFFFFFFFF, 2654435761) ^ seed
    h = h ^ (h >> 16)
    h = mul32(h, 0x85EBCA6B)
    return h ^ (h >> 13)


def f32(x):
    """x rounded to float32, as a Python float."""
    return struct.unpack("<f", struct.pack("<f", x))[0]


def bench_fill(torch, n, low, high, seed, device):
    """Element i = low + (high − low)·(hash(i, seed) & 0xFFFFFF) / 2^24 in float32 arithmetic, as the
    benchmark's fill_kernel computes it (the product rounded once, the power-of-two scaling exact)."""
    out = torch.empty(n, dtype=torch.float32, device=device)
    step = 1 << 26  # bounded int64 temporaries
    span, low32 = f32(f32(high) - f32(low)), f32(low)
    for begin in range(0, n, step):
        i = torch.arange(begin, min(n, begin + step), dtype=torch.int64, device=device)
        frac = (bench_hash(i, seed) & 0xFFFFFF).to(torch.float32)
        out[begin:begin + i.numel()] = frac * span / 16777216.0 + low32
    return out


# --- the peers -----------------------------------------------------------------------------------------

class GdnInputs:
    """One GDN prefill as the peers take it: conv_out [T, conv_dim] (bf16, after conv + SiLU), a, b [T, Hv]
    (bf16), A_log, dt_bias [Hv] (float32)."""

    def __init__(self, shape, conv_out, a, b, A_log, dt_bias):
        self.shape, self.conv_out, self.a, self.b, self.A_log, self.dt_bias = shape, conv_out, a, b, A_log, dt_bias

    @property
    def tokens(self):
        return self.conv_out.shape[0]


class Mamba2Inputs:
    """One Mamba-2 prefill: xbc [T, conv_dim] (bf16, after conv + SiLU: x | B | C), dt [T, Hs] (bf16,
    before dt_bias and the softplus), A_log, dt_bias, D [Hs] (float32)."""

    def __init__(self, shape, xbc, dt, A_log, dt_bias, D):
        self.shape, self.xbc, self.dt, self.A_log, self.dt_bias, self.D = shape, xbc, dt, A_log, dt_bias, D

    @property
    def tokens(self):
        return self.xbc.shape[0]


class VllmGdnPeer:
    name = "vllm"

    def __init__(self, kernels):
        self.k = kernels.gdn
        self.plan = kernels.plan
        self.torch = kernels.torch
        prep = {"post_conv_prep": "fused_post_conv_prep (split, q/k L2 norm, gates)",
                "gdn_gating": "fused_gdn_gating (qwen3_next.py) + q/k L2 norm in the chunk kernel",
                "torch": "gates in torch + q/k L2 norm in the chunk kernel"}[self.plan.gdn_prep]
        self.impl = f"vllm {self.plan.version}: {prep} + chunk_gated_delta_rule + final state to the pool"

    def prepare(self, x):
        """Returns fn() running the prefill, whose result is o [T, Hv·dv]. Metadata (cu_seqlens, chunk
        indices), the zero initial state and the pool are made here, outside the timed call, as vLLM
        builds them once per step for all its layers."""
        torch = self.torch
        hk, hv, dk, dv = x.shape
        t = x.tokens
        dev = x.conv_out.device
        cu = torch.tensor([0, t], dtype=torch.int32, device=dev)
        initial = torch.zeros((1, hv, dv, dk), dtype=torch.float32, device=dev)
        pool = torch.zeros((2, hv, dv, dk), dtype=torch.float32, device=dev)
        kwargs = {}
        if self.k.index is not None:
            kwargs["chunk_indices"] = self.k.index.prepare_chunk_indices(cu, GDN_CHUNK)
            kwargs["chunk_offsets"] = self.k.index.prepare_chunk_offsets(cu, GDN_CHUNK)
        if "head_first" in self.plan.gdn_params:
            kwargs["head_first"] = False
        chunk = self.k.chunk

        def run():
            if self.plan.gdn_prep == "post_conv_prep":
                q, k, v, g, beta = self.k.prep(conv_output=x.conv_out, a=x.a, b=x.b, A_log=x.A_log, dt_bias=x.dt_bias,
                                               num_k_heads=hk, head_k_dim=dk, head_v_dim=dv, apply_l2norm=True)
                q, k, v, g, beta = (y.unsqueeze(0) for y in (q, k, v, g, beta))
                l2norm = False
            else:  # vLLM's rearrange_mixed_qkv: split, view as heads, contiguous
                q, k, v = torch.split(x.conv_out, [hk * dk, hk * dk, hv * dv], dim=-1)
                q = q.reshape(1, t, hk, dk).contiguous()
                k = k.reshape(1, t, hk, dk).contiguous()
                v = v.reshape(1, t, hv, dv).contiguous()
                if self.plan.gdn_prep == "gdn_gating":
                    g, beta = self.k.gating(x.A_log, x.a, x.b, x.dt_bias)
                else:
                    g = (-torch.exp(x.A_log) * torch.nn.functional.softplus(x.a.float() + x.dt_bias)).unsqueeze(0)
                    beta = torch.sigmoid(x.b.float()).to(x.b.dtype).unsqueeze(0)
                l2norm = True
            o, final = chunk(q=q, k=k, v=v, g=g, beta=beta, scale=dk ** -0.5, initial_state=initial,
                             output_final_state=True, cu_seqlens=cu, use_qk_l2norm_in_kernel=l2norm, **kwargs)
            pool[1] = final[0]
            return o.reshape(t, hv * dv)

        return run


class FlaGdnPeer:
    name = "fla"

    def __init__(self, torch, fn, version, how):
        self.torch, self.fn, self.version = torch, fn, version
        import inspect

        self.params = inspect.signature(fn).parameters
        try:
            source = inspect.getsource(sys.modules[fn.__module__])
        except (OSError, TypeError, KeyError):
            source = ""
        # FLA 0.5+: the gate (−exp(A_log)·softplus(a + dt_bias)) and β = sigmoid(b) inside its kernels.
        self.gate_in_kernel = "use_gate_in_kernel" in source and "use_beta_sigmoid_in_kernel" in self.params
        self.v_first = "state_v_first" in self.params
        self.impl = (f"fla {version} ({how}): chunk_gated_delta_rule, " +
                     ("gates, sigmoid and q/k L2 norm in its kernels" if self.gate_in_kernel
                      else "gates in torch, q/k L2 norm in its kernel"))

    def prepare(self, x):
        """fn() → o [T, Hv·dv]: FLA called as a library user calls it on one sequence (batch 1, no
        cu_seqlens: its fixed-length path), q/k/v views of the conv output."""
        torch = self.torch
        hk, hv, dk, dv = x.shape
        t = x.tokens
        dev = x.conv_out.device
        state_shape = (1, hv, dv, dk) if self.v_first else (1, hv, dk, dv)
        initial = torch.zeros(state_shape, dtype=torch.float32, device=dev)
        pool = torch.zeros((2,) + state_shape[1:], dtype=torch.float32, device=dev)
        extra = {"state_v_first": True} if self.v_first else {}

        def run():
            q, k, v = torch.split(x.conv_out, [hk * dk, hk * dk, hv * dv], dim=-1)
            q, k, v = q.view(1, t, hk, dk), k.view(1, t, hk, dk), v.view(1, t, hv, dv)
            if self.gate_in_kernel:
                o, final = self.fn(q, k, v, x.a.unsqueeze(0), x.b.unsqueeze(0), scale=dk ** -0.5, initial_state=initial,
                                   output_final_state=True, use_qk_l2norm_in_kernel=True,
                                   use_beta_sigmoid_in_kernel=True, use_gate_in_kernel=True, A_log=x.A_log,
                                   dt_bias=x.dt_bias, **extra)
            else:
                g = (-torch.exp(x.A_log) * torch.nn.functional.softplus(x.a.float() + x.dt_bias)).unsqueeze(0)
                beta = torch.sigmoid(x.b.float()).to(x.b.dtype).unsqueeze(0)
                o, final = self.fn(q, k, v, g, beta, scale=dk ** -0.5, initial_state=initial, output_final_state=True,
                                   use_qk_l2norm_in_kernel=True, **extra)
            pool[1] = final[0]
            return o.reshape(t, hv * dv)

        return run


class VllmMamba2Peer:
    name = "vllm"

    def __init__(self, kernels, chunk_size):
        self.fn = kernels.mamba2
        self.plan = kernels.plan
        self.torch = kernels.torch
        self.chunk = chunk_size
        self.fused_final = "final_states_out" in self.plan.mamba2_params
        self.impl = (f"vllm {self.plan.version}: mamba_chunk_scan_combined_varlen, chunk {chunk_size}, final state "
                     + ("written by the kernel" if self.fused_final else "copied to the pool"))

    def prepare(self, x):
        torch = self.torch
        hs, p, n, g = x.shape
        t = x.tokens
        dev = x.xbc.device
        d = hs * p
        xs = x.xbc[:, :d].view(t, hs, p)
        B = x.xbc[:, d:d + g * n].view(t, g, n)
        C = x.xbc[:, d + g * n:].view(t, g, n)
        A = -torch.exp(x.A_log)  # MambaMixer2 keeps A = −exp(A_log) as its parameter
        chunks = (t + self.chunk - 1) // self.chunk
        cu = torch.tensor([0, t], dtype=torch.int32, device=dev)
        cu_chunks = torch.tensor([min(i * self.chunk, t) for i in range(chunks + 1)], dtype=torch.int32, device=dev)
        last = torch.tensor([chunks - 1], dtype=torch.int32, device=dev)
        seq_idx = torch.zeros(chunks, dtype=torch.int32, device=dev)
        out = torch.empty((t, hs, p), dtype=x.xbc.dtype, device=dev)
        pool = torch.zeros((2, hs, p, n), dtype=torch.float32, device=dev)
        slot = torch.tensor([1], dtype=torch.int32, device=dev)
        kwargs = {}
        if "state_dtype" in self.plan.mamba2_params:
            kwargs["state_dtype"] = torch.float32
        if "dt_limit" in self.plan.mamba2_params:
            kwargs["dt_limit"] = (0.0, float("inf"))
        if self.fused_final:
            kwargs.update(final_states_out=pool, final_state_indices=slot)

        def run():
            states = self.fn(xs, x.dt, A, B, C, chunk_size=self.chunk, cu_seqlens=cu, cu_chunk_seqlens=cu_chunks,
                             last_chunk_indices=last, seq_idx=seq_idx, out=out, D=x.D, z=None, dt_bias=x.dt_bias,
                             initial_states=None, dt_softplus=True, **kwargs)
            if not self.fused_final:
                pool[1] = states[0]
            return out.reshape(t, d)

        return run


# --- inputs for the three uses: timing, the float64 check, the check against ours ------------------------

def bench_gdn_inputs(torch, shape, tokens, dev):
    hk, hv, dk, dv = shape
    conv_dim = 2 * hk * dk + hv * dv

    def fill(name, n):
        low, high, seed = GDN_FILL[name]
        return bench_fill(torch, n, low, high, seed, dev)

    return GdnInputs(shape, fill("qkv", tokens * conv_dim).view(tokens, conv_dim).to(torch.bfloat16),
                     fill("a", tokens * hv).view(tokens, hv).to(torch.bfloat16),
                     fill("b", tokens * hv).view(tokens, hv).to(torch.bfloat16), fill("A_log", hv), fill("dt_bias", hv))


def bench_mamba2_inputs(torch, shape, tokens, dev):
    hs, p, n, g = shape
    conv_dim = hs * p + 2 * g * n

    def fill(name, count):
        low, high, seed = MAMBA2_FILL[name]
        return bench_fill(torch, count, low, high, seed, dev)

    return Mamba2Inputs(shape, fill("xbc", tokens * conv_dim).view(tokens, conv_dim).to(torch.bfloat16),
                        fill("dt", tokens * hs).view(tokens, hs).to(torch.bfloat16), fill("A_log", hs),
                        fill("dt_bias", hs), fill("D", hs))


class LayerFile:
    """A linear-layer batch file's inputs and weights (SCHEMA.md §6.4) and, from an outputs file, /outputs/output;
    arrays as numpy float32/float64 (h5py reads bfloat16 as float32, exactly)."""

    def __init__(self, batch, outputs=None):
        import h5py
        import numpy as np

        with h5py.File(batch, "r") as f:
            self.kind = f["config"].attrs["layer_kind"]
            self.kind = self.kind.decode() if isinstance(self.kind, bytes) else str(self.kind)
            self.ssm = {k: int(v) for k, v in f["config/ssm"].attrs.items()}
            self.inputs = {k: np.asarray(f["inputs"][k][()], dtype=np.float32) for k in f["inputs"]
                           if isinstance(f["inputs"][k], h5py.Dataset)}
            self.weights = {k: np.asarray(f["weights"][k][()], dtype=np.float64) for k in f["weights"]}
            self.query_start_loc = np.asarray(f["batch/query_start_loc"][()])
        self.output = None
        if outputs is not None:
            with h5py.File(outputs, "r") as f:
                self.output = np.asarray(f["outputs/output"][()], dtype=np.float64)

    def shape(self):
        s = self.ssm
        if self.kind == "gdn":
            return (s["num_k_heads"], s["num_v_heads"], s["head_k_dim"], s["head_v_dim"])
        return (s["num_ssm_heads"], s["head_dim"], s["state_size"], s["n_groups"])


def hybridtb_layer(hybridtb, workdir, kind, shape, tokens, backend, stem):
    """Writes a fresh prefill of `tokens` at `shape` with `hybridtb gen` and runs it on `backend`; returns
    (batch file, outputs file)."""
    batch = os.path.join(workdir, f"{stem}.h5")
    out = os.path.join(workdir, f"{stem}.{backend}.h5")
    if kind == "gdn":
        hk, hv, dk, dv = shape
        sets = ["--preset", "qwen3-next-gdn", "--set", f"ssm.num_k_heads={hk}", "--set", f"ssm.num_v_heads={hv}",
                "--set", f"ssm.head_k_dim={dk}", "--set", f"ssm.head_v_dim={dv}"]
    else:
        hs, p, n, g = shape
        sets = ["--preset", "falcon-h1-7b-mamba2", "--set", f"ssm.num_ssm_heads={hs}", "--set", f"ssm.head_dim={p}",
                "--set", f"ssm.state_size={n}", "--set", f"ssm.n_groups={g}"]
    for command in ([hybridtb, "gen", *sets, "--mix", f"p1x{tokens}", "--seed", "0", "--set", "dtype=bfloat16",
                     "--out", batch],
                    [hybridtb, "run", "--backend", backend, "--batch", batch, "--out", out, "--outputs-only", "--quiet",
                     "--force"]):
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command[:2])} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[:400]}")
    return batch, out


def file_reference(xp, layer, to):
    """The float64 reference output of a LayerFile's inputs (`to` turns a numpy array into xp's array)."""
    w = {k: to(v) for k, v in layer.weights.items()}
    if layer.kind == "gdn":
        qkv = conv_silu(xp, xp.f64(to(layer.inputs["mixed_qkv"])), w["conv1d_weight"], w.get("conv1d_bias"))
        return gdn_reference(xp, qkv, xp.f64(to(layer.inputs["a"])), xp.f64(to(layer.inputs["b"])), w["A_log"],
                             w["dt_bias"], layer.shape())[0]
    xbc = conv_silu(xp, xp.f64(to(layer.inputs["xBC"])), w["conv1d_weight"], w.get("conv1d_bias"))
    return mamba2_reference(xp, xbc, xp.f64(to(layer.inputs["dt"])), w["A_log"], w["dt_bias"], w["D"], layer.shape())[0]


def file_peer_inputs(torch, layer, dev):
    """The peer's inputs from a LayerFile: the conv + SiLU in float32 (as ours), rounded to bf16 (vLLM's
    conv writes the model dtype); the other activations as stored (bf16 values), weights float32."""
    xp = Xp(torch)

    def t(a, dtype=torch.float32):
        return torch.from_numpy(a).to(device=dev, dtype=dtype)

    w = {k: t(v) for k, v in layer.weights.items()}
    if layer.kind == "gdn":
        conv = conv_silu(xp, t(layer.inputs["mixed_qkv"]), w["conv1d_weight"], w.get("conv1d_bias"))
        return GdnInputs(layer.shape(), conv.to(torch.bfloat16), t(layer.inputs["a"], torch.bfloat16),
                         t(layer.inputs["b"], torch.bfloat16), w["A_log"], w["dt_bias"])
    conv = conv_silu(xp, t(layer.inputs["xBC"]), w["conv1d_weight"], w.get("conv1d_bias"))
    return Mamba2Inputs(layer.shape(), conv.to(torch.bfloat16), t(layer.inputs["dt"], torch.bfloat16), w["A_log"],
                        w["dt_bias"], w["D"])


def random_inputs(torch, kind, shape, tokens, dev, seed):
    """Small random inputs for the float64 check (conv output, gates' inputs and weights in the ranges
    of the benchmark's fills); returns (peer inputs, the float64 reference output)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def u(shape_, low, high):
        return (torch.rand(shape_, generator=gen, dtype=torch.float64) * (high - low) + low).to(dev)

    xp = Xp(torch)
    if kind == "gdn":
        hk, hv, dk, dv = shape
        conv = u((tokens, 2 * hk * dk + hv * dv), -1, 1).to(torch.bfloat16)
        a, b = u((tokens, hv), -1, 1).to(torch.bfloat16), u((tokens, hv), -1, 1).to(torch.bfloat16)
        A_log, dt_bias = u((hv,), -1, 1).float(), u((hv,), -0.1, 0.1).float()
        want = gdn_reference(xp, xp.f64(conv), xp.f64(a), xp.f64(b), xp.f64(A_log), xp.f64(dt_bias), shape)[0]
        return GdnInputs(shape, conv, a, b, A_log, dt_bias), want
    hs, p, n, g = shape
    xbc = u((tokens, hs * p + 2 * g * n), -1, 1).to(torch.bfloat16)
    dt = u((tokens, hs), -4.6, -2.3).to(torch.bfloat16)
    A_log, dt_bias, D = u((hs,), 0, 2.77).float(), u((hs,), -0.1, 0.1).float(), u((hs,), 0.5, 1.5).float()
    want = mamba2_reference(xp, xp.f64(xbc), xp.f64(dt), xp.f64(A_log), xp.f64(dt_bias), xp.f64(D), shape)[0]
    return Mamba2Inputs(shape, xbc, dt, A_log, dt_bias, D), want


# --- cases, options, ours ----------------------------------------------------------------------------------

def case_shape(kind, shape_name):
    return GDN_SHAPES[shape_name] if kind == "gdn_prefill" else FALCON_H1


def read_ours(path):
    """{case name: bench-linear.json case} and the file's GPU name; UsageError naming --ours otherwise."""
    try:
        with open(path) as f:
            doc = json.load(f)
    except OSError as e:
        raise UsageError(f"--ours {path}: cannot read it: {e.strerror}")
    except json.JSONDecodeError as e:
        raise UsageError(f"--ours {path}: not JSON ({e.msg}, line {e.lineno}); expected hybridtb_bench_linear --out")
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
        raise UsageError(f"--ours {path}: no \"cases\" list; expected the JSON of hybridtb_bench_linear --out")
    return {c["name"]: c for c in doc["cases"] if isinstance(c, dict) and "name" in c}, doc.get("gpu")


def select_cases(ours, pattern):
    """The default cases, plus prefill cases of the benchmark's file with another length (parsed from the
    name), filtered by --cases."""
    cases = list(CASES)
    known = {c[0] for c in cases}
    for name in ours or {}:
        m = _GDN_NAME.match(name)
        if m and name not in known and m.group(2) in GDN_SHAPES:
            cases.append((name, "gdn_prefill", m.group(2), int(m.group(1)) * 1024, True))
        m = _MAMBA2_NAME.match(name)
        if m and name not in known:
            cases.append((name, "mamba2_prefill", "falcon-h1-7b", int(m.group(1)) * 1024, True))
    if pattern:
        try:
            regex = re.compile(pattern)
        except re.error as e:
            raise UsageError(f"--cases {pattern!r}: not a regular expression ({e})")
        cases = [c for c in cases if regex.search(c[0])]
        if not cases:
            raise UsageError(f"--cases {pattern!r} matches no case (cases: {', '.join(c[0] for c in CASES)})")
    return cases


def describe_plan(plan, fla_folder, fla_reason, cases, ours, args):
    print(f"vLLM release: {plan.version} at {plan.root}")
    if plan.gdn_error:
        print(f"  GDN: unavailable: {plan.gdn_error}")
    else:
        print(f"  GDN: {plan.gdn_ops}/chunk.py: chunk_gated_delta_rule({', '.join(plan.gdn_params)})")
        print(f"       preparation: {plan.gdn_prep}" + (f" ({plan.gdn_prep_file})" if plan.gdn_prep_file else "")
              + ("; chunk indices from index.py" if plan.gdn_index else ""))
    if plan.mamba2_error:
        print(f"  Mamba-2: unavailable: {plan.mamba2_error}")
    else:
        print(f"  Mamba-2: {SSD_COMBINED}: {plan.mamba2_name}({', '.join(plan.mamba2_params)}), chunk {args.mamba_chunk}")
    print(f"  files imported from the release ({len(plan.files())}): {', '.join(plan.files())}")
    print(f"  stand-ins: {', '.join(sorted(plan.closure.stand_ins))}")
    print(f"  empty packages: {', '.join(plan.packages())}")
    print(f"  third-party modules: {', '.join(sorted(plan.closure.third_party))}")
    for note in plan.closure.notes:
        print(f"  note: {note}")
    for warning in plan.warnings:
        print(f"  warning: {warning}")
    if fla_folder:
        print(f"FLA: fla {fla_version(fla_folder)} at {fla_folder}")
    else:
        print(f"FLA: skipped: {fla_reason}")
    print(f"cases ({len(cases)}):")
    for name, kind, shape_name, tokens, in_bench in cases:
        peers = []
        if kind == "gdn_prefill":
            peers += ["vllm"] if not plan.gdn_error else []
            peers += ["fla"] if fla_folder else []
        elif not plan.mamba2_error:
            peers.append("vllm")
        mine = (ours or {}).get(name, {}).get("median_us")
        print(f"  {name:<28} {kind:<15} {str(case_shape(kind, shape_name)):<22} {tokens:>6} tokens  peers: "
              f"{', '.join(peers) or 'none'}  ours: " + (f"{mine:.1f} us" if isinstance(mine, (int, float))
                                                       else ("-" if ours else "(no --ours)"))
              + ("" if in_bench else "  (not in the benchmark)"))
    checks = [f"float64 recurrence on {args.ref_tokens} tokens"]
    checks.append(f"ours via {args.hybridtb} (gen + run --backend {OURS_BACKEND})" if args.hybridtb else
                  "ours: skipped (no --hybridtb)")
    print(f"checks: {'; '.join(checks)}; timing: {args.warmup} warm-up + {args.samples} samples, CUDA events, "
          "256 MiB L2 flush before each")


# --- running (GPU) -------------------------------------------------------------------------------------------

def run_case(torch, case, peers, ours, args, workdir, flush):
    """Times every peer on the case and checks it; returns the case's entries."""
    from peer_common import kernel_breakdown, sample_us

    name, kind, shape_name, tokens, in_bench = case
    shape = case_shape(kind, shape_name)
    dev = DEVICE
    entries = []
    mine = (ours or {}).get(name)
    # The benchmark's row of the same case with 16-bit product operands (ssm_prefill_operands model).
    mine_16bit = (ours or {}).get(f"{name} bf16 operands")
    ours_check = None
    if args.hybridtb and args.check_tokens != 0:
        check_tokens = min(tokens, args.check_tokens) if args.check_tokens else tokens
        try:
            batch, out = hybridtb_layer(args.hybridtb, workdir, "gdn" if kind == "gdn_prefill" else "mamba2", shape,
                                        check_tokens, OURS_BACKEND, name.replace(" ", "_"))
            layer = LayerFile(batch, out)
            ours_check = (file_peer_inputs(torch, layer, dev), torch.from_numpy(layer.output).to(dev), check_tokens)
            os.remove(batch)
            os.remove(out)
        except Exception as e:
            ours_check = f"{type(e).__name__}: {e}"[:300]
    timing_inputs = (bench_gdn_inputs if kind == "gdn_prefill" else bench_mamba2_inputs)(torch, shape, tokens, dev)
    xp = Xp(torch)
    for peer in peers:
        entry = {"name": name, "kind": kind, "shape": dict(zip(("Hk", "Hv", "dk", "dv") if kind == "gdn_prefill"
                                                               else ("Hs", "P", "N", "G"), shape)),
                 "tokens": tokens, "in_bench": in_bench, "peer": peer.name, "impl": peer.impl, "checks": []}
        # Wall seconds per phase: the timing includes the warm-ups, where the first call compiles and
        # autotunes the peer's Triton kernels for the case's shapes.
        wall = entry["wall_s"] = {}
        started = time.monotonic()
        try:
            fn = peer.prepare(timing_inputs)
            med, lo, hi = sample_us(fn, args.samples, args.warmup, flush.sum)
            entry.update(median_us=med, min_us=lo, max_us=hi, samples=args.samples)
            wall["timing"] = round(time.monotonic() - started, 1)
            if args.kernels:
                entry["kernels"] = kernel_breakdown(fn, args.kernels, flush.sum)
                for k in entry["kernels"][:8]:
                    print(f"    {k['us']:9.1f} us  x{k['launches']:g}  {k['name'][:100]}")
                wall["kernels"] = round(time.monotonic() - started - wall["timing"], 1)
            checks_started = time.monotonic()
            result = fn()
            entry["finite"] = bool(torch.isfinite(result).all())
            del fn, result
            # The float64 check on random small inputs.
            inputs, want = random_inputs(torch, "gdn" if kind == "gdn_prefill" else "mamba2", shape, args.ref_tokens,
                                         dev, seed=0)
            got = peer.prepare(inputs)()
            entry["checks"].append(check_entry("float64 recurrence", args.ref_tokens, errors(xp, got, want)))
            if isinstance(ours_check, tuple):
                inputs, want, check_tokens = ours_check
                got = peer.prepare(inputs)()
                entry["checks"].append(check_entry(f"hybridtb {OURS_BACKEND}", check_tokens, errors(xp, got, want)))
            elif isinstance(ours_check, str):
                entry["checks"].append({"against": f"hybridtb {OURS_BACKEND}", "error": ours_check, "ok": False})
            elif not args.hybridtb:
                entry["ours_check_skipped"] = "no --hybridtb"
            wall["checks"] = round(time.monotonic() - checks_started, 1)
        except Exception as e:  # out of memory, a kernel's assertion: record, go on
            entry["error"] = f"{type(e).__name__}: {e}"[:400]
        if mine is not None and "median_us" in mine:
            entry["ours_us"] = mine["median_us"]
            if "prefill_us" in mine:
                entry["ours_prefill_us"] = mine["prefill_us"]
            if "median_us" in entry:
                entry["ratio"] = entry["median_us"] / mine["median_us"]
        if mine_16bit is not None and "median_us" in mine_16bit:
            entry["ours_bf16_operands_us"] = mine_16bit["median_us"]
            if "median_us" in entry:
                entry["ratio_bf16_operands"] = entry["median_us"] / mine_16bit["median_us"]
        rels = [c.get("max_rel") for c in entry["checks"] if "error" not in c]
        entry["max_error"] = None if not rels or None in rels else max(rels)
        if "error" in entry or any("error" in c for c in entry["checks"]):
            entry["verdict"] = "error"
        elif not entry.get("finite", True) or any(not c["ok"] for c in entry["checks"]):
            entry["verdict"] = "mismatch"
        else:
            entry["verdict"] = "ok" if entry["checks"] else "unchecked"
        entries.append(entry)
        print(summary_line(entry), flush=True)
        if wall:
            print("    wall s: " + ", ".join(f"{k} {v:.1f}" for k, v in wall.items()), flush=True)
        torch.cuda.empty_cache()
    return entries


def _finite_or_none(x):
    return x if math.isfinite(x) else None  # JSON has no NaN: a non-finite error is null (and not ok)


def check_entry(against, tokens, errs):
    max_rel, rel_rms, max_abs = errs
    return {"against": against, "tokens": tokens, "max_abs": _finite_or_none(max_abs),
            "max_rel": _finite_or_none(max_rel), "rel_rms": _finite_or_none(rel_rms),
            "ok": max_rel <= TOLERANCE["max_rel"] and rel_rms <= TOLERANCE["rel_rms"]}


def summary_line(entry):
    head = f"{entry['name']:<28} {entry['peer']:<5}"
    if "error" in entry:
        return f"{head} error: {' '.join(entry['error'].split())[:160]}"
    text = f"{head} {entry['median_us']:>10.1f} us"
    text += f"  ours {entry['ours_us']:>9.1f} us  ratio {entry['ratio']:5.2f}" if "ratio" in entry else \
        f"  ours {'-':>9}     ratio {'-':>5}"
    if "ratio_bf16_operands" in entry:
        text += f"  (bf16 operands {entry['ours_bf16_operands_us']:.1f} us, ratio {entry['ratio_bf16_operands']:.2f})"
    checks = ", ".join(("failed" if "error" in c else "nan" if c["max_rel"] is None else f"{c['max_rel']:.1e}")
                       + f" ({'ours' if c['against'].startswith('hybridtb') else 'f64'})" for c in entry["checks"])
    return f"{text}  err {checks or '-'}  {entry['verdict']}"


def run(args, plan, fla_folder, fla_reason, cases, ours, ours_gpu):
    import torch

    from peer_common import environment

    if not torch.cuda.is_available():
        print("vllm_linear_peer: no CUDA device", file=sys.stderr)
        return 2
    kernels = VllmLinear(plan)
    fla = None
    fla_info = {"skipped": fla_reason} if fla_reason else None
    if fla_folder:
        try:
            fn, how = import_fla(fla_folder)
            version = getattr(sys.modules.get("fla"), "__version__", None) or fla_version(fla_folder)
            fla = FlaGdnPeer(torch, fn, version, how)
            fla_info = {"version": version, "path": fla_folder, "import": how, "impl": fla.impl}
        except Exception as e:
            fla_info = {"skipped": f"import failed: {type(e).__name__}: {e}"[:400]}
            print(f"FLA: skipped: {fla_info['skipped']}")
    elif fla_reason:
        print(f"FLA: skipped: {fla_reason}")
    gdn_peers = ([VllmGdnPeer(kernels)] if kernels.gdn else []) + ([fla] if fla else [])
    mamba2_peers = [VllmMamba2Peer(kernels, args.mamba_chunk)] if kernels.mamba2 else []
    report = {"peer": "vllm_linear", "schema_version": 1,
              "environment": dict(environment(), triton=__import__("triton").__version__),
              "vllm": {"version": plan.version, "root": plan.root, "files": kernels.files(),
                       "gdn_prep": plan.gdn_prep, "mamba_chunk": args.mamba_chunk,
                       "stand_ins": sorted(plan.closure.stand_ins),
                       "unavailable": {k: v for k, v in (("gdn", plan.gdn_error or kernels.errors.get("gdn")),
                                                         ("mamba2", plan.mamba2_error or kernels.errors.get("mamba2")))
                                       if v}},
              "fla": fla_info,
              "ours": {"file": args.ours, "gpu": ours_gpu} if args.ours else None,
              "timing": f"{args.warmup} warm-up calls, then CUDA events around each call, a 256 MiB L2-flush read "
                        f"before each (outside the events), median of {args.samples}",
              "tolerance": TOLERANCE, "cases": []}
    for kind, error in (("gdn", kernels.errors.get("gdn")), ("mamba2", kernels.errors.get("mamba2"))):
        if error:
            print(f"vLLM {kind}: import failed: {error}")
    flush = torch.zeros(64 << 20, dtype=torch.float32, device=DEVICE)  # 256 MiB
    status = 0
    with tempfile.TemporaryDirectory(prefix="vllm-linear-peer-") as scratch, torch.no_grad():
        workdir = args.workdir or scratch
        os.makedirs(workdir, exist_ok=True)
        for case in cases:
            gdn = case[1] == "gdn_prefill"
            missing = (plan.gdn_error or kernels.errors.get("gdn")) if gdn else \
                (plan.mamba2_error or kernels.errors.get("mamba2"))
            if missing:  # the case still runs its other peers (FLA)
                entry = {"name": case[0], "kind": case[1], "peer": "vllm", "verdict": "error",
                         "error": f"vLLM's kernel is unavailable: {missing}"[:400]}
                report["cases"].append(entry)
                print(summary_line(entry), flush=True)
                status = 1
            peers = gdn_peers if gdn else mamba2_peers
            if peers:
                entries = run_case(torch, case, peers, ours, args, workdir, flush)
                report["cases"] += entries
                if any(e["verdict"] in ("error", "mismatch") for e in entries):
                    status = 1
            write_report(report, args.json, complete=False)  # a run stopped later keeps these cases
    write_report(report, args.json, complete=True)
    print(f"wrote {args.json}")
    return status


def write_report(report, path, complete):
    """Writes the report to path atomically (a .tmp beside it, then a rename), with "complete": whether
    every case has run; run() writes it after each case, so a run stopped by a time limit leaves the
    cases it finished."""
    report["complete"] = complete
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2)
    os.replace(tmp, path)


# --- the CPU self-test of the float64 re-implementation ------------------------------------------------

def self_test_reference(args):
    """gen + `run --backend reference` on small GDN and Mamba-2 files; the float64 re-implementation on the
    files' inputs (numpy) must give the reference's output (both are float64 from the same bf16 inputs)."""
    try:
        import h5py  # noqa: F401
        import numpy as np
    except ImportError as e:
        print(f"self-test-reference: needs numpy and h5py ({e}); skipped")
        return 77
    if not args.hybridtb:
        raise UsageError("--self-test-reference needs --hybridtb (the built hybridtb CLI)")
    xp = Xp(np)
    passed = failed = 0
    with tempfile.TemporaryDirectory(prefix="vllm-linear-ref-") as scratch:
        workdir = args.workdir or scratch
        os.makedirs(workdir, exist_ok=True)
        for kind, shape, tokens in (("gdn", (2, 4, 32, 64), 150), ("gdn", (1, 3, 64, 32), 70),
                                    ("mamba2", (4, 32, 16, 2), 150), ("mamba2", (3, 16, 8, 1), 90)):
            label = f"{kind} {'x'.join(map(str, shape))} x {tokens} tokens"
            batch, out = hybridtb_layer(args.hybridtb, workdir, kind, shape, tokens, "reference",
                                        f"{kind}_{'x'.join(map(str, shape))}")
            layer = LayerFile(batch, out)
            key = "mixed_qkv" if kind == "gdn" else "xBC"
            if layer.shape() != shape or layer.inputs[key].shape[0] != tokens:
                print(f"FAIL {label}: the file has shape {layer.shape()}, {layer.inputs[key].shape[0]} tokens")
                failed += 1
                continue
            max_rel, rel_rms, _ = errors(xp, file_reference(xp, layer, lambda a: a), layer.output)
            ok = max_rel < 1e-9 and rel_rms < 1e-9
            passed, failed = passed + ok, failed + (not ok)
            print(f"{'ok  ' if ok else 'FAIL'} {label}: max |diff| / max |ref| {max_rel:.2e}, relative RMS "
                  f"{rel_rms:.2e} (max |ref| {float(abs(layer.output).max()):.3g})")
            # One changed input row must move the output: the comparison is not vacuous.
            layer.inputs[key] = layer.inputs[key].copy()
            layer.inputs[key][tokens // 2] += 0.5
            moved = errors(xp, file_reference(xp, layer, lambda a: a), layer.output)[0]
            ok = moved > 1e-3
            passed, failed = passed + ok, failed + (not ok)
            print(f"{'ok  ' if ok else 'FAIL'} {label}, one input row changed: the output moves by {moved:.1e} "
                  "of its largest value")
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


# --- copying the needed files out of a vLLM wheel --------------------------------------------------------

def extract_wheel(wheel, dest):
    """Copies from the wheel the Python files the two vLLM peers import (and the ones they read with ast),
    keeping the layout under dest/vllm/. Returns the list of files."""
    if not zipfile.is_zipfile(wheel):
        raise UsageError(f"--extract-wheel {wheel}: not a wheel (zip) file")
    with tempfile.TemporaryDirectory(prefix="vllm-wheel-") as tmp, zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        members = [m for m in names if m.startswith("vllm/") and m.endswith(".py")]
        if not members:
            raise UsageError(f"--extract-wheel {wheel}: holds no vllm/*.py")
        zf.extractall(tmp, members)
        plan = resolve_release(tmp)
        # The kernel folders whole (their data files too, e.g. the SSM launch configs), then every
        # other module the kernels import.
        folders = [f"{d}/" for d in GDN_OPS_DIRS + (os.path.dirname(SSD_COMBINED),)]
        kernel_files = [m for m in names if m.startswith(tuple(folders)) and not m.endswith("/")]
        zf.extractall(tmp, [m for m in kernel_files if not m.endswith(".py")])
        wanted = set(plan.files()) | set(kernel_files)
        wanted.add("vllm/_version.py")
        if plan.gdn_prep_file:
            wanted.add(plan.gdn_prep_file)
        for name, spec in LINEAR_STAND_INS.items():  # constants read from the release's own file
            path, _ = _module_file(tmp, name)
            if spec == "constants" and path:
                wanted.add(os.path.relpath(path, tmp))
        # vllm_kernels.load's attention kernels, their helpers, and the files it and
        # vllm_attention_peer.py read with ast (KVQuantMode, the Triton builder's constants).
        for base in ("vllm.v1.attention.ops", "vllm.attention.ops"):
            entries = [f"{base}.{m}" for m in ("triton_unified_attention", "triton_reshape_and_cache_flash")
                       if _module_file(tmp, f"{base}.{m}")[0]]
            if entries:
                attention = resolve_closure(tmp, entries, ATTENTION_STAND_INS)
                wanted.update(attention.modules.values())
                wanted.update(attention.lazy.values())
                break
        for rel in ("vllm/v1/kv_cache_interface.py", "vllm/v1/attention/backends/triton_attn.py"):
            if os.path.isfile(os.path.join(tmp, rel)):
                wanted.add(rel)
        os.makedirs(dest, exist_ok=True)
        for rel in sorted(wanted):
            os.makedirs(os.path.join(dest, os.path.dirname(rel)), exist_ok=True)
            shutil.copyfile(os.path.join(tmp, rel), os.path.join(dest, rel))
        return sorted(wanted), plan


# --- main ---------------------------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--vllm", help="an unpacked vLLM release (the folder holding vllm/, Python sources only)")
    parser.add_argument("--fla", help="an unpacked fla-core wheel (the folder holding fla/); default: the installed fla")
    parser.add_argument("--no-fla", action="store_true", help="do not run the FLA peer")
    parser.add_argument("--ours", help="hybridtb_bench_linear's JSON of the same GPU (for the ratios)")
    parser.add_argument("--json", "--out", dest="json", help="write the results here (atomically)")
    parser.add_argument("--hybridtb", help="the built hybridtb CLI: check each peer against our cuda backend")
    parser.add_argument("--check-tokens", type=int, default=None,
                        help="tokens of the check against ours (default: the case's; 0: no check against ours)")
    parser.add_argument("--ref-tokens", type=int, default=229,
                        help="tokens of the float64 check (default 229: three chunks of 64 and a partial one)")
    parser.add_argument("--workdir", help="where the check's batch files go (default: a temporary folder)")
    parser.add_argument("--cases", help="run only the cases whose name matches this regex")
    parser.add_argument("--samples", type=int, default=20, help="timed calls per peer and case (20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (3; the first one autotunes)")
    parser.add_argument("--quick", action="store_true", help="5 samples, 2 warm-ups")
    parser.add_argument("--kernels", type=int, default=0, metavar="CALLS",
                        help="also record each peer's per-kernel GPU times (torch.profiler, mean over CALLS "
                             "calls after the timing) as the entry's \"kernels\" list (default 0: off)")
    parser.add_argument("--mamba-chunk", type=int, default=DEFAULT_MAMBA_CHUNK,
                        help=f"vLLM's SSD chunk size (default {DEFAULT_MAMBA_CHUNK}: Falcon-H1's mamba_chunk_size)")
    parser.add_argument("--dry-run", action="store_true", help="read the release with ast, print the plan; no torch")
    parser.add_argument("--extract-wheel", metavar="WHEEL",
                        help="copy the Python files the vLLM peers need from WHEEL into --vllm DEST, then exit")
    parser.add_argument("--self-test-reference", action="store_true",
                        help="CPU: the float64 re-implementation against `hybridtb run --backend reference` "
                             "(needs numpy, h5py and --hybridtb)")
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if args.quick:
        args.samples, args.warmup = 5, 2
    try:
        for option, value, low in (("--samples", args.samples, 1), ("--warmup", args.warmup, 0),
                                   ("--ref-tokens", args.ref_tokens, 1), ("--check-tokens", args.check_tokens, 0),
                                   ("--kernels", args.kernels, 0)):
            if value is not None and value < low:
                raise UsageError(f"{option} {value}: must be at least {low}")
        if args.mamba_chunk < 1 or args.mamba_chunk & (args.mamba_chunk - 1):
            raise UsageError(f"--mamba-chunk {args.mamba_chunk}: must be a power of two (vLLM's SSD asserts it)")
        if args.hybridtb and not (os.path.isfile(args.hybridtb) and os.access(args.hybridtb, os.X_OK)):
            raise UsageError(f"--hybridtb {args.hybridtb}: not an executable file")
        if args.self_test_reference:
            return self_test_reference(args)
        if not args.vllm:
            raise UsageError("--vllm DIR is required (an unpacked vLLM release: the folder holding vllm/)")
        if args.extract_wheel:
            if not os.path.isfile(args.extract_wheel):
                raise UsageError(f"--extract-wheel {args.extract_wheel}: no such file")
            files, plan = extract_wheel(args.extract_wheel, args.vllm)
            size = sum(os.path.getsize(os.path.join(args.vllm, f)) for f in files)
            print(f"extracted {len(files)} files ({size / 1024:.0f} KiB) of vllm {plan.version} into {args.vllm}")
            for kind in ("gdn", "mamba2"):
                if getattr(plan, f"{kind}_error"):
                    print(f"  warning: {kind}: {getattr(plan, kind + '_error')}")
            return 0
        if not os.path.isdir(args.vllm):
            raise UsageError(f"--vllm {args.vllm}: no such folder")
        plan = resolve_release(args.vllm)
        if args.no_fla:
            fla_folder, fla_reason = None, "--no-fla"
        else:
            fla_folder, fla_reason = locate_fla(args.fla)
        ours, ours_gpu = read_ours(args.ours) if args.ours else (None, None)
        cases = select_cases(ours, args.cases)
        kinds = {c[1] for c in cases}
        blocking = [f"{kind}: {getattr(plan, kind + '_error')}" for kind in ("gdn", "mamba2")
                    if f"{kind}_prefill" in kinds and getattr(plan, f"{kind}_error")]
        if args.dry_run:
            describe_plan(plan, fla_folder, fla_reason, cases, ours, args)
            if blocking:
                raise UsageError(f"--vllm {args.vllm}: the selected cases cannot run: " + "; ".join(blocking))
            print("dry run: nothing timed")
            return 0
        if not args.json:
            raise UsageError("--json FILE is required (where the results go)")
        describe_plan(plan, fla_folder, fla_reason, cases, ours, args)
        return run(args, plan, fla_folder, fla_reason, cases, ours, ours_gpu)
    except UsageError as e:
        print(f"vllm_linear_peer: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
