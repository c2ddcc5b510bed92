#!/usr/bin/env python3
"""Extract the facts the capture module relies on from an unpacked vLLM release.

Reads the release's Python sources with `ast` and plain text matching; it never imports vllm, so
it runs on any machine (no torch, no GPU). The output is a small JSON "contract" that the fake
engine of the capture tests (tests/capture/) is built from, and whose `engine_rules` object other
parts of hybridtb consume. Every fact names the file (and function) it was read from.

    python3 extract_vllm_contract.py vllm-src/0.12.0 -o vllm-0.12.0.json

The argument is the directory that holds `vllm/` (an unpacked wheel or source tree). A fact the
release does not have is `null`; a fact the extractor cannot find where the release should have it
is an error naming the file and the pattern, so that a new release layout is noticed instead of
producing a silently wrong contract.
"""
import argparse
import ast
import json
import os
import re
import sys

SCHEMA_LAYOUT = "[NB,2,BS,H,D]"


class ContractError(Exception):
    pass


class Release:
    """Read-only access to the release's source files, by path relative to the release root."""

    def __init__(self, root):
        self.root = os.path.abspath(root)
        if not os.path.isdir(os.path.join(self.root, "vllm")):
            raise ContractError(f"{root}: no vllm/ directory (pass the directory that holds vllm/)")
        self._trees = {}

    def exists(self, rel):
        return os.path.isfile(os.path.join(self.root, rel))

    def first(self, *rels):
        """The first of the candidate paths that exists, or None."""
        return next((r for r in rels if self.exists(r)), None)

    def text(self, rel):
        with open(os.path.join(self.root, rel), encoding="utf-8") as f:
            return f.read()

    def tree(self, rel):
        if rel not in self._trees:
            self._trees[rel] = ast.parse(self.text(rel), filename=rel)
        return self._trees[rel]


def module_of(rel):
    return rel[:-3].replace("/", ".")


