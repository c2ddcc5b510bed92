"""Fake vLLM engine objects built from a contract fixture (datasets/capture/contracts/*.json).

The modules, class names, `forward` signature, metadata dataclass fields, KV-cache layout, cache
dtype rule and query-quantisation rule come from the fixture, i.e. from the real release. The
numbers come from a hybridtb batch file and the reference's results for it (`hybridtb run
--backend reference`): the fake `forward` writes the cache the reference wrote and the output it
computed, so a correct capture of the call replays on the reference with no mismatch, and any
mistake in the capture's layout, dtype, block renumbering or unpadding shows up as one.

The engine's view differs from the batch file on purpose: the cache is bigger (extra blocks with
garbage), its block ids are shuffled, it is in the release's layout and dtype, and the padding is
the release's CUDA-graph padding. Tensors are real torch (on CUDA when available) or fake_torch.
"""
import dataclasses
import json
import os
import sys
import types

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
CONTRACTS = os.path.join(ROOT, "datasets", "capture", "contracts")
sys.path.insert(0, os.path.join(ROOT, "harness", "scripts"))
import write_batch_h5py as wb  # noqa: E402


def load_torch():
    """Real torch when installed, else the numpy stand-in, registered as `torch` for the hook."""
    try:
        import torch
        return torch
    except ImportError:
        import fake_torch
        sys.modules["torch"] = fake_torch
        return fake_torch


torch = load_torch()
REAL_TORCH = not getattr(torch, "IS_FAKE", False)
DEVICE = "cuda" if REAL_TORCH and torch.cuda.is_available() else "cpu"


ENGINES = {}  # the current Engine for fake modules created from files (import-hook test)


def to_numpy_bits(t):
    """A tensor's bits as numpy (bf16 as uint16, fp8 as uint8)."""
    name = str(t.dtype).replace("torch.", "")
    if name == "bfloat16":
        t = t.view(torch.int16)
    elif name.startswith("float8"):
        t = t.view(torch.uint8)
    return t.cpu().numpy()


def contract(name):
    with open(os.path.join(CONTRACTS, name + ".json"), encoding="utf-8") as f:
        return json.load(f)


# ------------------------------------------------------------------------------------------------
# Values: h5py reads bf16 as exact float32 and fp8 as bytes; the engine wants torch tensors.

def bits_of(ds):
    """(array, dtype_name) of a dataset, bf16 as uint16 bits, fp8 as uint8 bytes."""
    name = ds.attrs["dtype_name"]
    name = name.decode() if isinstance(name, bytes) else name
    a = ds[()]
    if name == "bfloat16":
        return (np.ascontiguousarray(a, "<f4").view("<u4") >> 16).astype("<u2"), name
    return a, name


def to_dtype_bits(values, name):
    """float64 values -> (array, name) in a model dtype (bf16: round to nearest even)."""
    if name == "bfloat16":
        return wb.to_bfloat16_bits(np.asarray(values, np.float32)), name
    return np.asarray(values, {"float16": "<f2", "float32": "<f4"}[name]), name


def tensor(array, name):
    """A torch tensor of dtype `name` holding exactly these bits."""
    a = np.ascontiguousarray(array)
    if name == "bfloat16":
        t = torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    elif name in ("float8_e4m3fn", "float8_e5m2"):
        t = torch.from_numpy(a.astype(np.uint8)).view(getattr(torch, name))
    else:
        t = torch.from_numpy(a.copy())
    return t.to(DEVICE) if DEVICE != "cpu" else t


