"""vLLM's own Triton attention kernels, imported from an unpacked vLLM release (Python sources only).

    from vllm_kernels import load
    kernels = load("/path/to/vllm-0.33.0")   # the folder that holds vllm/ (or vllm/ itself)
    kernels.write_kv(...); kernels.attention(...)

Nothing of vLLM is copied into this repository: `load` imports the release's own
`triton_unified_attention.py` and `triton_reshape_and_cache_flash.py` (vllm/attention/ops/ in
0.11-0.12, vllm/v1/attention/ops/ in newer releases, with their helper modules) from the given
folder. Those files import a few pieces of the vLLM runtime that need a full installation
(platform detection, logging, environment flags, the KV-cache spec module); `load` puts small
stand-ins for exactly those into sys.modules first:

- vllm.platforms.current_platform: CUDA, fp8 = float8_e4m3fn (vLLM's CUDA platform), capability from
  torch;
- vllm.logger.init_logger: a logging.Logger with vLLM's *_once methods;
- vllm.triton_utils: the installed triton and triton.language;
- vllm.envs: VLLM_BATCH_INVARIANT = False (the default), other flags their documented defaults;
- vllm.v1.kv_cache_interface (newer releases): `KVQuantMode` is vLLM's own class, executed from the
  release's source file (only that class definition, so the module's heavy imports are not needed),
  plus `is_quantized_kv_cache` for the dtype strings the testbed knows;
- vllm.model_executor.layers.quantization.utils.quant_utils (newer releases): FP8_DTYPE and
  get_fp8_min_max, the finfo of float8_e4m3fn as on CUDA.

Packages between vllm/ and the kernel files are registered as empty packages whose path is the
release's folder, so their heavy __init__.py files are not run.

`load` adapts to each release's signatures: the per-token-head quantised write and the split-K
(3D) scratch buffers exist only in newer releases (`kernels.has_per_token_head`,
`kernels.takes_3d_buffers`).

Requires torch and triton (the GPU machine has both); importing this module needs neither.
"""
import ast
import enum
import importlib
import logging
import os
import sys
import types

_STUB_NAMES = (
    "vllm", "vllm.platforms", "vllm.logger", "vllm.triton_utils", "vllm.envs", "vllm.v1", "vllm.v1.attention",
    "vllm.v1.attention.ops", "vllm.v1.kv_cache_interface", "vllm.attention", "vllm.attention.ops",
    "vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.quantization",
    "vllm.model_executor.layers.quantization.utils", "vllm.model_executor.layers.quantization.utils.quant_utils",
)


def _package_root(path):
    """The folder holding vllm/ (accepts that folder or vllm/ itself)."""
    path = os.path.abspath(path)
    if os.path.basename(path) == "vllm" and os.path.isfile(os.path.join(path, "__init__.py")):
        path = os.path.dirname(path)
    if not os.path.isdir(os.path.join(path, "vllm")):
        raise FileNotFoundError(f"{path}: no vllm/ package folder")
    return path


def _version(root):
    """The release's version string from vllm/_version.py (written by its build)."""
    text = open(os.path.join(root, "vllm", "_version.py")).read() if os.path.isfile(
        os.path.join(root, "vllm", "_version.py")) else ""
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in ("__version__", "version")
                                                 for t in node.targets):
            if isinstance(node.value, ast.Constant):
                return str(node.value.value)
    return os.path.basename(root)  # an unpacked release folder is named by its version


def _package(name, folder):
    module = types.ModuleType(name)
    module.__path__ = [folder]
    module.__package__ = name
    sys.modules[name] = module
    return module


