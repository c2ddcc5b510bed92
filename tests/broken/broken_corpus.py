#!/usr/bin/env python3
"""The broken-file corpus: malformed and hostile hybrid-batch files, each derived from a valid
shipped file by one documented edit, and the check that the real `hybridtb` CLI refuses each one
cleanly.

    broken_corpus.py list                          the case names, one a line (CMake reads this)
    broken_corpus.py describe                      name, source, edit and expected message of each
    broken_corpus.py generate OUTDIR [NAME...]     writes OUTDIR/<name>.h5 (the corpus itself)
    broken_corpus.py check NAME --cli HYBRIDTB --workdir DIR
                                                   generates one case and runs the CLI on it

Each case starts from a file of datasets/examples/ or datasets/recorded/ (valid, committed, and
regenerated bit for bit by their own tests), so the corpus is reproducible without committing
broken binaries. `check` runs every command the case names (`run`, `info`, `parity`, `record`,
`replay`) and asserts, for each:

- exit status 2 (bad input), never a signal, 0 or 1;
- stderr contains the case's expected substring (the field and the constraint it broke);
- stderr has no sanitizer report (`AddressSanitizer`, `runtime error:`, ...);
- no output is left behind: `run --out` and `record --out-dir` files do not exist, nor any
  `<out>.tmp-<pid>` file of the atomic writer; the `--report` of `parity`/`replay` is written and
  holds the file as an error entry (summary: 1 error, 0 passed, 0 failed).

A case with `expect_ok` is a positive control: the reader is deliberately liberal about unknown
items under a 1.x minor version (datasets/SCHEMA.md §2 and §7), so such a file must still run.

Needs python3 with h5py and numpy (Debian: python3-h5py). Run by CTest: `ctest -L broken`.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))

# Source files (valid, committed). Short names keep the case table readable.
SOURCES = {
    "mixed": "datasets/examples/mixed_swa_bf16.h5",              # bf16, decodes + prefills, window, no /expected
    "fp32": "datasets/examples/decode_cudagraph_padded_fp32.h5",  # float32, CUDA-graph padding rows/requests
    "gqa4": "datasets/recorded/mqa_gqa4.h5",                    # bf16, small, with /expected
    "int8": "datasets/recorded/kv_int8_per_token_head.h5",      # per-token-head scale caches, /expected
    "fp8": "datasets/recorded/kv_fp8_e4m3.h5",                  # fp8 cache (uint8 storage), /expected
    "enc": "datasets/recorded/encoder_only.h5",                 # encoder_only: no cache
    "mamba1": "datasets/recorded/ssm_mamba1_hymba.h5",          # SSM mamba1: pools, weights, ssm_block_table
    "psum": "datasets/recorded/ssm_prefix_sum.h5",              # SSM prefix_sum: one pool
    "spec": "datasets/recorded/spec_decode.h5",                 # num_accepted_tokens
    "mm": "datasets/recorded/mm_prefix.h5",                     # mm_prefix_range
    "pcall": "datasets/recorded/prefix_cache_all.h5",           # mamba_cache_mode all
}

ALL = ("run", "info", "parity", "record")   # every command that reads the whole file
RUNTIME = ("run", "parity", "record")       # errors found when the step runs (info does not run it)


class Case:
    def __init__(self, name, source, edit, expect, commands=ALL, why="", expect_ok=False):
        self.name, self.source, self.edit, self.expect = name, source, edit, expect
        self.commands, self.why, self.expect_ok = tuple(commands), why, expect_ok


CASES = []


def case(name, source, expect, commands=ALL, why="", expect_ok=False):
    """Registers the decorated edit function f(path) as a case."""
    def register(edit):
        CASES.append(Case(name, source, edit, expect, commands, why or (edit.__doc__ or "").strip(), expect_ok))
        return edit
    return register


# --- helpers -------------------------------------------------------------------------------------

def set_attr(obj_path, name, value):
    def edit(path):
        with h5py.File(path, "r+") as f:
            f[obj_path].attrs[name] = value
    edit.__doc__ = f"Attribute {obj_path.rstrip('/')}/{name} set to {value!r}."
    return edit


def del_item(item):
    def edit(path):
        with h5py.File(path, "r+") as f:
            if item.startswith("@"):
                del f.attrs[item[1:]]
            elif "@" in item:
                obj, attr = item.split("@")
                del f[obj].attrs[attr]
            else:
                del f[item]
    edit.__doc__ = f"{item} deleted."
    return edit


def replace(f, item, data, dtype_name=None):
    """Replaces dataset `item` with `data` (numpy), tagging dtype_name (None: no attribute)."""
    del f[item]
    d = f.create_dataset(item, data=data)
    if dtype_name is not None:
        d.attrs["dtype_name"] = dtype_name
    return d


def replace_same_type(f, item, shape):
    """Replaces dataset `item` with one of the same HDF5 type (bf16 included) and `shape`, zero bits."""
    old = f[item]
    tid = old.id.get_type()
    dtype_name = old.attrs.get("dtype_name")
    parent, name = item.rsplit("/", 1)
    del f[item]
    space = h5py.h5s.create_simple(tuple(shape))
    dsid = h5py.h5d.create(f[parent].id, name.encode(), tid, space)
    nbytes = int(np.prod(shape, dtype=np.int64)) * tid.get_size()
    if nbytes > 0:
        # Zero bits through an unsigned view of the same width, with the file type as memory type:
        # HDF5 converts nothing (it cannot convert to our bf16 type quickly, or at all from uint).
        raw = np.zeros(nbytes, dtype=np.uint8)
        view = raw.view({1: "<u1", 2: "<u2", 4: "<u4", 8: "<u8"}[tid.get_size()]).reshape(shape)
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, view, mtype=tid)
    d = h5py.Dataset(dsid)
    if dtype_name is not None:
        d.attrs["dtype_name"] = dtype_name
    return d


def edit_values(item, fn):
    """Rewrites dataset `item` in place with fn(values) (same dtype and shape)."""
    def edit(path):
        with h5py.File(path, "r+") as f:
            d = f[item]
            values = d[()]
            fn(values)
            d[...] = values
    edit.__doc__ = f"Values of /{item} edited in place (see the expected message)."
    return edit


def truncate_to(size_fn):
    def edit(path):
        size = size_fn(os.path.getsize(path))
        with open(path, "r+b") as fh:
            fh.truncate(size)
    return edit


# --- file level ----------------------------------------------------------------------------------

@case("not_hdf5", "mixed", "as an HDF5 file (truncated or not HDF5?)")
def _(path):
    """A text file with an .h5 name."""
    with open(path, "w") as fh:
        fh.write("this is not an HDF5 file\n" * 100)


@case("empty_file", "mixed", "as an HDF5 file (truncated or not HDF5?)")
def _(path):
    """A zero-byte file."""
    open(path, "w").close()


for _offset in (8, 96, 512, 4096):
    case(f"truncated_at_{_offset}", "mixed", "as an HDF5 file (truncated or not HDF5?)",
         why=f"Cut after {_offset} bytes (inside the superblock, the root group or the first objects).")(
        truncate_to(lambda size, o=_offset: o))
case("truncated_at_half", "mixed", "truncated", why="Cut in the middle of the raw data.")(
    truncate_to(lambda size: size // 2))
case("truncated_last_byte", "gqa4", "truncated", why="One byte missing at the end (the superblock's end-of-file address says more).")(
    truncate_to(lambda size: size - 1))


@case("hdf5_but_empty", "mixed", "missing attribute /schema")
def _(path):
    """A valid HDF5 file with nothing in it."""
    with h5py.File(path, "w"):
        pass


# --- schema --------------------------------------------------------------------------------------

case("schema_2_0", "mixed", "schema_version 2.0 is not supported: this build reads hybrid-batch 1.x")(
    set_attr("/", "schema_version", "2.0"))
case("schema_0_9", "mixed", "schema_version 0.9 is not supported")(set_attr("/", "schema_version", "0.9"))
case("schema_version_garbage", "mixed", "schema_version 'one.two' is not of the form <major>.<minor>")(
    set_attr("/", "schema_version", "one.two"))
case("schema_version_integer", "mixed", "attribute /schema_version: expected a string")(
    set_attr("/", "schema_version", np.int64(1)))
case("schema_wrong_name", "mixed", "root attribute schema is 'hybrid-batches', expected 'hybrid-batch'")(
    set_attr("/", "schema", "hybrid-batches"))
case("schema_missing", "mixed", "missing attribute /schema")(del_item("@schema"))
case("schema_version_missing", "mixed", "missing attribute /schema_version")(del_item("@schema_version"))


# --- missing required items ----------------------------------------------------------------------

for _group in ("config", "batch", "inputs"):
    case(f"missing_group_{_group}", "mixed", f"missing group /{_group}")(del_item(_group))
for _attr, _what in (("num_heads", "int"), ("sliding_window", "int, 0 = none"), ("scale", "float"),
                     ("dtype", ""), ("kv_cache_dtype", ""), ("ssm_mode", "")):
    case(f"missing_config_{_attr}", "mixed", f"missing attribute /config/{_attr}")(del_item(f"config@{_attr}"))
case("missing_num_actual_tokens", "mixed", "missing attribute /batch/num_actual_tokens")(
    del_item("batch@num_actual_tokens"))
for _ds in ("query_start_loc", "seq_lens", "block_table", "slot_mapping"):
    case(f"missing_batch_{_ds}", "mixed", f"missing dataset /batch/{_ds}")(del_item(f"batch/{_ds}"))
for _ds in ("query", "key", "value", "kv_cache"):
    case(f"missing_inputs_{_ds}", "mixed", f"missing dataset /inputs/{_ds}")(del_item(f"inputs/{_ds}"))
case("missing_k_scale_cache", "int8", "missing dataset /inputs/k_scale_cache (required with kv_cache_dtype int8_per_token_head")(
    del_item("inputs/k_scale_cache"))
case("missing_expected_output", "gqa4", "missing dataset /expected/output", commands=ALL + ("replay",))(
    del_item("expected/output"))
case("missing_expected_kv_cache", "gqa4", "missing dataset /expected/kv_cache", commands=ALL + ("replay",))(
    del_item("expected/kv_cache"))
case("expected_without_metadata_is_legal", "gqa4", "", commands=ALL + ("replay",), expect_ok=True,
     why="An engine's capture has no hybridtb builder metadata: /expected may lack it (replay then "
         "compares none).")(del_item("expected/metadata"))
case("missing_expected_metadata_scalar", "gqa4", "/expected/metadata: metadata field attention/max_seq_len is missing", commands=ALL + ("replay",))(
    del_item("expected/metadata/attention@max_seq_len"))
case("missing_expected_ssm_pool", "mamba1", "missing dataset /expected/ssm/conv_state", commands=ALL + ("replay",))(
    del_item("expected/ssm/conv_state"))
case("missing_mamba1_weight", "mamba1", "missing weight /weights/x_proj")(del_item("weights/x_proj"))
case("missing_mamba1_pool", "mamba1", "/expected/ssm/ssm_state: no state pool of that name in /inputs/ssm",
     why="/inputs/ssm/ssm_state deleted: /expected/ssm no longer matches the pools before the step.")(
    del_item("inputs/ssm/ssm_state"))


@case("missing_mamba1_pool_no_expected", "mamba1", "/inputs/ssm/ssm_state")
def _(path):
    """/inputs/ssm/ssm_state deleted and no /expected: the mode finds its pool missing."""
    with h5py.File(path, "r+") as f:
        del f["inputs/ssm/ssm_state"]
        del f["expected"]


# --- extra and contradictory items ---------------------------------------------------------------

@case("liberal_unknown_items", "gqa4", "", commands=("run", "info", "parity", "record", "replay"), expect_ok=True)
def _(path):
    """Positive control: unknown attributes, datasets and groups under a 1.x minor version are
    ignored (SCHEMA.md §2: newer minors only add optional items), so this file must still run."""
    with h5py.File(path, "r+") as f:
        f.attrs["schema_version"] = "1.7"
        f["config"].attrs["future_setting"] = 3
        f["batch"].create_dataset("future_array", data=np.arange(5, dtype="<i4"))
        f.create_group("future_group").attrs["x"] = "y"
        f["inputs"].create_dataset("future_tensor", data=np.zeros((2, 2), "<f4"))


@case("per_token_scales_for_per_tensor_dtype", "gqa4", "/inputs/k_scale_cache: present, but kv_cache_dtype auto is not a per-token-head mode")
def _(path):
    """A k_scale_cache (per-token-head scales) in a file whose kv_cache_dtype is auto."""
    with h5py.File(path, "r+") as f:
        nb = f["inputs/kv_cache"].shape[0]
        bs, hkv = int(f["config"].attrs["block_size"]), int(f["config"].attrs["num_kv_heads"])
        f["inputs"].create_dataset("k_scale_cache", data=np.ones((nb, bs, hkv), "<f4")).attrs["dtype_name"] = "float32"


@case("expected_output_wrong_shape", "gqa4", "/expected/output: shape [", commands=ALL + ("replay",))
def _(path):
    """/expected/output with one token row too few."""
    with h5py.File(path, "r+") as f:
        shape = list(f["expected/output"].shape)
        shape[0] -= 1
        replace(f, "expected/output", np.zeros(shape, "<f8"), "float64")


@case("expected_kv_cache_wrong_blocks", "gqa4", "/expected/kv_cache: shape [", commands=ALL + ("replay",))
def _(path):
    """/expected/kv_cache with a different num_blocks than /inputs/kv_cache."""
    with h5py.File(path, "r+") as f:
        shape = list(f["expected/kv_cache"].shape)
        shape[0] += 1
        replace_same_type(f, "expected/kv_cache", shape)


case("expected_unknown_metadata_field", "gqa4", "unknown metadata field attention/not_a_field",
     commands=ALL + ("replay",))(set_attr("expected/metadata/attention", "not_a_field", np.int64(1)))
case("expected_metadata_string_scalar", "gqa4", "attribute /expected/metadata/attention/max_seq_len: expected an integer",
     commands=ALL + ("replay",))(set_attr("expected/metadata/attention", "max_seq_len", "big"))


@case("expected_ssm_extra_pool", "mamba1", "/expected/ssm/extra_state: no state pool of that name in /inputs/ssm",
      commands=ALL + ("replay",))
def _(path):
    """A pool after the step that did not exist before it."""
    with h5py.File(path, "r+") as f:
        slots = f["inputs/ssm/conv_state"].shape[0]
        f["expected/ssm"].create_dataset("extra_state", data=np.zeros((slots, 4), "<f4")).attrs["dtype_name"] = "float32"


@case("ssm_pools_disagree_on_slots", "mamba1", "every state pool must hold the same slots")
def _(path):
    """/inputs/ssm/ssm_state with one slot more than conv_state."""
    with h5py.File(path, "r+") as f:
        shape = list(f["inputs/ssm/ssm_state"].shape)
        shape[0] += 1
        replace(f, "inputs/ssm/ssm_state", np.zeros(shape, "<f4"), "float32")


@case("expected_is_a_dataset", "gqa4", "/expected is not a group", commands=ALL + ("replay",))
def _(path):
    """/expected is a dataset instead of a group."""
    with h5py.File(path, "r+") as f:
        del f["expected"]
        f.create_dataset("expected", data=np.zeros(3, "<f4"))


@case("query_is_a_group", "mixed", "/inputs/query is a group, expected a dataset")
def _(path):
    with h5py.File(path, "r+") as f:
        del f["inputs/query"]
        f["inputs"].create_group("query")


@case("dangling_soft_link", "mixed", "/inputs/key is not a dataset (a dangling link")
def _(path):
    """/inputs/key is a soft link to nothing."""
    with h5py.File(path, "r+") as f:
        del f["inputs/key"]
        f["inputs/key"] = h5py.SoftLink("/nowhere")


@case("external_link", "mixed", "/inputs/key is not a dataset (a dangling link")
def _(path):
    """/inputs/key is an external link to a file that does not exist (must not be followed silently)."""
    with h5py.File(path, "r+") as f:
        del f["inputs/key"]
        f["inputs/key"] = h5py.ExternalLink("/nonexistent/elsewhere.h5", "/inputs/key")


@case("external_raw_storage", "fp32", "/inputs/query: its data lives outside this file")
def _(path):
    """/inputs/query whose raw data HDF5 would read from another file (here /etc/hostname): a batch
    file must be self-contained, and a hostile one must not make the reader read arbitrary files."""
    with h5py.File(path, "r+") as f:
        shape = f["inputs/query"].shape
        del f["inputs/query"]
        nbytes = int(np.prod(shape)) * 4
        f["inputs"].create_dataset("query", shape=shape, dtype="<f4",
                                   external=[("/etc/hostname", 0, nbytes)]).attrs["dtype_name"] = "float32"


@case("virtual_dataset", "fp32", "/inputs/key: its data lives outside this file")
def _(path):
    """/inputs/key as a virtual dataset mapping another file's dataset."""
    with h5py.File(path, "r+") as f:
        shape = f["inputs/key"].shape
        del f["inputs/key"]
        layout = h5py.VirtualLayout(shape=shape, dtype="<f4")
        layout[...] = h5py.VirtualSource("/nonexistent/other.h5", "inputs/key", shape=shape)
        f["inputs"].create_virtual_dataset("key", layout, fillvalue=0).attrs["dtype_name"] = "float32"