def e4m3_table():
    """Every float8_e4m3fn byte's value (NaN for 0x7F and 0xFF)."""
    values = np.empty(256)
    for b in range(256):
        s, e, m = b >> 7, (b >> 3) & 15, b & 7
        v = np.nan if (e == 15 and m == 7) else (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
        values[b] = -v if s else v
    return values


def e4m3_encode(x):
    """float values -> float8_e4m3fn bytes: round to nearest, ties to even, saturating at 448."""
    table = e4m3_table()
    finite = np.array([b for b in range(128) if np.isfinite(table[b])])
    mags = table[finite]
    x = np.asarray(x, np.float64)
    a = np.minimum(np.abs(x), 448.0)
    hi = np.clip(np.searchsorted(mags, a), 1, len(mags) - 1)
    lo = hi - 1
    d_lo, d_hi = a - mags[lo], mags[hi] - a
    pick = np.where(d_lo < d_hi, lo, np.where(d_hi < d_lo, hi, np.where(finite[lo] % 2 == 0, lo, hi)))
    out = finite[pick].astype(np.uint8)
    return np.where(np.signbit(x) & (out != 0), out | 0x80, out).astype(np.uint8)


# ------------------------------------------------------------------------------------------------
# A step: the batch file, the reference's results, and the engine's renumbering.

class Step:
    """One batch file + the reference's results for it (paths), read into numpy."""

    def __init__(self, src, ref):
        with h5py.File(src, "r") as f:
            self.config = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in f["config"].attrs.items()}
            self.config_arrays = {k: f["config"][k][()] for k in f["config"] if isinstance(f["config"][k], h5py.Dataset)}
            self.ssm_params = dict(f["config/ssm"].attrs) if "config/ssm" in f else {}
            self.batch = {k: f["batch"][k][()] for k in f["batch"]}
            self.num_actual_tokens = int(f["batch"].attrs["num_actual_tokens"])
            self.inputs = {k: bits_of(f["inputs"][k]) for k in f["inputs"] if isinstance(f["inputs"][k], h5py.Dataset)}
            self.pools = {k: bits_of(d) for k, d in f["inputs/ssm"].items()} if "inputs/ssm" in f else {}
            self.weights = {k: bits_of(d) for k, d in f["weights"].items()} if "weights" in f else {}
        with h5py.File(ref, "r") as f:
            o = f["outputs"]
            dtype = self.config["dtype"]
            # The engine's outputs are the reference's float64 results, not rounded to the model
            # dtype: `hybridtb replay --backend reference` then compares them exactly (its
            # tolerance follows the candidate's float64), so any misplaced row, block or slot in
            # the capture fails.
            self.output = (o["output"][()], "float64")
            self.attn_output = (o["attn_output"][()], "float64")
            self.ssm_output = (o["ssm_output"][()], "float64") if "ssm_output" in o else None
            kv = o["kv_cache"]
            self.kv_after = bits_of(kv) if kv.attrs["dtype_name"] not in (b"float64", "float64") else \
                to_dtype_bits(kv[()], dtype)
            self.pools_after = {}
            if "ssm" in o:
                for k, d in o["ssm"].items():
                    self.pools_after[k] = (d[()].astype(self.pools[k][0].dtype), self.pools[k][1])