class _Platform:
    """The part of vLLM's CudaPlatform the kernel files call."""

    def __init__(self, torch):
        self._torch = torch

    def fp8_dtype(self):
        return self._torch.float8_e4m3fn

    def is_fp8_fnuz(self):
        return False

    def is_rocm(self):
        return False

    def is_xpu(self):
        return False

    def is_cuda(self):
        return True

    def get_device_capability(self, device_id=0):
        major, minor = self._torch.cuda.get_device_capability(device_id)
        return types.SimpleNamespace(major=major, minor=minor, to_int=lambda: major * 10 + minor)

    def has_device_capability(self, capability, device_id=0):
        major, minor = self._torch.cuda.get_device_capability(device_id)
        return major * 10 + minor >= (capability if isinstance(capability, int) else capability[0] * 10 + capability[1])

    def is_device_capability_family(self, capability, device_id=0):
        major, _ = self._torch.cuda.get_device_capability(device_id)
        return major * 10 == capability


def _logger_factory(name):
    logger = logging.getLogger(name)
    seen = set()

    def once(level):
        def log(message, *args, **kwargs):
            kwargs.pop("scope", None)
            if message not in seen:
                seen.add(message)
                logger.log(level, message, *args, **kwargs)
        return log

    logger.debug_once = once(logging.DEBUG)
    logger.info_once = once(logging.INFO)
    logger.warning_once = once(logging.WARNING)
    return logger


def _kv_quant_mode_class(root):
    """vLLM's KVQuantMode, executed from the release's kv_cache_interface.py (that class only)."""
    path = os.path.join(root, "vllm", "v1", "kv_cache_interface.py")
    tree = ast.parse(open(path).read(), path)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "KVQuantMode":
            namespace = {"IntEnum": enum.IntEnum, "Enum": enum.Enum}
            exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
            return namespace["KVQuantMode"]
    return None


# The testbed's kv_cache_dtype strings (datasets/SCHEMA.md §5.2) and the vLLM string for each.
VLLM_KV_CACHE_DTYPE = {"auto": "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
                       "int8_per_token_head": "int8_per_token_head", "fp8_per_token_head": "fp8_per_token_head"}