@case("compression_bomb", "fp32", "/inputs/kv_cache: ")
def _(path):
    """kv_cache replaced by a gzip-compressed dataset declaring 2^31 blocks with one chunk written:
    a few kilobytes that would expand to terabytes (unallocated chunks read as fill values)."""
    with h5py.File(path, "r+") as f:
        _, two, bs, hkv, d = f["inputs/kv_cache"].shape
        del f["inputs/kv_cache"]
        ds = f["inputs"].create_dataset("kv_cache", shape=(2 ** 31 - 1, two, bs, hkv, d), dtype="<f4",
                                        chunks=(1, two, bs, hkv, d), compression="gzip")
        ds[0] = np.ones((two, bs, hkv, d), "<f4")
        ds.attrs["dtype_name"] = "float32"


# --- wrong dtypes --------------------------------------------------------------------------------

@case("query_float64_for_bf16_config", "mixed", "/inputs/query: dtype float64 does not match /config dtype bfloat16")
def _(path):
    with h5py.File(path, "r+") as f:
        replace(f, "inputs/query", np.zeros(f["inputs/query"].shape, "<f8"), "float64")


@case("dtype_name_disagrees_with_storage", "fp32", "/inputs/key: dtype_name bfloat16 does not match its HDF5 storage float32")
def _(path):
    with h5py.File(path, "r+") as f:
        f["inputs/key"].attrs["dtype_name"] = "bfloat16"