class Engine:
    """The engine-side tensors and metadata of a Step for one release contract."""

    def __init__(self, step, c, extra_blocks=9, seed=1, padding=None, pad_rows=3, pad_reqs=2, fp8_query=None,
                 kv_cache_dtype=None, layer_name="model.layers.0.self_attn.attn", output_dtype="float64"):
        self.step, self.c, self.layer_name = step, c, layer_name
        rng = np.random.default_rng(seed)
        kv, kv_name = step.inputs["kv_cache"]
        nb_src, _, bs, hkv, d = kv.shape
        self.block_size = bs
        self.nb = nb_src + extra_blocks
        # Engine block ids: the null block stays 0, the others are shuffled over a bigger cache.
        perm = np.concatenate([[0], 1 + rng.permutation(self.nb - 1)[: nb_src - 1]]).astype(np.int64)
        self.perm = perm
        cfg = step.config
        self.kv_cache_dtype = kv_cache_dtype or {"auto": "auto", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8_e5m2"}[
            cfg["kv_cache_dtype"]]
        layout = c["triton"]["kv_cache"]["layout"]
        self.layout = layout
        # The release's allocation rule: STR_DTYPE_TO_TORCH_DTYPE maps the fp8 strings to uint8.
        uint8_alloc = self.kv_cache_dtype in c["cache_dtypes"]["stored_as_uint8"]
        self.kv_tensor_name = "uint8" if (kv_name.startswith("float8") and uint8_alloc) else kv_name

        def engine_cache(values):
            full = rng.integers(0, 0x70, size=(self.nb,) + kv.shape[1:], dtype=np.uint8) if kv_name.startswith("float8") \
                else (wb.to_bfloat16_bits(rng.standard_normal((self.nb,) + kv.shape[1:]).astype(np.float32))
                      if kv_name == "bfloat16" else rng.standard_normal((self.nb,) + kv.shape[1:]).astype(values.dtype))
            full = full.astype(values.dtype)
            full[perm] = values
            if layout == "[2,NB,BS,H,D]":
                full = np.ascontiguousarray(full.transpose(1, 0, 2, 3, 4))
            elif layout == "[NB,H,BS,2D]":
                full = np.ascontiguousarray(full.transpose(0, 3, 2, 1, 4).reshape(self.nb, hkv, bs, 2 * d))
            name = self.kv_tensor_name
            return tensor(full, name)

        self.kv_cache = engine_cache(kv)
        self.kv_after = engine_cache(step.kv_after[0])

        # The batch in engine block ids, with the release's padding.
        qsl = step.batch["query_start_loc"].astype(np.int64)
        seq_lens = step.batch["seq_lens"].astype(np.int64)
        table = perm[step.batch["block_table"].astype(np.int64)]
        sm = step.batch["slot_mapping"].astype(np.int64)
        slots = np.where(sm >= 0, perm[np.maximum(sm, 0) // bs] * bs + np.maximum(sm, 0) % bs, -1)
        real = int(qsl[-1])
        rows = len(sm)
        nat = step.num_actual_tokens
        if padding == "piecewise":  # 0.10/0.11: slot_mapping sliced to the real tokens, q/k/v padded
            rows = real + pad_rows
            slots = slots[:real]
        elif padding == "full":  # 0.12+ FULL graphs: padded num_actual_tokens, padding requests
            rows = real + pad_rows
            slots = np.concatenate([slots[:real], np.full(pad_rows, -1)])
            nat = rows
            qsl = np.concatenate([qsl, np.full(pad_reqs, real)])
            seq_lens = np.concatenate([seq_lens, np.zeros(pad_reqs, np.int64)])
            table = np.concatenate([table, np.full((pad_reqs, table.shape[1]), -1)])
        self.rows, self.real = rows, real
        self.md_values = {"num_actual_tokens": nat, "max_query_len": int(np.diff(qsl).max()),
                          "query_start_loc": tensor(qsl.astype(np.int32), "int32"),
                          "max_seq_len": int(seq_lens.max()), "seq_lens": tensor(seq_lens.astype(np.int32), "int32"),
                          "block_table": tensor(table.astype(np.int32), "int32"),
                          "slot_mapping": tensor(slots.astype(np.int64), "int64"),
                          "use_cascade": False, "common_prefix_len": 0, "causal": True, "seq_threshold_3D": 0,
                          "num_par_softmax_segments": 0}

        def padded(array, name):
            a = array
            if rows > a.shape[0]:
                extra = np.zeros((rows - a.shape[0],) + a.shape[1:], a.dtype)
                a = np.concatenate([a, extra])
            return tensor(a[:rows], name)

        model = cfg["dtype"]
        q_bits, _ = step.inputs["query"]
        self.fp8_query = fp8_query if fp8_query is not None else (
            c["triton"]["query_quant"]["fp8_query_accepted"] and self.kv_cache_dtype in ("fp8", "fp8_e4m3"))
        if self.fp8_query:
            values = (q_bits.astype(np.uint32) << 16).view(np.float32) if model == "bfloat16" else q_bits
            self.query_bytes = e4m3_encode(values)
            self.query = padded(self.query_bytes, "float8_e4m3fn")
        else:
            self.query = padded(q_bits, model)
        self.key = padded(step.inputs["key"][0], model)
        self.value = padded(step.inputs["value"][0], model)
        def out(value):  # "float64": exact reference results; a model dtype: rounded as vLLM's output
            if value is None:
                return None
            return padded(*(to_dtype_bits(value[0], output_dtype) if output_dtype != "float64" else value))
        self.output = out((np.zeros_like(step.output[0]), "float64"))
        self.ref_output = out(step.output)
        self.ref_attn_output = out(step.attn_output)
        self.ref_ssm_output = out(step.ssm_output)

        def scale(name):
            v = float(np.asarray(step.inputs[name][0]).reshape(-1)[0]) if name in step.inputs else 1.0
            return tensor(np.array([v], np.float32), "float32")

        self.layer = types.SimpleNamespace(layer_name=layer_name, _k_scale=scale("k_scale"), _v_scale=scale("v_scale"),
                                           _q_scale=tensor(np.array([1.0], np.float32), "float32"), _q_scale_float=1.0)
        self.calls = 0
        self.raise_in_forward = None


# ------------------------------------------------------------------------------------------------
# Modules and classes from the contract.

def _module(name):
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        sub = ".".join(parts[:i])
        if sub not in sys.modules:
            sys.modules[sub] = types.ModuleType(sub)
            if i > 1:
                setattr(sys.modules[".".join(parts[: i - 1])], parts[i - 1], sys.modules[sub])
    return sys.modules[name]


def _metadata_class(name, fields, module):
    spec = []
    for f in fields:
        if "default" in f:
            spec.append((f["name"], object, dataclasses.field(default=None)))
        else:
            spec.append((f["name"], object))
    cls = dataclasses.make_dataclass(name, spec)
    cls.__module__ = module
    return cls


def _forward_function(signature, body):
    """A function with exactly the release's forward parameters, delegating to body(dict)."""
    params = ", ".join(signature)
    namespace = {"_body": body}
    exec(f"def forward({params}):\n    return _body(dict(locals()))\n", namespace)
    return namespace["forward"]


def install_release(c, engines):
    """Creates the release's triton_attn module (and vllm.__version__) in sys.modules.

    `engines`: a dict the test fills with the current Engine under key "current"; forward reads
    from it. Returns the module."""
    t = c["triton"]
    vllm = _module("vllm")
    vllm.__version__ = c["version"]
    mod = _module(t["module"])
    md_cls = _metadata_class("TritonAttentionMetadata", t["metadata_fields"], t["module"])
    written_in_forward = t["kv_cache"]["written_in_forward"]

    def body(args):
        e = engines["current"]
        e.calls += 1
        if args["attn_metadata"] is None:
            return args["output"]
        if e.raise_in_forward:
            raise e.raise_in_forward
        if written_in_forward:
            args["kv_cache"].copy_(e.kv_after)
        src = e.ref_attn_output if engines.get("attention_only") else e.ref_output
        args["output"][: e.real].copy_(src[: e.real])
        return args["output"]

    impl_cls = type("TritonAttentionImpl", (), {"forward": _forward_function(t["forward_signature"], body),
                                                 "__module__": t["module"]})
    if not written_in_forward:
        def do_kv_cache_update(self, layer, key, value, kv_cache, slot_mapping):
            kv_cache.copy_(engines["current"].kv_after)
        impl_cls.do_kv_cache_update = do_kv_cache_update
    backend_cls = type("TritonAttentionBackend", (), {"__module__": t["module"]})
    mod.TritonAttentionImpl, mod.TritonAttentionMetadata, mod.TritonAttentionBackend = impl_cls, md_cls, backend_cls
    return mod


def make_impl(mod, e, impl_cls_name="TritonAttentionImpl"):
    cfg = e.step.config
    impl = object.__new__(getattr(mod, impl_cls_name))
    impl.num_heads, impl.num_kv_heads, impl.head_size = int(cfg["num_heads"]), int(cfg["num_kv_heads"]), \
        int(cfg["head_size"])
    impl.scale = float(cfg["scale"])
    w = int(cfg["sliding_window"])
    impl.sliding_window = (w - 1, 0) if w else (-1, -1)
    impl.kv_cache_dtype = e.kv_cache_dtype
    impl.logits_soft_cap = float(cfg["logits_soft_cap"])
    impl.alibi_slopes = tensor(e.step.config_arrays["alibi_slopes"].astype(np.float32), "float32") \
        if "alibi_slopes" in e.step.config_arrays else None
    impl.sinks = tensor(e.step.config_arrays["sinks"].astype(np.float32), "float32") \
        if "sinks" in e.step.config_arrays else None
    impl.attn_type = "decoder"
    impl.kv_sharing_target_layer_name = None
    impl.use_alibi_sqrt = bool(cfg["use_alibi_sqrt"])
    return impl


def make_metadata(mod, e):
    cls = mod.TritonAttentionMetadata
    values = {f.name: e.md_values.get(f.name) for f in dataclasses.fields(cls)}
    return cls(**values)


def call(impl, e, md, mod=None):
    """Calls forward as vLLM's Attention layer does (keyword output), after the separate KV-cache
    update of releases whose forward does not write the cache."""
    if hasattr(impl, "do_kv_cache_update") and not getattr(impl, "_triton_impl", None):
        impl.do_kv_cache_update(e.layer, e.key, e.value, e.kv_cache, md.slot_mapping)
    return impl.forward(e.layer, e.query, e.key, e.value, e.kv_cache, md, output=e.output)


# ------------------------------------------------------------------------------------------------
# The seed's hybrid backend around a release's Triton backend.

def install_seed(seed, release, engines):
    """vllm.v1.attention.backends.hybrid_attn from the seed contract, wrapping the release's
    TritonAttentionImpl (installed too)."""
    tmod = install_release(release, engines)
    h = seed["hybrid"]
    mod = _module(h["module"])
    md_cls = dataclasses.make_dataclass("HybridAttentionMetadata", [("triton_metadata", object),
                                                                   ("mamba_metadata", object)])
    md_cls.num_actual_tokens = property(lambda self: self.triton_metadata.num_actual_tokens)
    mamba_cls = _metadata_class("Mamba1AttentionMetadata", [dict(f, default=None) for f in seed["mamba1"]["metadata_fields"]],
                                "vllm.v1.attention.backends.mamba1_attn")
    inner_params = [p.split("=")[0] for p in release["triton"]["forward_signature"]]

    def body(args):
        e = engines["current"]
        impl, md = args["self"], args["attn_metadata"]
        extra = {k: args[k] for k in ("output_scale", "output_block_scale") if k in inner_params and k in args}
        engines["attention_only"] = True
        try:
            impl._triton_impl.forward(args["layer"], args["query"], args["key"], args["value"], args["kv_cache"],
                                      md.triton_metadata if md is not None else None, output=args["output"], **extra)
        finally:
            engines["attention_only"] = False
        if md is None or getattr(args["layer"], "ssm_adapter", None) is None:
            return args["output"]
        # As the seed: the adapter's contribution for query[:T] is added to the attention output.
        ssm_out = args["layer"].ssm_adapter.forward_history_branch_decode(args["query"][: e.real], attn_metadata=md)
        assert ssm_out is not None and tuple(ssm_out.shape) == (e.real,) + tuple(args["query"].shape[1:])
        args["output"][: e.real].copy_(e.ref_output[: e.real])  # attention + contribution, exactly
        for name, pool in e.pools_after.items():
            e.engine_pools[name].copy_(pool)
        return args["output"]

    impl_cls = type("HybridAttentionImpl", (), {"forward": _forward_function(h["forward_signature"], body),
                                                 "__module__": h["module"]})
    mod.HybridAttentionImpl, mod.HybridAttentionMetadata = impl_cls, md_cls
    mod.Mamba1AttentionMetadata = mamba_cls
    return mod, tmod


def make_hybrid(mod, tmod, e, adapter_mode, seed_contract):
    impl = make_impl(mod, e, "HybridAttentionImpl")
    impl._triton_impl = make_impl(tmod, e)
    tmd = make_metadata(tmod, e)
    qsl = e.step.batch["query_start_loc"]
    qlen = np.diff(qsl)
    nd = int(np.argmax(qlen > 1)) if np.any(qlen > 1) else len(qlen)
    table = e.perm[e.step.batch["block_table"].astype(np.int64)]
    fields = {f["name"]: None for f in seed_contract["mamba1"]["metadata_fields"]}
    fields.update(num_decodes=nd, num_prefills=len(qlen) - nd, num_decode_tokens=int(qsl[nd]),
                  num_prefill_tokens=int(qsl[-1] - qsl[nd]), num_reqs=len(qlen),
                  state_indices_tensor_d=tensor(table[:nd, 0].astype(np.int32), "int32"),
                  state_indices_tensor_p=tensor(table[nd:, 0].astype(np.int32), "int32"))
    mmd = mod.Mamba1AttentionMetadata(**fields)
    md = mod.HybridAttentionMetadata(tmd, mmd)
    adapter = types.SimpleNamespace(ssm_mode=adapter_mode)
    # The contribution the reference computed for the real tokens (zero in mode "disabled").
    adapter.forward_history_branch_decode = lambda hidden, attn_metadata=None: e.ref_ssm_output[: e.real]
    if adapter_mode not in ("disabled", "prefix_sum"):
        wts = e.step.weights

        def lin(w, b=None):
            return types.SimpleNamespace(weight=tensor(*wts[w]), bias=tensor(*wts[b]) if b and b in wts else None)
        adapter.in_proj = lin("in_proj", "in_proj_bias")
        cw, cn = wts["conv1d_weight"]
        adapter.conv1d = types.SimpleNamespace(weight=tensor(cw[:, None, :].copy(), cn),
                                               bias=tensor(*wts["conv1d_bias"]) if "conv1d_bias" in wts else None)
        adapter.x_proj = lin("x_proj")
        adapter.dt_proj = lin("dt_proj", "dt_proj_bias")
        adapter.out_proj = lin("out_proj", "out_proj_bias")
        a_log, an = wts["A_log"]
        adapter.A = tensor((-np.exp(a_log.astype(np.float64))).astype(np.float32), "float32")
        adapter.D = tensor(*wts["D"])
        # vLLM keeps the conv state as (K-1, I) per slot (SD); a step generated under the
        # unversioned rules holds it as (I, K-1) and is transposed to the engine's layout.
        k_minus_1 = cw.shape[1] - 1

        def engine_layout(name, pool):
            if name == "conv_state" and pool.shape[1] != k_minus_1:
                return np.ascontiguousarray(pool.transpose(0, 2, 1))
            return pool
        e.engine_pools = {}
        for name, (pool, pn) in e.step.pools.items():
            pool = engine_layout(name, pool)
            full = np.random.default_rng(5).standard_normal((e.nb,) + pool.shape[1:]).astype(pool.dtype)
            full[e.perm[: pool.shape[0]]] = pool
            e.engine_pools[name] = tensor(full, pn)
        after = {}
        for name, (pool, pn) in e.step.pools_after.items():
            full = to_numpy_bits(e.engine_pools[name]).copy()
            src = engine_layout(name, pool)
            idx = e.perm[: pool.shape[0]]
            full[idx] = src
            after[name] = tensor(full, pn)
        e.pools_after = after
        adapter.kv_cache = [(e.engine_pools["conv_state"], e.engine_pools["ssm_state"])]
    else:
        e.pools_after = {}
    e.layer.ssm_adapter = adapter
    return impl, md
