"""Capture what a vLLM-style `HybridAttentionImpl.forward` sees into hybrid-batch 1.x files.

h5py + numpy only; torch is optional (tensors are converted duck-typed: `.detach().cpu()`, bf16
through `.view(torch.int16)`, fp8 through `.view(torch.uint8)`). See README.md in this directory
for the hook into a vLLM process and the schema in ../SCHEMA.md.

    cap = Capturer.from_env()                   # None-safe: cap.enabled is False without HYBRIDTB_CAPTURE_DIR
    if cap.should_capture(layer_name):          # layer filter, every-Nth-step, file/byte budgets
        pending = cap.begin(layer_name, config=..., batch=..., inputs=..., ssm=...)   # copies inputs now
        out = forward(...)
        cap.finish(pending, expected={"output": out, "kv_cache": kv_cache, ...})      # atomic write

Environment:
  HYBRIDTB_CAPTURE_DIR            output directory (required to enable capture)
  HYBRIDTB_CAPTURE_LAYERS         comma list of fnmatch patterns on the layer name (default: all)
  HYBRIDTB_CAPTURE_MAX_FILES      stop after this many files (default 16)
  HYBRIDTB_CAPTURE_MAX_BYTES      stop once the files written total this many bytes (default 1 GiB)
  HYBRIDTB_CAPTURE_EVERY_N_STEPS  capture a layer's steps 0, N, 2N, ... (default 1: every step)
"""
import fnmatch
import os
import sys

import h5py
import numpy as np

_SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "harness", "scripts")
if _SCRIPTS not in sys.path:
    sys.path.insert(0, _SCRIPTS)
import write_batch_h5py as _w  # noqa: E402  (write_hybrid_batch, write_tensor: the schema's storage rules)

SCHEMA_VERSION = "1.1"
_TORCH_NAMES = {"torch.bfloat16": "bfloat16", "torch.float16": "float16", "torch.float32": "float32",
                "torch.float64": "float64", "torch.float8_e4m3fn": "float8_e4m3fn",
                "torch.float8_e5m2": "float8_e5m2", "torch.int8": "int8", "torch.int32": "int32",
                "torch.int64": "int64", "torch.uint8": "uint8", "torch.bool": "bool"}


def to_numpy(t, dtype_name=None):
    """(array, dtype_name) from a numpy array, a (array, dtype_name) pair or a torch tensor.

    torch bf16 -> uint16 bit patterns ("bfloat16"); torch fp8 -> uint8 raw bytes ("float8_*").
    numpy has no bf16/fp8: pass (bits_or_values, "bfloat16") or (uint8 bytes, "float8_e4m3fn")."""
    if isinstance(t, tuple):
        return to_numpy(t[0], t[1])
    if hasattr(t, "detach"):  # a torch tensor, without importing torch here
        torch = sys.modules["torch"]
        name = _TORCH_NAMES.get(str(t.dtype))
        if name is None:
            raise TypeError(f"unsupported torch dtype {t.dtype}")
        t = t.detach().cpu().contiguous()
        if name == "bfloat16":
            return t.view(torch.int16).numpy().view("<u2"), "bfloat16"
        if name.startswith("float8"):
            return t.view(torch.uint8).numpy(), name
        return t.numpy(), dtype_name or name
    a = np.asarray(t)
    if dtype_name is None:
        dtype_name = {"f8": "float64", "f4": "float32", "f2": "float16", "i1": "int8", "i4": "int32",
                      "i8": "int64"}.get(a.dtype.str[1:])
        if dtype_name is None:
            raise TypeError(f"cannot name numpy dtype {a.dtype} (uint8 is ambiguous: pass (array, 'float8_e4m3fn'))")
    return a, dtype_name


def _arr(t):
    return to_numpy(t)[0]


def _write_any(group, name, value):
    array, dtype_name = to_numpy(value)
    return _w.write_tensor(group, name, array, dtype_name)


def write_expected(f, expected, backend="capture"):
    """/expected from what the call produced: output, attn_output, kv_cache, k_scale_cache,
    v_scale_cache, ssm_output ([T, Hq, D] tensors in the producer's dtype), "ssm": {pool: after},
    "metadata": {"a/b/name": int (attribute) or int array (dataset)} (optional)."""
    g = f.create_group("expected")
    g.attrs["backend"] = backend
    for key in ("output", "attn_output", "kv_cache", "k_scale_cache", "v_scale_cache", "ssm_output"):
        if expected.get(key) is not None:
            _write_any(g, key, expected[key])
    if expected.get("ssm"):
        s = g.create_group("ssm")
        for name, pool in expected["ssm"].items():
            _write_any(s, name, pool)
    for flat, value in (expected.get("metadata") or {}).items():
        parent, _, leaf = ("metadata/" + flat).rpartition("/")
        group = g.require_group(parent)
        if np.ndim(value) == 0:
            group.attrs[leaf] = np.int64(value)
        else:
            _w.write_tensor(group, leaf, np.asarray(value), "int32")