case("dtype_name_unknown", "fp32", "float128", why="dtype_name names no dtype.")(
    set_attr("inputs/query", "dtype_name", "float128"))
case("fp8_cache_without_dtype_name", "fp8", "/inputs/kv_cache: uint8 storage is ambiguous")(
    del_item("inputs/kv_cache@dtype_name"))


@case("kv_cache_bf16_for_fp8_config", "fp8", "/inputs/kv_cache: dtype bfloat16 does not match the cache storage dtype float8_e4m3fn")
def _(path):
    with h5py.File(path, "r+") as f:
        shape = f["inputs/kv_cache"].shape
        tid = f["inputs/key"].id.get_type()   # the bf16 type of the inputs
        del f["inputs/kv_cache"]
        dsid = h5py.h5d.create(f["inputs"].id, b"kv_cache", tid, h5py.h5s.create_simple(shape))
        dsid.write(h5py.h5s.ALL, h5py.h5s.ALL, np.zeros(shape, "<u2"), mtype=tid)
        h5py.Dataset(dsid).attrs["dtype_name"] = "bfloat16"


@case("seq_lens_float", "mixed", "/batch/seq_lens: expected an integer dataset, found float")
def _(path):
    with h5py.File(path, "r+") as f:
        replace(f, "batch/seq_lens", f["batch/seq_lens"][()].astype("<f4"))