class Kernels:
    """vLLM's KV-cache write and unified attention from one release, called as vLLM's Triton backend
    (TritonAttentionImpl.do_kv_cache_update / forward) calls them."""

    def __init__(self, root, version, attention_module, cache_module, kv_quant_mode):
        import torch

        self._torch = torch
        self.root = root
        self.version = version
        self.attention_module = attention_module
        self.cache_module = cache_module
        self.KVQuantMode = kv_quant_mode
        self.has_per_token_head = hasattr(cache_module, "triton_reshape_and_cache_flash_per_token_head_quant")
        import inspect

        params = inspect.signature(attention_module.unified_attention).parameters
        self.takes_3d_buffers = "seq_threshold_3D" in params
        self.takes_alibi_sqrt = "use_alibi_sqrt" in params
        self.takes_kv_quant_mode = "kv_quant_mode" in params
        self.takes_mm_prefix = "mm_prefix_range" in params
        self.source_files = [os.path.relpath(m.__file__, root) for m in (attention_module, cache_module)]

    def describe(self):
        return f"vllm {self.version} triton_unified_attention"

    def quant_mode(self, kv_cache_dtype):
        if self.KVQuantMode is None:
            return None
        return {"auto": self.KVQuantMode.NONE, "fp8_e4m3": self.KVQuantMode.FP8_PER_TENSOR,
                "fp8_e5m2": self.KVQuantMode.FP8_PER_TENSOR,
                "int8_per_token_head": self.KVQuantMode.INT8_PER_TOKEN_HEAD,
                "fp8_per_token_head": self.KVQuantMode.FP8_PER_TOKEN_HEAD}[kv_cache_dtype]

    def write_kv(self, key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                 k_scale_cache=None, v_scale_cache=None):
        """do_kv_cache_update: key/value [T, Hkv, D]; key_cache/value_cache [NB, BS, Hkv, D] views;
        k_scale/v_scale float32 [1] tensors (per-tensor fp8), scale caches [NB, BS, Hkv] float32."""
        if kv_cache_dtype in ("int8_per_token_head", "fp8_per_token_head"):
            if not self.has_per_token_head:
                raise NotImplementedError(f"vllm {self.version} has no per-token-head quantised KV cache")
            self.cache_module.triton_reshape_and_cache_flash_per_token_head_quant(
                key, value, key_cache, value_cache, k_scale_cache, v_scale_cache, slot_mapping,
                kv_quant_mode=self.quant_mode(kv_cache_dtype))
            return
        self.cache_module.triton_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
                                                         VLLM_KV_CACHE_DTYPE[kv_cache_dtype], k_scale, v_scale)

    def attention(self, q, key_cache, value_cache, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k,
                  softmax_scale, window, block_table, softcap, k_scale, v_scale, kv_cache_dtype,
                  alibi_slopes=None, use_alibi_sqrt=False, sinks=None, mm_prefix_range=None,
                  k_scale_cache=None, v_scale_cache=None, seq_threshold_3d=None, num_par_softmax_segments=None):
        """TritonAttentionImpl.forward's call: window 0 = none (window_size (-1, -1)), else
        (window - 1, 0); per-tensor descales expanded to [num_seqs, Hkv]; on releases with split-K
        scratch buffers, seq_threshold_3d and num_par_softmax_segments as the builder chose them and
        scratch sized as the builder sizes it (one row per query token)."""
        torch = self._torch
        num_seqs = seqused_k.shape[0]
        hkv = key_cache.shape[2]
        window_size = (window - 1, 0) if window > 0 else (-1, -1)
        per_token_head = kv_cache_dtype in ("int8_per_token_head", "fp8_per_token_head")
        kwargs = {}
        if per_token_head:
            k_descale = v_descale = None
            kwargs.update(kv_quant_mode=self.quant_mode(kv_cache_dtype), k_scale_cache=k_scale_cache,
                          v_scale_cache=v_scale_cache)
        else:
            if kv_cache_dtype in ("fp8_e4m3", "fp8_e5m2") and key_cache.dtype != torch.float8_e4m3fn:
                # TritonAttentionImpl.forward views any fp8 cache as current_platform.fp8_dtype()
                # (float8_e4m3fn on CUDA), as its KV write does: an fp8_e5m2 cache is read as e4m3.
                key_cache = key_cache.view(torch.float8_e4m3fn)
                value_cache = value_cache.view(torch.float8_e4m3fn)
            k_descale = k_scale.expand((num_seqs, hkv))
            v_descale = v_scale.expand((num_seqs, hkv))
            if self.takes_kv_quant_mode:
                kwargs["kv_quant_mode"] = self.quant_mode(kv_cache_dtype)
        if alibi_slopes is not None:
            kwargs["alibi_slopes"] = alibi_slopes
            if use_alibi_sqrt:
                if not self.takes_alibi_sqrt:
                    raise NotImplementedError(f"vllm {self.version} has no sqrt ALiBi")
                kwargs["use_alibi_sqrt"] = True
        if sinks is not None:
            kwargs["sinks"] = sinks
        if mm_prefix_range is not None:
            if not self.takes_mm_prefix:
                raise NotImplementedError(f"vllm {self.version} has no mm_prefix_range")
            kwargs["mm_prefix_range"] = mm_prefix_range
        if self.takes_3d_buffers and seq_threshold_3d is not None and num_par_softmax_segments:
            tokens, hq, d = q.shape
            padded = 1 << (d - 1).bit_length()
            kwargs.update(
                seq_threshold_3D=seq_threshold_3d, num_par_softmax_segments=num_par_softmax_segments,
                softmax_segm_output=torch.empty((tokens, hq, num_par_softmax_segments, padded),
                                                dtype=torch.float32, device=q.device),
                softmax_segm_max=torch.empty((tokens, hq, num_par_softmax_segments), dtype=torch.float32,
                                             device=q.device),
                softmax_segm_expsum=torch.empty((tokens, hq, num_par_softmax_segments), dtype=torch.float32,
                                                device=q.device))
        self.attention_module.unified_attention(
            q=q, k=key_cache, v=value_cache, out=out, cu_seqlens_q=cu_seqlens_q, max_seqlen_q=max_seqlen_q,
            seqused_k=seqused_k, max_seqlen_k=max_seqlen_k, softmax_scale=softmax_scale, causal=True,
            window_size=window_size, block_table=block_table, softcap=softcap, q_descale=None,
            k_descale=k_descale, v_descale=v_descale, **kwargs)