def write_capture(path, config, batch, inputs, ssm=None, expected=None, provenance=None, backend="capture"):
    """Writes one hybrid-batch file atomically (temp file in the same directory + os.replace).

    config: /config attributes (+ "sinks", "alibi_slopes" arrays, "cudagraph_capture_sizes");
    batch: query_start_loc, seq_lens, block_table, slot_mapping, num_actual_tokens, optional
    ssm_block_table, mm_prefix_range, num_accepted_tokens; inputs: query, key, value, kv_cache,
    optional k_scale_cache/v_scale_cache and k_scale/v_scale/output_scale scalars;
    ssm: {"params", "state", "weights"}; expected: see write_expected. Tensors: numpy, torch or
    (array, dtype_name)."""
    config = dict(config)
    batch = {k: (int(v) if k == "num_actual_tokens" else _arr(v)) for k, v in batch.items() if v is not None}
    ins = {}
    for key, value in inputs.items():
        if value is None:
            continue
        if key in ("k_scale", "v_scale", "output_scale"):
            ins[key] = float(_arr(value).reshape(-1)[0])
        else:
            ins[key], _ = to_numpy(value)
    ssm = ssm or {}
    ssm_np = {"params": dict(ssm.get("params") or {}),
              "state": {k: to_numpy(v) for k, v in (ssm.get("state") or {}).items()},
              "weights": {k: to_numpy(v) for k, v in (ssm.get("weights") or {}).items()}}
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}")
    try:
        _w.write_hybrid_batch(tmp, config, batch, ins, provenance=provenance, ssm=ssm_np)
        with h5py.File(tmp, "r+") as f:
            f.attrs["schema_version"] = SCHEMA_VERSION
            if expected:
                write_expected(f, expected, backend)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return path


class Capturer:
    """The environment-gated capture state of one process."""

    def __init__(self, directory=None, layers=None, max_files=16, max_bytes=1 << 30, every_n_steps=1):
        self.directory = directory
        self.layers = [p.strip() for p in (layers or "").split(",") if p.strip()]
        self.max_files, self.max_bytes, self.every_n_steps = int(max_files), int(max_bytes), max(1, int(every_n_steps))
        self.files_written, self.bytes_written = 0, 0
        self.steps = {}  # layer name -> forward calls seen

    @classmethod
    def from_env(cls, env=None):
        env = os.environ if env is None else env
        return cls(env.get("HYBRIDTB_CAPTURE_DIR") or None, env.get("HYBRIDTB_CAPTURE_LAYERS", ""),
                   env.get("HYBRIDTB_CAPTURE_MAX_FILES", 16), env.get("HYBRIDTB_CAPTURE_MAX_BYTES", 1 << 30),
                   env.get("HYBRIDTB_CAPTURE_EVERY_N_STEPS", 1))

    @property
    def enabled(self):
        return bool(self.directory)

    def should_capture(self, layer_name):
        """Counts the call; True if this step of this layer is to be written."""
        step = self.steps.get(layer_name, 0)
        self.steps[layer_name] = step + 1
        if not self.enabled or self.files_written >= self.max_files or self.bytes_written >= self.max_bytes:
            return False
        if self.layers and not any(fnmatch.fnmatchcase(layer_name, p) for p in self.layers):
            return False
        return step % self.every_n_steps == 0

    def begin(self, layer_name, config, batch, inputs, ssm=None, provenance=None):
        """Copies the inputs now (forward overwrites kv_cache and the pools in place)."""
        step = self.steps.get(layer_name, 1) - 1
        snap = lambda d: {k: (to_numpy(v) if v is not None and not isinstance(v, (int, float)) else v)
                          for k, v in (d or {}).items()}
        inputs_copy = {k: ((v[0].copy(), v[1]) if isinstance(v, tuple) else v) for k, v in snap(inputs).items()}
        ssm_copy = None
        if ssm:
            ssm_copy = {"params": dict(ssm.get("params") or {}),
                        "state": {k: (a.copy(), n) for k, (a, n) in snap(ssm.get("state")).items()},
                        "weights": snap(ssm.get("weights"))}
        prov = {"producer": "hybridtb_capture", "layer": layer_name, "step": str(step)}
        prov.update(provenance or {})
        return {"layer": layer_name, "step": step, "config": dict(config), "batch": snap(batch),
                "inputs": inputs_copy, "ssm": ssm_copy, "provenance": prov}

    def finish(self, pending, expected=None, backend="capture"):
        """Writes the file with /expected from what the call produced (None: inputs only)."""
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in pending["layer"])
        path = os.path.join(self.directory, f"capture_{safe}_step{pending['step']}.h5")
        write_capture(path, pending["config"], pending["batch"], pending["inputs"], pending["ssm"],
                      expected, pending["provenance"], backend)
        self.files_written += 1
        self.bytes_written += os.path.getsize(path)
        return path


def wrap_forward(forward, capturer, layer_name_of, describe):
    """Wraps an unbound `forward(self, layer, query, key, value, kv_cache, attn_metadata, output, ...)`.

    layer_name_of(self, layer) -> str; describe(self, layer, query, key, value, kv_cache,
    attn_metadata, output, *args, **kwargs) -> dict(config=, batch=, inputs=, ssm=, outputs=callable)
    where outputs() returns the expected dict after the call (reads `output`, kv_cache, pools)."""
    def wrapper(self, layer, query, key, value, kv_cache, attn_metadata, output=None, *args, **kwargs):
        name = layer_name_of(self, layer)
        if attn_metadata is None or not capturer.should_capture(name):
            return forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        d = describe(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        pending = capturer.begin(name, d["config"], d["batch"], d["inputs"], d.get("ssm"))
        result = forward(self, layer, query, key, value, kv_cache, attn_metadata, output, *args, **kwargs)
        capturer.finish(pending, d["outputs"]() if d.get("outputs") else None)
        return result
    return wrapper