@case("query_start_loc_big_endian", "mixed", "/batch/query_start_loc: big-endian data is not supported")
def _(path):
    with h5py.File(path, "r+") as f:
        replace(f, "batch/query_start_loc", f["batch/query_start_loc"][()].astype(">i4"))


@case("query_strings", "fp32", "/inputs/query: unsupported HDF5 type")
def _(path):
    with h5py.File(path, "r+") as f:
        del f["inputs/query"]
        f["inputs"].create_dataset("query", data=np.array([b"abc", b"def"]))


@case("block_table_int64_overflow", "mixed", "/batch/block_table: value 8589934592 at index 0 does not fit int32")
def _(path):
    with h5py.File(path, "r+") as f:
        table = f["batch/block_table"][()].astype("<i8")
        table[0, 0] = 2 ** 33
        replace(f, "batch/block_table", table, "int64")


@case("slot_mapping_uint64_huge", "mixed", "/batch/slot_mapping: value 18446744073709551615 at index 0 does not fit int64")
def _(path):
    with h5py.File(path, "r+") as f:
        slots = f["batch/slot_mapping"][()].astype("<u8")
        slots[0] = 2 ** 64 - 1
        replace(f, "batch/slot_mapping", slots)


case("config_num_heads_string", "mixed", "attribute /config/num_heads: expected an integer, found string")(
    set_attr("config", "num_heads", "eight"))
case("config_num_heads_fraction", "mixed", "attribute /config/num_heads: expected an integer, found 8.5")(
    set_attr("config", "num_heads", 8.5))
case("config_dtype_float8", "mixed", "attribute /config/dtype must be float32, float16 or bfloat16")(
    set_attr("config", "dtype", "float8_e4m3fn"))
case("config_dtype_unknown", "mixed", "attribute /config/dtype")(set_attr("config", "dtype", "complex64"))
case("config_kv_cache_dtype_unknown", "mixed", "/config kv_cache_dtype: unknown value 'fp4'")(
    set_attr("config", "kv_cache_dtype", "fp4"))
case("config_attn_type_unknown", "mixed", "/config attn_type: unknown value 'cross'")(
    set_attr("config", "attn_type", "cross"))
case("config_cudagraph_mode_unknown", "mixed", "/config cudagraph_mode: unknown value 'always'")(
    set_attr("config", "cudagraph_mode", "always"))
case("config_use_alibi_sqrt_2", "mixed", "attribute /config/use_alibi_sqrt must be 0 or 1, got 2")(
    set_attr("config", "use_alibi_sqrt", np.int64(2)))


@case("ssm_pool_int32", "psum", "/inputs/ssm/state: dtype int32 is not allowed (state pools must be float64, float32, float16 or bfloat16)")
def _(path):
    with h5py.File(path, "r+") as f:
        replace(f, "inputs/ssm/state", np.zeros(f["inputs/ssm/state"].shape, "<i4"), "int32")


case("ssm_param_string", "mamba1", "attribute /config/ssm/state_size: expected an integer, found string")(
    set_attr("config/ssm", "state_size", "sixteen"))
case("ssm_mode_unknown", "gqa4", "unknown /config ssm_mode 'no_such_mode'", commands=RUNTIME + ("info",))(set_attr("config", "ssm_mode", "no_such_mode"))


# --- wrong ranks ---------------------------------------------------------------------------------

@case("query_rank_2", "fp32", "/inputs/query: shape [")
def _(path):
    with h5py.File(path, "r+") as f:
        t, h, d = f["inputs/query"].shape
        replace(f, "inputs/query", np.zeros((t, h * d), "<f4"), "float32")


@case("query_start_loc_rank_2", "mixed", "/batch/query_start_loc: shape [")
def _(path):
    with h5py.File(path, "r+") as f:
        replace(f, "batch/query_start_loc", f["batch/query_start_loc"][()].reshape(2, -1), "int32")


@case("block_table_rank_1", "mixed", "/batch/block_table: shape [")
def _(path):
    with h5py.File(path, "r+") as f:
        replace(f, "batch/block_table", f["batch/block_table"][()].reshape(-1), "int32")


@case("kv_cache_rank_4", "fp32", "/inputs/kv_cache: shape [")
def _(path):
    with h5py.File(path, "r+") as f:
        nb, two, bs, hkv, d = f["inputs/kv_cache"].shape
        replace(f, "inputs/kv_cache", np.zeros((nb, two, bs, hkv * d), "<f4"), "float32")


@case("kv_scale_not_scalar", "mixed", "/inputs/k_scale: expected a scalar (0-d or [1]), found shape [2]")
def _(path):
    with h5py.File(path, "r+") as f:
        replace(f, "inputs/k_scale", np.ones(2, "<f4"), "float32")


case("config_attribute_array", "mixed", "attribute /config/num_heads: expected a single value, found 2 values")(
    set_attr("config", "num_heads", np.array([8, 8], "<i8")))


@case("ssm_pool_scalar", "psum", "/inputs/ssm/state: shape [] (a scalar) is not allowed")
def _(path):
    with h5py.File(path, "r+") as f:
        replace(f, "inputs/ssm/state", np.float32(0), "float32")