def load(path):
    """Imports vLLM's Triton attention kernels from the unpacked release at `path` (see the module doc).
    One release per process: the stand-ins and the imported modules live in sys.modules."""
    import torch
    import triton
    import triton.language as tl

    root = _package_root(path)
    if "vllm" in sys.modules and getattr(sys.modules["vllm"], "__path__", [None])[0] != os.path.join(root, "vllm"):
        raise RuntimeError("vllm_kernels.load: another vLLM release is already loaded in this process")
    for name in _STUB_NAMES:
        sys.modules.pop(name, None)
    base = os.path.join(root, "vllm")
    _package("vllm", base)
    for sub in ("v1", "v1/attention", "v1/attention/ops", "attention", "attention/ops", "model_executor",
                "model_executor/layers", "model_executor/layers/quantization",
                "model_executor/layers/quantization/utils"):
        _package("vllm." + sub.replace("/", "."), os.path.join(base, sub))

    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = _Platform(torch)
    sys.modules["vllm.platforms"] = platforms
    logger = types.ModuleType("vllm.logger")
    logger.init_logger = _logger_factory
    sys.modules["vllm.logger"] = logger
    triton_utils = types.ModuleType("vllm.triton_utils")
    triton_utils.triton = triton
    triton_utils.tl = tl
    triton_utils.HAS_TRITON = True
    sys.modules["vllm.triton_utils"] = triton_utils
    envs = types.ModuleType("vllm.envs")
    envs.VLLM_BATCH_INVARIANT = False
    envs.VLLM_TRITON_USE_TD = False
    sys.modules["vllm.envs"] = envs

    kv_quant_mode = None
    if os.path.isfile(os.path.join(base, "v1", "kv_cache_interface.py")):
        kv_quant_mode = _kv_quant_mode_class(root)
        interface = types.ModuleType("vllm.v1.kv_cache_interface")
        interface.KVQuantMode = kv_quant_mode
        quantised = {"fp8", "fp8_e4m3", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head"}
        interface.is_quantized_kv_cache = lambda kv_cache_dtype: kv_cache_dtype in quantised
        sys.modules["vllm.v1.kv_cache_interface"] = interface
    quant_utils = types.ModuleType("vllm.model_executor.layers.quantization.utils.quant_utils")
    quant_utils.FP8_DTYPE = torch.float8_e4m3fn
    finfo = torch.finfo(torch.float8_e4m3fn)
    quant_utils.get_fp8_min_max = lambda: (finfo.min, finfo.max)
    sys.modules[quant_utils.__name__] = quant_utils

    candidates = [("vllm.v1.attention.ops.triton_unified_attention", "vllm.v1.attention.ops.triton_reshape_and_cache_flash"),
                  ("vllm.attention.ops.triton_unified_attention", "vllm.attention.ops.triton_reshape_and_cache_flash")]
    for attention_name, cache_name in candidates:
        if os.path.isfile(os.path.join(root, *attention_name.split(".")) + ".py"):
            attention_module = importlib.import_module(attention_name)
            cache_module = importlib.import_module(cache_name)
            return Kernels(root, _version(root), attention_module, cache_module, kv_quant_mode)
    raise FileNotFoundError(f"{root}: no triton_unified_attention.py under vllm/attention/ops or vllm/v1/attention/ops")