def find_class(tree, name):
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def find_function(node, name):
    for child in ast.walk(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and child.name == name:
            return child
    return None


def signature(func):
    """Parameter names in order, with defaults as source text; '*' marks keyword-only start."""
    a = func.args
    params = []
    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for arg, default in zip(positional, defaults):
        params.append(arg.arg if default is None else f"{arg.arg}={ast.unparse(default)}")
    if a.vararg:
        params.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        params.append("*")
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        params.append(arg.arg if default is None else f"{arg.arg}={ast.unparse(default)}")
    if a.kwarg:
        params.append("**" + a.kwarg.arg)
    return params


def dataclass_fields(cls):
    """[{name, type, default?}] of the annotated class attributes (ClassVar excluded)."""
    fields = []
    for stmt in cls.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            annotation = ast.unparse(stmt.annotation)
            if annotation.startswith("ClassVar"):
                continue
            field = {"name": stmt.target.id, "type": annotation}
            if stmt.value is not None:
                field["default"] = ast.unparse(stmt.value)
            fields.append(field)
    return fields


def module_constant(tree, name):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name \
                and node.value is not None:
            return ast.literal_eval(node.value)
    return None


def literal_alias(tree, name):
    """The strings of `Name = Literal["a", "b", ...]`, or None."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            value = node.value
            if isinstance(value, ast.Subscript) and ast.unparse(value.value).endswith("Literal"):
                elts = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]
                return [e.value for e in elts if isinstance(e, ast.Constant)]
    return None


def dict_constant_text(tree, name):
    """{key: value source text} of a module-level dict literal `name = {...}`."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            return {ast.literal_eval(k): ast.unparse(v) for k, v in zip(node.value.keys, node.value.values)}
    return None


def require(value, what, where):
    if value is None:
        raise ContractError(f"{where}: cannot find {what}")
    return value


# --------------------------------------------------------------------------------------------------
# The facts, one function per topic.

def version_facts(rel):
    vf = "vllm/_version.py"
    if not rel.exists(vf):
        raise ContractError(f"{rel.root}: no {vf}")
    m = re.search(r"__version__\s*=\s*version\s*=\s*['\"]([^'\"]+)['\"]", rel.text(vf))
    version = require(m and m.group(1), "__version__", vf)
    commit = re.search(r"__commit_id__\s*=\s*commit_id\s*=\s*['\"]([^'\"]+)['\"]", rel.text(vf))
    return {"version": version, "commit_id": commit.group(1) if commit else None, "version_source": vf}


def triton_facts(rel):
    path = require(rel.first("vllm/v1/attention/backends/triton_attn.py"), "triton_attn.py", rel.root)
    tree = rel.tree(path)
    out = {"module": module_of(path), "file": path}
    names = {}
    for cls in ("TritonAttentionImpl", "TritonAttentionMetadata", "TritonAttentionBackend",
                "TritonAttentionMetadataBuilder"):
        names[cls] = cls if find_class(tree, cls) else None
        require(names[cls], f"class {cls}", path)
    out["classes"] = names
    impl = find_class(tree, "TritonAttentionImpl")
    forward = require(find_function(impl, "forward"), "TritonAttentionImpl.forward", path)
    out["forward_signature"] = signature(forward)
    out["init_signature"] = signature(require(find_function(impl, "__init__"), "TritonAttentionImpl.__init__", path))
    out["metadata_fields"] = dataclass_fields(find_class(tree, "TritonAttentionMetadata"))
    forward_src = ast.get_source_segment(rel.text(path), forward)

    # The KV-cache layout: get_kv_cache_shape's return tuple, or (0.33+, no such method) the
    # logical 4-D page the forward splits itself.
    backend = find_class(tree, "TritonAttentionBackend")
    shape_fn = find_function(backend, "get_kv_cache_shape")
    if shape_fn is not None:
        returns = [n for n in ast.walk(shape_fn) if isinstance(n, ast.Return)]
        text = ast.unparse(returns[-1].value).replace(" ", "")
        layouts = {"(2,num_blocks,block_size,num_kv_heads,head_size)": "[2,NB,BS,H,D]",
                   "(num_blocks,2,block_size,num_kv_heads,head_size)": "[NB,2,BS,H,D]"}
        layout = require(layouts.get(text), f"a known get_kv_cache_shape return (found {text})", path)
        out["kv_cache"] = {"layout": layout, "shape_expr": text,
                           "split": "unbind(0)" if layout.startswith("[2,") else "unbind(1)",
                           "source": f"{path}: TritonAttentionBackend.get_kv_cache_shape"}
    elif "kv_cache.transpose(1, 2)" in forward_src and "split(hs, dim=-1)" in forward_src:
        out["kv_cache"] = {"layout": "[NB,H,BS,2D]", "shape_expr": "(num_blocks,num_kv_heads,block_size,2*head_size)",
                           "split": "transpose(1,2).split(head_size,dim=-1)",
                           "source": f"{path}: TritonAttentionImpl.forward (no get_kv_cache_shape; the logical "
                                     "[B,H,N,C] page of vllm/v1/kv_cache_interface.py)"}
    else:
        raise ContractError(f"{path}: cannot determine the KV-cache layout")
    out["kv_cache"]["schema_layout"] = SCHEMA_LAYOUT
    # Whether forward writes the cache (<= 0.12) or a separate do_kv_cache_update did it before.
    writes = "reshape_and_cache_flash" in forward_src
    out["kv_cache"]["written_in_forward"] = writes
    out["kv_cache"]["written_by"] = ("TritonAttentionImpl.forward" if writes else
                                     "TritonAttentionImpl.do_kv_cache_update (before forward)")

    kv_dtypes = None
    for stmt in backend.body:
        target = stmt.target if isinstance(stmt, ast.AnnAssign) else None
        if isinstance(target, ast.Name) and target.id == "supported_kv_cache_dtypes":
            kv_dtypes = ast.literal_eval(stmt.value)
    out["supported_kv_cache_dtypes"] = kv_dtypes
    out["supported_kv_cache_dtypes_source"] = (f"{path}: TritonAttentionBackend.supported_kv_cache_dtypes"
                                               if kv_dtypes is not None else
                                               f"{path}: no supported_kv_cache_dtypes (see cache_dtypes)")

    # The query quantisation rule.
    impl_src = ast.get_source_segment(rel.text(path), impl)
    method = find_function(impl, "supports_quant_query_input")
    if method is not None:
        accepts = "impl.supports_quant_query_input() (method: " + \
            ast.unparse(method.body[-1]).replace("return ", "") + ")"
    elif "self.supports_quant_query_input =" in impl_src:
        m = re.search(r"self\.supports_quant_query_input = ([^\n]+)", impl_src)
        accepts = f"impl.supports_quant_query_input attribute (= {m.group(1).strip()})"
    else:
        accepts = None
    scale_attr = None
    for candidate in ("layer._q_scale_float", "layer._q_scale"):
        if candidate in forward_src:
            scale_attr = "layer._q_scale"
            break
    out["query_quant"] = {
        "fp8_query_accepted": accepts is not None,
        "rule": accepts or "the backend never receives an fp8 query (AttentionBackend.supports_quant_query_input "
                           "is False for Triton, or the concept does not exist)",
        "quantised_inside_forward": "scaled_fp8_quant(" in forward_src,
        "q_scale_attribute": scale_attr,
        "q_scale_must_be_one": "q_scale is not currently supported" in forward_src
                                or "_q_scale_float == 1.0" in forward_src,
        "q_descale_passed": "q_descale=q_descale" in forward_src,
        "source": f"{path}: TritonAttentionImpl",
    }
    return out


def attention_layer_facts(rel):
    path = rel.first("vllm/attention/layer.py", "vllm/model_executor/layers/attention/attention.py")
    if path is None:
        return {"query_quant_in_layer": None, "source": "no Attention layer file found"}
    src = rel.text(path)
    m = re.search(r"self\.query_quant = QuantFP8", src)
    cond = re.search(r"self\.query_quant = None\s*\n\s*if\s*(.*?):\s*\n", src, re.S)
    return {"query_quant_in_layer": bool(m),
            "condition": re.sub(r"\s+", " ", cond.group(1)).strip() if cond else None,
            "kv_cache_dtypes_allowed": ["fp8", "fp8_e4m3"] if 'in {"fp8", "fp8_e4m3"}' in src else None,
            # 0.33+: a q_scale with one value per KV head quantises the query per head group.
            "per_head_q_scale": "q_scale.numel() == self.num_kv_heads" in src,
            "source": f"{path}: Attention.__init__ / Attention.forward (query_quant)"}


def cache_dtype_facts(rel):
    cfg = require(rel.first("vllm/config/cache.py"), "vllm/config/cache.py", rel.root)
    cache_dtypes = literal_alias(rel.tree(cfg), "CacheDType")
    util = require(rel.first("vllm/utils/torch_utils.py", "vllm/utils/__init__.py"),
                   "the module with STR_DTYPE_TO_TORCH_DTYPE", rel.root)
    table = require(dict_constant_text(rel.tree(util), "STR_DTYPE_TO_TORCH_DTYPE"), "STR_DTYPE_TO_TORCH_DTYPE", util)
    uint8 = sorted(k for k, v in table.items() if v == "torch.uint8")
    return {"accepted": cache_dtypes, "accepted_source": f"{cfg}: CacheDType",
            "str_dtype_to_torch_dtype": table, "str_dtype_to_torch_dtype_source": f"{util}: STR_DTYPE_TO_TORCH_DTYPE",
            "stored_as_uint8": uint8,
            # vLLM resolves the bare "fp8" to the platform's fp8 dtype: float8_e4m3fn on CUDA
            # (current_platform.fp8_dtype()), which is what the forward views the uint8 cache as.
            "fp8_means": "fp8_e4m3"}


def kernel_facts(rel):
    out = {}
    ua = rel.first("vllm/attention/ops/triton_unified_attention.py", "vllm/v1/attention/ops/triton_unified_attention.py")
    ua = require(ua, "triton_unified_attention.py", rel.root)
    out["unified_attention"] = {"module": module_of(ua),
                                "signature": signature(require(find_function(rel.tree(ua), "unified_attention"),
                                                               "def unified_attention", ua))}
    rc = rel.first("vllm/attention/ops/triton_reshape_and_cache_flash.py",
                   "vllm/v1/attention/ops/triton_reshape_and_cache_flash.py")
    if rc is not None:
        fn = find_function(rel.tree(rc), "triton_reshape_and_cache_flash")
        out["triton_reshape_and_cache_flash"] = {"module": module_of(rc), "signature": signature(fn)}
    else:
        out["triton_reshape_and_cache_flash"] = None
    co = require(rel.first("vllm/_custom_ops.py"), "vllm/_custom_ops.py", rel.root)
    fn = find_function(rel.tree(co), "reshape_and_cache_flash")
    out["reshape_and_cache_flash"] = {"module": module_of(co), "signature": signature(fn)} if fn else None
    return out


def mamba_facts(rel):
    path = rel.first("vllm/v1/attention/backends/mamba1_attn.py")
    if path is None:
        return None
    tree = rel.tree(path)
    cls = require(find_class(tree, "Mamba1AttentionMetadata"), "class Mamba1AttentionMetadata", path)
    fields = dataclass_fields(cls)
    bases = [ast.unparse(b) for b in cls.bases]
    base_fields = []
    base_path = rel.first("vllm/v1/attention/backends/mamba_attn.py")
    for base in bases:
        if base_path and find_class(rel.tree(base_path), base):
            base_fields = dataclass_fields(find_class(rel.tree(base_path), base))
    classes = {"Mamba1AttentionMetadata": module_of(path) + ".Mamba1AttentionMetadata",
               "Mamba1AttentionMetadataBuilder": module_of(path) + ".Mamba1AttentionMetadataBuilder"
               if find_class(tree, "Mamba1AttentionMetadataBuilder") else None,
               "Mamba1AttentionBackend": module_of(path) + ".Mamba1AttentionBackend"
               if find_class(tree, "Mamba1AttentionBackend") else None}
    if base_path:
        for name in ("BaseMambaAttentionMetadata", "BaseMambaAttentionMetadataBuilder"):
            if find_class(rel.tree(base_path), name):
                classes[name] = module_of(base_path) + "." + name
    return {"file": path, "classes": classes, "bases": bases,
            "metadata_fields": base_fields + fields,
            "state_indices_fields": [f["name"] for f in base_fields + fields if f["name"].startswith("state_indices")]}


def conv_layout(rel):
    mu = rel.first("vllm/model_executor/layers/mamba/mamba_utils.py")
    if mu is None:
        return None, "no mamba_utils.py"
    tree = rel.tree(mu)
    src = rel.text(mu)
    fn = find_function(tree, "mamba1_state_shape")
    body = ast.get_source_segment(src, fn)
    where = f"{mu}: MambaStateShapeCalculator.mamba1_state_shape"
    if "_orient_conv_shape" in body:
        # The layout is chosen at run time (VLLM_SSM_CONV_STATE_LAYOUT); read the default.
        getter = find_function(tree, "get_conv_state_layout")
        returns = [n.value for n in ast.walk(getter) if isinstance(n, ast.Return) and isinstance(n.value, ast.Constant)]
        default = require(returns and returns[-1].value, "the default return of get_conv_state_layout", mu)
        return default, f"{where} via get_conv_state_layout() (default; VLLM_SSM_CONV_STATE_LAYOUT overrides)"
    if "conv_state_shape[1], conv_state_shape[0]" in body:
        if "if use_v1" in body:
            return "SD", f"{where} (use_v1=True, the V1 engine: swapped to (K-1, dim))"
        return "SD", f"{where} (swapped to (K-1, dim))"
    return "DS", where


def engine_rules(rel, mamba):
    """The `engine_rules` object: each key with its `<key>_source`, null where the release lacks it."""
    rules = {}
    v1u = rel.first("vllm/v1/attention/backends/utils.py")
    old = rel.first("vllm/attention/backends/utils.py")
    for path in (v1u, old):
        if path and module_constant(rel.tree(path), "PAD_SLOT_ID") is not None:
            rules["pad_slot_id"] = module_constant(rel.tree(path), "PAD_SLOT_ID")
            rules["pad_slot_id_source"] = f"{path}: PAD_SLOT_ID"
            break
    require(rules.get("pad_slot_id"), "PAD_SLOT_ID", rel.root)
    # The null block: the V1 block pool reserves its first block (id 0) as a placeholder that
    # freed and out-of-window entries of block tables point at; newer releases also name it
    # NULL_BLOCK_ID for the Mamba kernels.
    null_block = module_constant(rel.tree(v1u), "NULL_BLOCK_ID") if v1u else None
    pool = rel.first("vllm/v1/core/block_pool.py")
    pool_src = rel.text(pool) if pool else ""
    pool_has_null = "self.null_block = self.free_block_queue.popleft()" in pool_src and "block_id=0" in pool_src
    if null_block is not None:
        rules["null_block_id"] = null_block
        rules["null_block_id_source"] = f"{v1u}: NULL_BLOCK_ID" + \
            (f" ({pool}: BlockPool.null_block, the first free block)" if pool_has_null else "")
    elif pool_has_null:
        null_block = 0
        rules["null_block_id"] = 0
        rules["null_block_id_source"] = f"{pool}: BlockPool.__init__ (null_block = the first free block, " \
                                        "block_id 0; no NULL_BLOCK_ID constant in this release)"
    else:
        rules["null_block_id"] = None
        rules["null_block_id_source"] = f"{pool or 'vllm/v1/core/block_pool.py'}: no null block found"

    # The state index a CUDA-graph padding request gets (decode-only FULL graphs).
    padded, padded_src = None, None
    for path in filter(None, (rel.first("vllm/v1/attention/backends/mamba_attn.py"),
                              rel.first("vllm/v1/attention/backends/mamba1_attn.py"))):
        src = rel.text(path)
        m = re.search(r"state_indices_tensor(?:_d)?\[\s*(?:metadata\.)?num_decodes\s*:\s*\]\s*=\s*(\w+)", src)
        if m:
            name = m.group(1)
            padded = rules["pad_slot_id"] if name == "PAD_SLOT_ID" else null_block if name == "NULL_BLOCK_ID" \
                else int(name)
            padded_src = f"{path}: state_indices_tensor[num_decodes:] = {name} (decode-only FULL CUDA graph)"
            break
    rules["padded_request_state_index"] = padded
    rules["padded_request_state_index_source"] = padded_src or \
        f"{mamba['file'] if mamba else 'no mamba1_attn.py'}: the Mamba-1 builder has no CUDA-graph padding " \
        "of state indices in this release"

    ops = rel.first("vllm/model_executor/layers/mamba/ops/mamba_ssm.py")
    rule, rule_src = None, f"{ops}: no skip condition found"
    if ops:
        src = rel.text(ops)
        if re.search(r"state_batch_idx\s*!=\s*null_block_id", src):
            rule = "nonpositive"
            rule_src = f"{ops}: _selective_scan_update_kernel masks state_batch_idx != null_block_id " \
                       f"(null_block_id = NULL_BLOCK_ID = {null_block}; indices are >= 0, so idx <= 0 is skipped)"
        elif re.search(r"state_batch_idx\s*!=\s*pad_slot_id", src):
            rule = "negative"
            rule_src = f"{ops}: _selective_scan_update_kernel masks state_batch_idx != pad_slot_id " \
                       f"(pad_slot_id = PAD_SLOT_ID = {rules['pad_slot_id']}; the only negative index)"
    rules["state_index_skip_rule"] = rule
    rules["state_index_skip_rule_source"] = rule_src

    cfg = rel.first("vllm/config/cache.py")
    modes = literal_alias(rel.tree(cfg), "MambaCacheMode") if cfg else None
    rules["mamba_cache_modes"] = modes
    rules["mamba_cache_modes_source"] = f"{cfg}: MambaCacheMode" if modes is not None else \
        f"{cfg}: no MambaCacheMode (Mamba prefix caching follows enable_prefix_caching in this release)"

    split = v1u and find_function(rel.tree(v1u), "split_decodes_and_prefills")
    if split is None:
        rules["treat_short_extends_as_decodes"] = None
        rules["treat_short_extends_as_decodes_source"] = "no split_decodes_and_prefills"
    elif any(a.arg == "treat_short_extends_as_decodes" for a in split.args.args + split.args.kwonlyargs):
        # The parameter exists: what the Mamba builder passes decides.
        mamba_src = rel.text(rel.first("vllm/v1/attention/backends/mamba_attn.py") or v1u)
        m = re.search(r"treat_short_extends_as_decodes\s*=\s*(True|False)", mamba_src)
        value = (m.group(1) == "True") if m else True
        rules["treat_short_extends_as_decodes"] = value
        rules["treat_short_extends_as_decodes_source"] = \
            f"vllm/v1/attention/backends/mamba_attn.py: split_decodes_and_prefills(..., " \
            f"treat_short_extends_as_decodes={value}) ({v1u}: split_decodes_and_prefills)"
    else:
        rules["treat_short_extends_as_decodes"] = True
        rules["treat_short_extends_as_decodes_source"] = \
            f"{v1u}: split_decodes_and_prefills has no such parameter: every request with " \
            "query_len <= decode_threshold (1) is a decode, context or not"

    rules["conv_state_layout"], rules["conv_state_layout_source"] = conv_layout(rel)

    jamba = rel.first("vllm/model_executor/models/jamba.py")
    mixer = rel.first("vllm/model_executor/layers/mamba/mamba_mixer.py")
    if jamba and "rms_norm_eps=config.rms_norm_eps" in rel.text(jamba):
        rules["norm_eps_from_config"] = True
        rules["norm_eps_from_config_source"] = f"{jamba}: MambaMixer(..., rms_norm_eps=config.rms_norm_eps) " \
                                               f"({mixer}: MambaMixer.__init__ rms_norm_eps)"
    elif mixer:
        rules["norm_eps_from_config"] = False
        rules["norm_eps_from_config_source"] = f"{mixer}: MambaMixer.__init__ default rms_norm_eps"
    else:
        rules["norm_eps_from_config"] = None
        rules["norm_eps_from_config_source"] = "no mamba_mixer.py"
    return rules


def cudagraph_facts(rel):
    path = rel.first("vllm/v1/worker/gpu_model_runner.py")
    if path is None:
        return None
    src = rel.text(path)
    facts = {"source": f"{path}: _prepare_inputs / _build_attention_metadata"}
    # Where the metadata's num_actual_tokens and slot_mapping come from.
    if "num_actual_tokens=num_tokens_padded" in src:
        facts["num_actual_tokens"] = "padded in FULL mode (num_tokens_padded when pad_attn); real otherwise"
        facts["full_mode_pads_metadata"] = True
        facts["padded_block_table_rows"] = -1 if "blk_table_tensor[num_reqs:num_reqs_padded].fill_(-1)" in src else None
    else:
        facts["num_actual_tokens"] = "the real (scheduled) token count"
        facts["full_mode_pads_metadata"] = False
        facts["padded_block_table_rows"] = None
    if re.search(r"slot_mapping\s*=\s*blk_table\.slot_mapping(?:\.gpu)?\[\s*:\s*total_num_scheduled_tokens\s*\]", src):
        facts["slot_mapping_len"] = "real token count (query, key, value stay padded to the graph size)"
        facts["piecewise_slot_mapping_sliced"] = True
    else:
        facts["slot_mapping_len"] = "padded token count in FULL mode (padding rows -1); real count otherwise"
        facts["piecewise_slot_mapping_sliced"] = "num_tokens_padded if pad_attn" not in src
    facts["slot_mapping_padding_value"] = -1 if re.search(r"slot_mapping[\w.]*\[[^\]]*\]\.fill_\(\s*-1\s*\)", src) else None
    facts["query_start_loc_padding"] = "repeats the last real offset (padding requests have query_len 0)" \
        if "query_start_loc.np[num_reqs + 1 :].fill(" in src or "query_start_loc_np[num_reqs + 1:].fill(" in src \
        else None
    return facts


def extract(root):
    rel = Release(root)
    contract = {"contract_kind": "vllm-release", "extracted_by": "datasets/capture/contracts/extract_vllm_contract.py"}
    contract.update(version_facts(rel))
    contract["engine"] = "vllm"
    contract["engine_version"] = f"vllm {contract['version']}"
    contract["triton"] = triton_facts(rel)
    contract["attention_layer"] = attention_layer_facts(rel)
    contract["cache_dtypes"] = cache_dtype_facts(rel)
    contract["kernels"] = kernel_facts(rel)
    contract["mamba1"] = mamba_facts(rel)
    contract["cudagraph"] = cudagraph_facts(rel)
    contract["engine_rules"] = engine_rules(rel, contract["mamba1"])
    return contract


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", help="directory holding vllm/ (an unpacked release)")
    parser.add_argument("-o", "--out", help="write the JSON here (default: stdout)")
    args = parser.parse_args(argv)
    try:
        contract = extract(args.release)
    except ContractError as e:
        print(f"extract_vllm_contract: {e}", file=sys.stderr)
        return 2
    text = json.dumps(contract, indent=1, sort_keys=False) + "\n"
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