@case("query_null_dataspace", "fp32", "/inputs/query: dataset has no elements (null dataspace)")
def _(path):
    with h5py.File(path, "r+") as f:
        del f["inputs/query"]
        f["inputs"].create_dataset("query", data=h5py.Empty("<f4")).attrs["dtype_name"] = "float32"


@case("mamba1_weight_wrong_shape", "mamba1", "/weights/x_proj")
def _(path):
    with h5py.File(path, "r+") as f:
        rows, cols = f["weights/x_proj"].shape
        replace(f, "weights/x_proj", np.zeros((rows + 1, cols), "<f4"), "float32")


# --- negative values -----------------------------------------------------------------------------

for _attr, _value, _expect in (
        ("num_heads", -8, "/config num_heads must be > 0, got -8"),
        ("num_kv_heads", 0, "/config num_kv_heads must be > 0, got 0"),
        ("head_size", -128, "/config head_size must be >= 32"),
        ("block_size", -16, "/config block_size must be a positive multiple of 16, got -16"),
        ("sliding_window", -1, "/config sliding_window must be >= 0"),
        ("mamba_block_size", -512, "/config mamba_block_size must be >= 0"),
        ("num_speculative_tokens", -1, "/config num_speculative_tokens must be >= 0"),
        ("max_num_seqs", 0, "/config max_num_seqs must be > 0")):
    case(f"negative_config_{_attr}", "mixed", _expect)(set_attr("config", _attr, np.int64(_value)))
case("negative_scale", "mixed", "/config scale must be finite and > 0")(set_attr("config", "scale", -0.1))
case("nan_scale", "mixed", "/config scale must be finite and > 0")(set_attr("config", "scale", float("nan")))
case("negative_soft_cap", "mixed", "/config logits_soft_cap must be >= 0")(set_attr("config", "logits_soft_cap", -1.0))
case("negative_num_actual_tokens", "mixed", "/batch num_actual_tokens (-1) must be in [0, T = 91]")(
    set_attr("batch", "num_actual_tokens", np.int64(-1)))


@case("negative_seq_len", "mixed", "/batch/seq_lens[0] = -5 is smaller than the request's query_len 1")
def _(path):
    edit_values("batch/seq_lens", lambda v: v.__setitem__(0, -5))(path)


@case("negative_capture_size", "mixed", "/config/cudagraph_capture_sizes entries must be > 0, got -8")
def _(path):
    edit_values("config/cudagraph_capture_sizes", lambda v: v.__setitem__(0, -8))(path)


@case("negative_k_scale", "fp8", "/inputs/k_scale must be finite and > 0")
def _(path):
    with h5py.File(path, "r+") as f:
        f["inputs/k_scale"][()] = np.float32(-1)


@case("zero_v_scale_attribute", "fp8", "/inputs/v_scale must be finite and > 0, got 0")
def _(path):
    """v_scale as an attribute of /inputs (accepted form), with value 0."""
    with h5py.File(path, "r+") as f:
        del f["inputs/v_scale"]
        f["inputs"].attrs["v_scale"] = 0.0


@case("nan_sinks", "mixed", "/config/sinks must be finite")
def _(path):
    with h5py.File(path, "r+") as f:
        h = int(f["config"].attrs["num_heads"])
        sinks = np.zeros(h, "<f4")
        sinks[1] = np.nan
        f["config"].create_dataset("sinks", data=sinks).attrs["dtype_name"] = "float32"


@case("alibi_slopes_wrong_length", "mixed", "/config/alibi_slopes: shape [3] does not match [num_heads=8]")
def _(path):
    with h5py.File(path, "r+") as f:
        f["config"].create_dataset("alibi_slopes", data=np.ones(3, "<f4")).attrs["dtype_name"] = "float32"


# --- huge sizes ----------------------------------------------------------------------------------

def unallocated_like(f, item, shape, chunks=None):
    """Replaces `item` with a dataset of the same type and a huge `shape` whose data is never
    written: HDF5 stores nothing and would hand out fill values, so a naive reader allocates the
    whole declared size."""
    old = f[item]
    tid = old.id.get_type()
    dtype_name = old.attrs.get("dtype_name")
    parent, name = item.rsplit("/", 1)
    del f[item]
    dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
    if chunks:
        dcpl.set_chunk(tuple(chunks))
    space = h5py.h5s.create_simple(tuple(shape), tuple(shape))
    d = h5py.Dataset(h5py.h5d.create(f[parent].id, name.encode(), tid, space, dcpl=dcpl))
    if dtype_name is not None:
        d.attrs["dtype_name"] = dtype_name


@case("huge_num_blocks_unwritten", "fp32", "/inputs/kv_cache: the file stores 0 of its ")
def _(path):
    """kv_cache declares num_blocks = 2^31 - 1 (2 TiB) in chunked storage that holds nothing."""
    with h5py.File(path, "r+") as f:
        _, two, bs, hkv, d = f["inputs/kv_cache"].shape
        unallocated_like(f, "inputs/kv_cache", (2 ** 31 - 1, two, bs, hkv, d), chunks=(1, two, bs, hkv, d))


@case("huge_token_count_unwritten", "fp32", "/batch/slot_mapping: the file stores 0 of its 549755813888 bytes")
def _(path):
    """slot_mapping declares T = 2^36 token rows (512 GiB of int64) in chunked storage that holds
    nothing."""
    with h5py.File(path, "r+") as f:
        unallocated_like(f, "batch/slot_mapping", (2 ** 36,), chunks=(1024,))


@case("shape_product_overflows", "psum", "/weights/huge: shape [2147483648, 2147483648, 2147483648] is too large")
def _(path):
    """A weight of shape [2^31, 2^31, 2^31] (weights have free shapes): the element count overflows int64."""
    with h5py.File(path, "r+") as f:
        big = 2 ** 31
        f.create_group("weights")
        f["weights"].create_dataset("huge", data=np.zeros(1, "<f4"))
        unallocated_like(f, "weights/huge", (big, big, big), chunks=(1, 1, 1))


@case("block_table_columns_overflow", "mixed", "/batch/block_table: shape [5, 4611686018427387903] is too large")
def _(path):
    """A block table with 2^62 − 1 columns (max_blocks is a free dimension)."""
    with h5py.File(path, "r+") as f:
        unallocated_like(f, "batch/block_table", (5, 2 ** 62 - 1), chunks=(1, 1024))


@case("seq_len_near_int32_max", "mixed", "/batch/block_table has 13 columns but request 0 needs")
def _(path):
    edit_values("batch/seq_lens", lambda v: v.__setitem__(0, 2 ** 31 - 1))(path)


@case("query_start_loc_near_int32_max", "mixed", "/batch/query_start_loc")
def _(path):
    edit_values("batch/query_start_loc", lambda v: v.__setitem__(slice(1, None), 2 ** 31 - 1))(path)


case("num_heads_near_int32_max", "mixed", "/config num_heads (2147483647) must be a multiple of num_kv_heads")(
    set_attr("config", "num_heads", np.int64(2 ** 31 - 1)))
case("num_heads_huge", "mixed", "attribute /config/num_heads: value 4611686018427387904 does not fit int32")(set_attr("config", "num_heads", np.int64(2 ** 62)))
case("block_size_huge", "mixed", "attribute /config/block_size: value 1099511627776 does not fit int32")(set_attr("config", "block_size", np.int64(2 ** 40)))
case("num_actual_tokens_huge", "mixed", "/batch num_actual_tokens (")(
    set_attr("batch", "num_actual_tokens", np.int64(2 ** 62)))
case("sliding_window_huge", "mixed", "attribute /config/sliding_window: value 4611686018427387904 does not fit int32")(set_attr("config", "sliding_window", np.int64(2 ** 62)))
case("mamba_block_size_huge", "pcall", "attribute /config/mamba_block_size: value 4611686018427387904 does not fit int32")(
    set_attr("config", "mamba_block_size", np.int64(2 ** 62)))
case("max_num_seqs_huge", "mixed", "attribute /config/max_num_seqs: value 4294967296 does not fit int32")(
    set_attr("config", "max_num_seqs", np.int64(2 ** 32)))


@case("empty_batch_huge_heads", "fp32", "attribute /config/num_heads: value 4398046511104 does not fit int32")
def _(path):
    """A batch of zero tokens and zero requests whose num_heads is huge: no tensor shape bounds it."""
    with h5py.File(path, "r+") as f:
        hkv, d = f["inputs/key"].shape[1:]
        f["config"].attrs["num_heads"] = np.int64(hkv * 2 ** 40)
        f["batch"].attrs["num_actual_tokens"] = np.int64(0)
        replace(f, "batch/query_start_loc", np.zeros(1, "<i4"), "int32")
        replace(f, "batch/seq_lens", np.zeros(0, "<i4"), "int32")
        replace(f, "batch/block_table", np.zeros((0, 4), "<i4"), "int32")
        replace(f, "batch/slot_mapping", np.zeros(0, "<i8"), "int64")
        unallocated_like(f, "inputs/query", (0, hkv * 2 ** 40, d))
        for name in ("key", "value"):
            replace(f, f"inputs/{name}", np.zeros((0, hkv, d), "<f4"), "float32")


# --- indices out of range ------------------------------------------------------------------------

def mixed_entry(fn):
    return lambda path: edit_values("batch/block_table", fn)(path)


case("block_table_entry_negative", "mixed", "/batch/block_table[0, 0] = -3 is not a block of the KV cache [0, 41)")(
    mixed_entry(lambda v: v.__setitem__((0, 0), -3)))
case("block_table_entry_past_cache", "mixed", "/batch/block_table[0, 0] = 41 is not a block of the KV cache [0, 41)")(
    mixed_entry(lambda v: v.__setitem__((0, 0), 41)))
case("block_table_entry_int32_max", "mixed", "is not a block of the KV cache [0, 41)")(
    mixed_entry(lambda v: v.__setitem__((0, 12), 2 ** 31 - 1)))
case("slot_mapping_out_of_range", "mixed", "/batch/slot_mapping[0] = 1000000000000 but request 0 position")(
    edit_values("batch/slot_mapping", lambda v: v.__setitem__(0, 10 ** 12)))
case("slot_mapping_negative_real_row", "mixed", "/batch/slot_mapping[5] = -1 but request")(
    edit_values("batch/slot_mapping", lambda v: v.__setitem__(5, -1)))
case("padding_row_with_a_slot", "fp32", "is a CUDA-graph padding row")(
    edit_values("batch/slot_mapping", lambda v: v.__setitem__(len(v) - 1, 17)))
case("query_start_loc_not_monotonic", "mixed", "/batch/query_start_loc must be non-decreasing: [2] = 2 > [3] = 1")(
    edit_values("batch/query_start_loc", lambda v: v.__setitem__(3, 1)))
case("query_start_loc_not_from_zero", "mixed", "/batch/query_start_loc[0] must be 0, got 1")(
    edit_values("batch/query_start_loc", lambda v: v.__setitem__(0, 1)))
case("query_start_loc_end_mismatch", "mixed", "must equal num_actual_tokens (90)")(
    set_attr("batch", "num_actual_tokens", np.int64(90)))
case("seq_len_below_query_len", "mixed", "/batch/seq_lens[4] = 39 is smaller than the request's query_len 40")(
    edit_values("batch/seq_lens", lambda v: v.__setitem__(4, 39)))
@case("padding_request_not_trailing", "fp32", "request 1 has tokens but follows a padding request")
def _(path):
    """Request 0 made a padding request (query_len 0, seq_len 0) in front of real requests."""
    edit_values("batch/query_start_loc", lambda v: v.__setitem__(1, 0))(path)
    edit_values("batch/seq_lens", lambda v: v.__setitem__(0, 0))(path)
case("ssm_state_index_past_pool", "psum", "is outside the SSM state pools'", commands=RUNTIME + ("replay",))(
    edit_values("batch/ssm_block_table", lambda v: v.__setitem__((0, 0), 1000)))
case("ssm_state_index_negative", "psum", "/batch/ssm_block_table[0, 0] = -7 is negative", commands=ALL + ("replay",))(
    edit_values("batch/ssm_block_table", lambda v: v.__setitem__((0, 0), -7)))
case("ssm_state_index_int32_max", "mamba1", "is outside the SSM state pools'", commands=RUNTIME + ("replay",))(
    edit_values("batch/ssm_block_table", lambda v: v.__setitem__((2, 0), 2 ** 31 - 1)))


@case("ssm_block_table_no_columns", "psum", "the SSM state block table has 0 columns", commands=RUNTIME + ("replay",))
def _(path):
    """An SSM block table with zero columns: no state slot for anyone."""
    with h5py.File(path, "r+") as f:
        r = f["batch/ssm_block_table"].shape[0]
        replace(f, "batch/ssm_block_table", np.zeros((r, 0), "<i4"), "int32")


case("num_accepted_tokens_too_many", "spec", "/batch/num_accepted_tokens[0] = 1000 must be in [0, max(1 + num_speculative_tokens, query_len) = 3]", commands=ALL + ("replay",))(
    edit_values("batch/num_accepted_tokens", lambda v: v.__setitem__(0, 1000)))
case("num_accepted_tokens_negative", "spec", "/batch/num_accepted_tokens[0] = -1 must be in [0, max(1 + num_speculative_tokens, query_len) = 3]", commands=ALL + ("replay",))(
    edit_values("batch/num_accepted_tokens", lambda v: v.__setitem__(0, -1)))
case("mm_prefix_range_negative", "mm", "/batch/mm_prefix_range entries must be >= 0")(
    edit_values("batch/mm_prefix_range", lambda v: v.__setitem__((0, 0, 0), -4)))


@case("mm_prefix_range_past_seq_len_is_legal", "mm", "", commands=("run", "info", "parity"), expect_ok=True)
def _(path):
    """Positive control: a bidirectional range reaching far past the request's seq_len is legal (a
    chunked prefill stops inside an image whose placeholder range runs on); keys at or past seq_len
    are never visible, so the block table is never read past it."""
    edit_values("batch/mm_prefix_range", lambda v: v.__setitem__((1, 0), (0, 2 ** 31 - 1)))(path)


@case("decode_after_prefill", "mamba1", "comes after request 0 (query_len 20, a prefill)", commands=RUNTIME)
def _(path):
    """Requests out of vLLM's decode-first order (the Mamba builder needs decodes first): a
    prefill moved before the decodes, everything else consistent."""
    with h5py.File(path, "r+") as f:
        # Swap request 0 (a decode at context 100) and request 3 (a fresh prefill of 20).
        qsl = f["batch/query_start_loc"][()]
        lens = np.diff(qsl)
        order = [3, 1, 2, 0]
        rows = [np.arange(qsl[r], qsl[r + 1]) for r in order]
        perm = np.concatenate(rows)
        new_qsl = np.concatenate([[0], np.cumsum(lens[order])]).astype("<i4")
        f["batch/query_start_loc"][...] = new_qsl
        for name in ("seq_lens",):
            f[f"batch/{name}"][...] = f[f"batch/{name}"][()][order]
        for name in ("block_table", "ssm_block_table"):
            f[f"batch/{name}"][...] = f[f"batch/{name}"][()][order]
        f["batch/slot_mapping"][...] = f["batch/slot_mapping"][()][perm]
        for name in ("query", "key", "value"):
            d = f[f"inputs/{name}"]
            tid = d.id.get_type()
            raw = np.empty(d.shape, "<u2")
            d.id.read(h5py.h5s.ALL, h5py.h5s.ALL, raw, mtype=tid)
            d.id.write(h5py.h5s.ALL, h5py.h5s.ALL, np.ascontiguousarray(raw[perm]), mtype=tid)
        del f["expected"]


# --- inconsistent config -------------------------------------------------------------------------

case("heads_not_divisible", "mixed", "/config num_heads (8) must be a multiple of num_kv_heads (3)")(
    set_attr("config", "num_kv_heads", np.int64(3)))
case("head_size_mismatch", "mixed", "/inputs/query: shape [91, 8, 128] does not match [T=91, num_heads=8, head_size=64]")(
    set_attr("config", "head_size", np.int64(64)))
case("num_kv_heads_mismatch", "mixed", "/inputs/key: shape [91, 2, 128] does not match [T=91, num_kv_heads=4, head_size=128]")(
    set_attr("config", "num_kv_heads", np.int64(4)))
case("block_size_mismatch", "mixed", "/inputs/kv_cache: shape [41, 2, 16, 2, 128] does not match")(
    set_attr("config", "block_size", np.int64(32)))
case("dtype_mismatch", "mixed", "/inputs/query: dtype bfloat16 does not match /config dtype float16")(
    set_attr("config", "dtype", "float16"))
case("encoder_only_with_fp8_cache", "enc", "is not supported with attn_type encoder_only")(
    set_attr("config", "kv_cache_dtype", "fp8_e4m3"))
case("encoder_only_with_context", "enc", "must equal query_len 20 for attn_type encoder_only")(
    edit_values("batch/seq_lens", lambda v: v.__setitem__(0, 25)))
case("mamba_cache_all_without_block_size", "pcall", "/config mamba_block_size must be > 0 with mamba_cache_mode all")(
    set_attr("config", "mamba_block_size", np.int64(0)))
case("encoder_only_with_ssm", "enc", "is not supported with attn_type encoder_only")(
    set_attr("config", "ssm_mode", "zero"))
case("mamba1_param_mismatch", "mamba1", "/weights/x_proj: shape [40, 64] does not match [42, 64]", commands=ALL)(
    set_attr("config/ssm", "state_size", np.int64(17)))
case("mamba1_param_negative", "mamba1", "/config/ssm state_size must be > 0, got -16", commands=ALL)(
    set_attr("config/ssm", "state_size", np.int64(-16)))
case("mamba1_param_huge", "mamba1", "attribute /config/ssm/state_size: value 4611686018427387904 does not fit int32", commands=ALL)(
    set_attr("config/ssm", "state_size", np.int64(2 ** 62)))


# --- schema 1.3: engine version, norm eps, fp8 query ------------------------------------------------

case("unknown_engine_version", "gqa4",
     "/config engine_version: unknown value 'vllm 0.9.2' (supported: vllm 0.10.1.1 | vllm 0.11.0 | vllm 0.12.0 | vllm 0.33.0")(
    set_attr("config", "engine_version", "vllm 0.9.2"))
case("engine_version_without_the_mode", "pcall",
     "/config mamba_cache_mode 'all' does not exist in engine_version vllm 0.33.0 (its modes: align | none)")(
    set_attr("config", "engine_version", "vllm 0.33.0"))
case("norm_eps_without_engine_version", "gqa4", "/config norm_eps needs an engine_version")(
    set_attr("config", "norm_eps", 1e-5))


@case("norm_eps_negative_versioned", "gqa4", "/config norm_eps must be finite and > 0, got -1")
def _(path):
    """engine_version vllm 0.33.0 with norm_eps -1."""
    with h5py.File(path, "r+") as f:
        f["config"].attrs["engine_version"] = "vllm 0.33.0"
        f["config"].attrs["norm_eps"] = -1.0


@case("q_scale_with_bf16_query", "gqa4", "/inputs/q_scale is present, but /inputs/query is bfloat16")
def _(path):
    """A 0-d float32 /inputs/q_scale beside the bfloat16 query."""
    with h5py.File(path, "r+") as f:
        f["inputs"].create_dataset("q_scale", data=np.float32(0.5)).attrs["dtype_name"] = "float32"


@case("fp8_query_without_q_scale", "fp8", "/inputs/query is float8_e4m3fn but /inputs/q_scale is missing")
def _(path):
    """The query replaced by fp8 bytes (uint8, dtype_name float8_e4m3fn), no q_scale."""
    with h5py.File(path, "r+") as f:
        replace(f, "inputs/query", np.full(f["inputs/query"].shape, 0x38, "<u1"), "float8_e4m3fn")


@case("fp8_query_with_int8_cache", "int8", "an fp8 query needs a per-tensor fp8 KV cache")
def _(path):
    """An fp8 query with its q_scale beside the int8 per-token-head cache (vLLM passes no q_descale there)."""
    with h5py.File(path, "r+") as f:
        replace(f, "inputs/query", np.full(f["inputs/query"].shape, 0x38, "<u1"), "float8_e4m3fn")
        f["inputs"].create_dataset("q_scale", data=np.float32(0.5)).attrs["dtype_name"] = "float32"


# --- driver ---------------------------------------------------------------------------------------

SANITIZER_MARKERS = ("AddressSanitizer", "UndefinedBehaviorSanitizer", "LeakSanitizer", "runtime error:",
                     "Segmentation fault", "terminate called", "internal error")


def find(name):
    for c in CASES:
        if c.name == name:
            return c
    sys.exit(f"broken_corpus.py: no case named '{name}' (see `broken_corpus.py list`)")


def generate(c, path):
    src = os.path.join(ROOT, SOURCES[c.source])
    shutil.copyfile(src, path)
    os.chmod(path, 0o644)
    c.edit(path)


def leftovers(directory, stem):
    return sorted(n for n in os.listdir(directory) if n.startswith(stem))


def report_problems(report, path):
    """What is wrong with the --report of a run on one bad file: it must list that file as an error
    entry, count it under summary.errors, and count nothing as passed or failed."""
    try:
        with open(report) as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        return [f"--report unreadable: {e}"]
    cases = doc.get("cases", [])
    if len(cases) != 1 or cases[0].get("file") != path or not cases[0].get("error"):
        return [f"--report does not hold the file as an error entry: {cases}"]
    summary = doc.get("summary", {})
    if (summary.get("errors"), summary.get("passed"), summary.get("failed")) != (1, 0, 0):
        return [f"--report summary {summary}, expected 1 error, 0 passed, 0 failed"]
    return []


def check(c, cli, workdir):
    shutil.rmtree(workdir, ignore_errors=True)
    os.makedirs(workdir)
    path = os.path.join(workdir, c.name + ".h5")
    generate(c, path)
    failures = []
    for command in c.commands:
        out = os.path.join(workdir, "out")
        os.makedirs(out, exist_ok=True)
        report = os.path.join(out, "report.json")
        argv = {
            "run": [cli, "run", "--quiet", "--batch", path, "--out", os.path.join(out, "run.h5")],
            "info": [cli, "info", path],
            "parity": [cli, "parity", "--quiet", "--backend", "reference", "--against", "reference", path,
                       "--report", report],
            "record": [cli, "record", "--quiet", path, "--out-dir", out],
            "replay": [cli, "replay", "--quiet", "--backend", "reference", path, "--report", report],
        }[command]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=120)
            code, stderr, stdout = p.returncode, p.stderr, p.stdout
        except subprocess.TimeoutExpired:
            code, stderr, stdout = "timeout", "", ""
        shown = " ".join(argv[1:2]) + " " + os.path.basename(path)
        problems = []
        want = 0 if c.expect_ok else 2
        if code != want:
            problems.append(f"exit status {code}, expected {want}")
        if not c.expect_ok and c.expect not in stderr:
            problems.append(f"stderr lacks {c.expect!r}")
        for marker in SANITIZER_MARKERS:
            if marker in stderr:
                problems.append(f"stderr has {marker!r}")
        left = leftovers(out, "") if not c.expect_ok else []
        if command in ("parity", "replay") and not c.expect_ok:
            # The report is written whatever the verdict: it must hold the file as an error entry.
            if "report.json" in left:
                left.remove("report.json")
                problems += report_problems(report, path)
            else:
                problems.append("no --report written")
        if left:
            problems.append(f"left output behind: {left}")
        if problems:
            failures.append(f"{shown}: " + "; ".join(problems) + "\n  stdout: " + stdout[-1500:].replace("\n", "\n          ") +
                            "\n  stderr: " + stderr[-3000:].replace("\n", "\n          "))
        else:
            first = next((line for line in stderr.splitlines() if c.expect and c.expect in line), "")
            print(f"ok   {shown}: exit {code}" + (f": {first.strip()[:200]}" if first else ""))
        shutil.rmtree(out, ignore_errors=True)
    for f in failures:
        print("FAIL " + f)
    if not failures:
        shutil.rmtree(workdir, ignore_errors=True)  # a failing case's file stays for inspection
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    sub.add_parser("list")
    sub.add_parser("describe")
    g = sub.add_parser("generate")
    g.add_argument("outdir")
    g.add_argument("names", nargs="*")
    k = sub.add_parser("check")
    k.add_argument("name")
    k.add_argument("--cli", required=True)
    k.add_argument("--workdir", required=True)
    args = parser.parse_args()
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names), "duplicate case names"
    if args.what == "list":
        print("\n".join(names))
    elif args.what == "describe":
        for c in CASES:
            print(f"{c.name}  [{c.source}: {SOURCES[c.source]}]  {'runs' if c.expect_ok else repr(c.expect)}"
                  f"  ({', '.join(c.commands)})\n    {c.why}")
    elif args.what == "generate":
        os.makedirs(args.outdir, exist_ok=True)
        for c in (find(n) for n in args.names) if args.names else CASES:
            generate(c, os.path.join(args.outdir, c.name + ".h5"))
        print(f"wrote {len(args.names) or len(CASES)} files to {args.outdir}")
    else:
        return check(find(args.name), os.path.abspath(args.cli), os.path.abspath(args.workdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
