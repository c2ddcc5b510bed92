"""Read, print and check hybrid-batch files with h5py + numpy, lazily.

`open_batch(path)` opens a file without reading any tensor: `batch["inputs/kv_cache"]` is a
`LazyTensor` over the h5py dataset, decoded only for the part indexed (`t[0:4]`, `t[...]`;
fp8 bytes become float32 values, bfloat16 arrives as float32 from h5py itself; `t.raw[...]` gives
the stored values). `check(f)` verifies the root attributes, the required items and their shapes
against /config, the generic rules of the SSM branch of schema 1.1 (/config/ssm, /inputs/ssm,
/weights, ssm_output, the pools after the step), the linear-attention layers of 1.2 (/config
layer_kind, their own inputs and output) and the tensor-parallel rank files of 1.4 (/config tp_size,
tp_rank, /inputs/ssm_hidden), as datasets/SCHEMA.md states them, and reads every
dataset to prove it readable in blocks of at most BLOCK_BYTES, so memory stays bounded whatever
the file's size (a 1 GiB KV cache is never loaded whole). The hybridtb tests run it on files
written by the C++ writer.

    python3 -m hybridtb_h5.reader FILE [--check] [--stats]
"""
import argparse
import sys

import h5py
import numpy as np

SSM_FLOATS = ("float64", "float32", "float16", "bfloat16")
FP8_QUERY = ("float8_e4m3fn", "float8_e5m2")
FLOATS = SSM_FLOATS + ("float8_e4m3fn", "float8_e5m2")
# vLLM's "fp8" is its platform fp8, float8_e4m3fn on CUDA; hybridtb's reader accepts it as "fp8_e4m3".
KV_STORAGE = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_per_token_head": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2",
              "int8_per_token_head": "int8"}


BLOCK_BYTES = 64 << 20  # the most one read of check()/describe(stats=True) holds


def text(value):
    return value.decode() if isinstance(value, bytes) else str(value)


def _fp8_table(name):
    """float32 value of each of the 256 fp8 bytes (e4m3fn: no infinities, 0x7F/0xFF NaN; e5m2: IEEE-like)."""
    bits = np.arange(256, dtype=np.uint32)
    sign = np.where(bits & 0x80, -1.0, 1.0)
    if name == "float8_e4m3fn":
        exponent, mantissa, bias, mbits = (bits >> 3) & 0xF, bits & 0x7, 7, 3
    else:
        exponent, mantissa, bias, mbits = (bits >> 2) & 0x1F, bits & 0x3, 15, 2
    normal = (1.0 + mantissa / (1 << mbits)) * np.power(2.0, exponent.astype(np.float64) - bias)
    subnormal = (mantissa / (1 << mbits)) * 2.0 ** (1 - bias)
    values = sign * np.where(exponent == 0, subnormal, normal)
    if name == "float8_e4m3fn":
        values[(bits & 0x7F) == 0x7F] = np.nan
    else:
        top = exponent == 0x1F
        values[top & (mantissa == 0)] = sign[top & (mantissa == 0)] * np.inf
        values[top & (mantissa != 0)] = np.nan
    return values.astype(np.float32)


FP8_TABLES = {name: _fp8_table(name) for name in ("float8_e4m3fn", "float8_e5m2")}


def _stored_rows(dataset, start, stop):
    """Rows [start, stop) of a numeric dataset exactly as stored (no HDF5 type conversion, which is
    slow for the schema's custom 2-byte bfloat16: ~10 MB/s against GB/s for the raw bytes), as
    unsigned integers of the element's size; None for anything else (scalars, strings, odd sizes)."""
    file_type = dataset.id.get_type()
    raw = {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8"}.get(file_type.get_size())
    if dataset.shape is None or len(dataset.shape) == 0 or raw is None or \
            file_type.get_class() not in (h5py.h5t.INTEGER, h5py.h5t.FLOAT):
        return None
    shape = (stop - start,) + tuple(dataset.shape[1:])
    buffer = np.empty(shape, dtype=raw)
    if buffer.size == 0:
        return buffer
    file_space = dataset.id.get_space()
    file_space.select_hyperslab((start,) + (0,) * (len(shape) - 1), shape)
    dataset.id.read(h5py.h5s.create_simple(shape), file_space, buffer, mtype=file_type)
    return buffer


def _rows_of(key, rows):
    """(start, stop, squeeze, rest) when `key` selects a contiguous run of first-axis rows
    (an int, a slice of step 1, (), ..., or a tuple starting with one of those); else None."""
    first, rest = (key[0], tuple(key[1:])) if isinstance(key, tuple) and key else (key, ())
    if first is Ellipsis or (isinstance(key, tuple) and not key):
        return (0, rows, False, ()) if not rest else None
    if any(part is Ellipsis for part in rest):
        return None
    if isinstance(first, (int, np.integer)):
        index = int(first) + rows if first < 0 else int(first)
        if not 0 <= index < rows:
            raise IndexError(f"index {int(first)} is out of range for {rows} rows")
        return index, index + 1, True, rest
    if isinstance(first, slice) and first.step in (None, 1):
        start, stop, _ = first.indices(rows)
        return start, max(start, stop), False, rest
    return None


class LazyTensor:
    """One tensor of a batch file, read only where indexed.

    `t[key]` decodes the selected part (numpy indexing on the first axes, as h5py allows): fp8
    bytes become their float32 values, bfloat16 (stored as the 2-byte float or as raw bits) exact
    float32 values, float16 bits float16; everything else arrives as h5py reads it. Row ranges of
    bfloat16 are read as raw bits and widened in numpy, far faster than HDF5's own conversion.
    `t.raw` is the h5py dataset itself (stored values, lazily). `t.blocks()` yields (start_row,
    decoded rows) slabs of at most `max_bytes` stored bytes."""

    def __init__(self, dataset):
        self.raw = dataset
        self.dtype_name = text(dataset.attrs.get("dtype_name", ""))

    @property
    def shape(self):
        return () if self.raw.shape is None else tuple(self.raw.shape)

    @property
    def nbytes(self):
        """Bytes as stored (bfloat16: 2 per element, though it decodes to 4)."""
        return int(np.prod(self.shape, dtype=np.int64)) * self.raw.id.get_type().get_size()

    def _decode(self, stored):
        table = FP8_TABLES.get(self.dtype_name)
        if table is not None:
            return table[stored]
        if self.dtype_name == "bfloat16" and stored.dtype.kind in "ui":
            return (stored.astype(np.uint32) << 16).view(np.float32)
        if self.dtype_name == "float16" and stored.dtype.kind in "ui":
            return stored.astype("<u2").view("<f2")
        return stored

    def __getitem__(self, key):
        if self.dtype_name == "bfloat16" and self.shape:
            rows = _rows_of(key, self.shape[0])
            if rows is not None:
                start, stop, squeeze, rest = rows
                bits = _stored_rows(self.raw, start, stop)
                if bits is not None:
                    values = self._decode(bits)
                    if squeeze:
                        return values[0][rest] if rest else values[0]
                    return values[(slice(None),) + rest] if rest else values
        return self._decode(self.raw[key])

    def __array__(self, dtype=None, copy=None):
        values = self[()]
        return values if dtype is None else values.astype(dtype)

    def blocks(self, max_bytes=BLOCK_BYTES):
        if self.raw.shape is None or len(self.shape) == 0 or self.shape[0] == 0:
            yield 0, self[()]
            return
        row_bytes = max(1, self.nbytes // self.shape[0])
        rows = max(1, max_bytes // row_bytes)
        for start in range(0, self.shape[0], rows):
            yield start, self[start:start + rows]

    def __repr__(self):
        return f"LazyTensor({self.raw.name}, {self.dtype_name or self.raw.dtype.str}, {list(self.shape)})"


class BatchFile:
    """An open batch file: `config` (the /config attributes), `attrs` (the root's), and every
    dataset as a LazyTensor by path (`batch["inputs/query"]`, `"inputs/ssm/state" in batch`).
    Nothing is read until indexed. Close it, or use it as a context manager."""

    def __init__(self, path):
        self.file = h5py.File(path, "r")
        self.attrs = {k: text(v) if isinstance(v, (str, bytes)) else v for k, v in self.file.attrs.items()}
        config = self.file.get("config")
        self.config = {} if config is None else \
            {k: text(v) if isinstance(v, (str, bytes)) else v for k, v in config.attrs.items()}

    def __contains__(self, path):
        return path in self.file and isinstance(self.file[path], h5py.Dataset)

    def __getitem__(self, path):
        obj = self.file[path]
        if not isinstance(obj, h5py.Dataset):
            raise KeyError(f"/{path.lstrip('/')} is a group, not a tensor")
        return LazyTensor(obj)

    def tensors(self):
        """Paths of every dataset, in file order."""
        names = []
        self.file.visititems(lambda name, obj: names.append(name) if isinstance(obj, h5py.Dataset) else None)
        return names

    def close(self):
        self.file.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_batch(path):
    """Opens a batch file lazily (BatchFile); reads nothing but attributes."""
    return BatchFile(path)


def read_in_blocks(dataset, max_bytes=BLOCK_BYTES):
    """Reads every stored element of an h5py dataset, at most max_bytes at a time and without type
    conversion (proves it readable: a truncated or corrupt chunk fails here)."""
    shape = () if dataset.shape is None else tuple(dataset.shape)
    if not shape or shape[0] == 0 or _stored_rows(dataset, 0, 0) is None:
        dataset[()]
        return
    row_bytes = max(1, int(np.prod(shape[1:], dtype=np.int64)) * dataset.id.get_type().get_size())
    rows = max(1, max_bytes // row_bytes)
    for start in range(0, shape[0], rows):
        _stored_rows(dataset, start, min(shape[0], start + rows))


def finite_range(dataset, max_bytes=BLOCK_BYTES // 4):
    """(min, max) of the finite values of a float dataset, read in blocks; (None, None) if none.
    A block's decoding and masking take several times its stored size, hence the smaller blocks."""
    low = high = None
    for _, block in LazyTensor(dataset).blocks(max_bytes):
        block = np.asarray(block)
        finite = block[np.isfinite(block)]
        if finite.size:
            low = finite.min() if low is None else min(low, finite.min())
            high = finite.max() if high is None else max(high, finite.max())
    return low, high


def describe(f, stats=False):
    """Prints every group's attributes and every dataset's type and shape (and, with stats, the
    finite min/max of float datasets, read in blocks)."""
    def visit(name, obj):
        path = "/" + name
        if isinstance(obj, h5py.Group):
            attrs = ", ".join(f"{k}={text(v)!r}" if isinstance(v, (str, bytes)) else f"{k}={v}"
                              for k, v in obj.attrs.items())
            print(f"{path}/  {attrs}")
        else:
            dtype_name = text(obj.attrs.get("dtype_name", "?"))
            summary = ""
            if stats and obj.dtype.kind == "f" and obj.shape is not None and obj.size:
                low, high = finite_range(obj)
                summary = f" min={low if low is not None else 'n/a'} max={high if high is not None else 'n/a'}"
            shape = "empty" if obj.shape is None else list(obj.shape)  # h5py.Empty: a default IntArray
            print(f"{path}  {dtype_name} (h5py {obj.dtype.str}) {shape}{summary}")

    root = ", ".join(f"{k}={text(v)!r}" for k, v in f.attrs.items())
    print(f"/  {root}")
    f.visititems(visit)


def check(f):
    """Returns a list of problems (empty if the file looks valid)."""
    problems = []
    if text(f.attrs.get("schema", "")) != "hybrid-batch":
        problems.append("root attribute schema is not 'hybrid-batch'")
    if not text(f.attrs.get("schema_version", "")).startswith("1."):
        problems.append("schema_version is not 1.x")
    for group in ("config", "batch", "inputs"):
        if group not in f:
            return problems + [f"missing group /{group}"]
    c = f["config"].attrs
    heads, kv_heads, head_size, block_size = (int(c[k]) for k in ("num_heads", "num_kv_heads", "head_size", "block_size"))
    dtype, kv_cache_dtype = text(c["dtype"]), text(c["kv_cache_dtype"])
    tokens = f["batch/slot_mapping"].shape[0]
    requests = f["batch/query_start_loc"].shape[0] - 1
    kind = text(c.get("layer_kind", "full_attention"))
    if kind != "full_attention":
        return problems + check_linear_layer(f, kind, dtype, tokens, requests)
    expected = {
        "batch/seq_lens": (None, (requests,)),
        "inputs/query": (dtype, (tokens, heads, head_size)),
        "inputs/key": (dtype, (tokens, kv_heads, head_size)),
        "inputs/value": (dtype, (tokens, kv_heads, head_size)),
    }
    if text(c["attn_type"]) == "decoder":
        blocks = f["inputs/kv_cache"].shape[0] if "inputs/kv_cache" in f else -1
        if kv_cache_dtype != "auto" and kv_cache_dtype not in KV_STORAGE:
            problems.append(f"/config kv_cache_dtype: unknown value {kv_cache_dtype!r} "
                            f"(expected auto, {', '.join(KV_STORAGE)})")
        expected["inputs/kv_cache"] = (KV_STORAGE.get(kv_cache_dtype, dtype), (blocks, 2, block_size, kv_heads, head_size))
    # 1.3: an fp8 query (raw bytes) with /inputs/q_scale; key and value keep the /config dtype.
    if "inputs/query" in f and text(f["inputs/query"].attrs.get("dtype_name", "")) in FP8_QUERY:
        expected["inputs/query"] = (text(f["inputs/query"].attrs["dtype_name"]), expected["inputs/query"][1])
        if "inputs/q_scale" not in f:
            problems.append("/inputs/query is fp8 but /inputs/q_scale is missing (real query = stored value * q_scale)")
    elif "inputs/q_scale" in f:
        problems.append("/inputs/q_scale is present but /inputs/query is not fp8")
    for path, (dtype_name, shape) in expected.items():
        if path not in f:
            problems.append(f"missing dataset /{path}")
            continue
        ds = f[path]
        if tuple(ds.shape) != shape:
            problems.append(f"/{path}: shape {list(ds.shape)} != {list(shape)}")
        if dtype_name is not None and text(ds.attrs.get("dtype_name", "")) != dtype_name:
            problems.append(f"/{path}: dtype_name {text(ds.attrs.get('dtype_name', ''))!r} != {dtype_name!r}")

    problems += check_tensor_parallel(f, c, dtype, tokens, heads, head_size)
    problems += check_ssm(f, tokens, heads, head_size)

    def every_dataset(name, obj):
        if isinstance(obj, h5py.Dataset):
            if "dtype_name" not in obj.attrs:
                problems.append(f"/{name}: no dtype_name attribute")
            read_in_blocks(obj)  # every dataset must be readable, in bounded blocks

    f.visititems(every_dataset)
    return problems


def linear_widths(kind, params):
    """(inputs {name: width}, output width) of a linear-attention layer (SCHEMA.md §6.4)."""
    p = {k: int(v) for k, v in params.items()}
    if kind == "gdn":
        hk, hv, dk, dv = p["num_k_heads"], p["num_v_heads"], p["head_k_dim"], p["head_v_dim"]
        return {"mixed_qkv": 2 * hk * dk + hv * dv, "a": hv, "b": hv}, hv * dv
    hs, hd, n, g = p["num_ssm_heads"], p["head_dim"], p["state_size"], p["n_groups"]
    return {"xBC": hs * hd + 2 * g * n, "dt": hs}, hs * hd


def check_linear_layer(f, kind, dtype, tokens, requests):
    """A linear-attention layer (1.2): its inputs [T, W] in /config dtype, no attention tensors, an
    output [T, W_out] alone; its pools and weights follow the SSM branch's generic rules."""
    problems = []
    if kind not in ("gdn", "mamba2"):
        return [f"/config layer_kind {kind!r} is not full_attention, gdn or mamba2"]
    if text(f["config"].attrs["ssm_mode"]) != kind:
        problems.append(f"/config ssm_mode {text(f['config'].attrs['ssm_mode'])!r} != layer_kind {kind!r}")
    try:
        inputs, output_width = linear_widths(kind, dict(f["config/ssm"].attrs) if "config/ssm" in f else {})
    except KeyError as missing:
        return problems + [f"missing /config/ssm {missing.args[0]} (a parameter of layer_kind {kind})"]
    if f["batch/seq_lens"].shape != (requests,):
        problems.append(f"/batch/seq_lens: shape {list(f['batch/seq_lens'].shape)} != {[requests]}")
    for name in ("query", "key", "value", "kv_cache", "k_scale", "v_scale", "k_scale_cache", "v_scale_cache"):
        if f"inputs/{name}" in f:
            problems.append(f"/inputs/{name} is present, but layer_kind {kind} is a linear-attention layer")
    for name, width in inputs.items():
        if f"inputs/{name}" not in f:
            problems.append(f"missing dataset /inputs/{name}")
            continue
        ds = f[f"inputs/{name}"]
        if tuple(ds.shape) != (tokens, width):
            problems.append(f"/inputs/{name}: shape {list(ds.shape)} != {[tokens, width]}")
        if text(ds.attrs.get("dtype_name", "")) != dtype:
            problems.append(f"/inputs/{name}: dtype_name {text(ds.attrs.get('dtype_name', ''))!r} != {dtype!r}")
    for group in ("outputs", "expected"):
        if group not in f:
            continue
        if f"{group}/output" not in f or tuple(f[f"{group}/output"].shape) != (tokens, output_width):
            problems.append(f"/{group}/output must be [{tokens}, {output_width}]")
        for name in ("attn_output", "ssm_output", "kv_cache"):
            if f"{group}/{name}" in f:
                problems.append(f"/{group}/{name} is present, but layer_kind {kind} has no such output")
    problems += check_ssm(f, tokens, 0, 0)

    def every_dataset(name, obj):
        if isinstance(obj, h5py.Dataset):
            if "dtype_name" not in obj.attrs:
                problems.append(f"/{name}: no dtype_name attribute")
            read_in_blocks(obj)

    f.visititems(every_dataset)
    return problems


def check_tensor_parallel(f, c, dtype, tokens, heads, head_size):
    """A tensor-parallel rank file (1.4, SCHEMA.md §5.2.2): tp_size >= 1, tp_rank in [0, tp_size), and
    /inputs/ssm_hidden [T, tp_size * Hq * D] in /config dtype exactly when the rank has an SSM branch."""
    problems = []
    tp_size, tp_rank = int(c.get("tp_size", 1)), int(c.get("tp_rank", 0))
    if tp_size < 1:
        return [f"/config tp_size must be >= 1, got {tp_size}"]
    if not 0 <= tp_rank < tp_size:
        problems.append(f"/config tp_rank must be in [0, tp_size = {tp_size}), got {tp_rank}")
    has_branch = text(c.get("ssm_mode", "none")) != "none"
    if tp_size > 1 and has_branch:
        shape = (tokens, tp_size * heads * head_size)
        if "inputs/ssm_hidden" not in f:
            problems.append(f"missing dataset /inputs/ssm_hidden (a tensor-parallel rank's SSM input: {dtype} {list(shape)})")
        else:
            ds = f["inputs/ssm_hidden"]
            if tuple(ds.shape) != shape:
                problems.append(f"/inputs/ssm_hidden: shape {list(ds.shape)} != {list(shape)}")
            if text(ds.attrs.get("dtype_name", "")) != dtype:
                problems.append(f"/inputs/ssm_hidden: dtype_name {text(ds.attrs.get('dtype_name', ''))!r} != {dtype!r}")
    elif "inputs/ssm_hidden" in f:
        problems.append("/inputs/ssm_hidden is present, but the file is not a tensor-parallel rank with an SSM branch")
    return problems


def check_ssm(f, tokens, heads, head_size):
    """The SSM branch (1.1): generic rules only; each mode's names and shapes are the reference's."""
    problems = []

    def named_tensors(path, what):
        """{name: shape} of the float datasets in group `path` (problems for anything else)."""
        if path not in f:
            return {}
        if not isinstance(f[path], h5py.Group):
            problems.append(f"/{path} is not a group")
            return {}
        shapes = {}
        for name, ds in f[path].items():
            if not isinstance(ds, h5py.Dataset):
                problems.append(f"/{path}/{name} is a group, expected a dataset")
                continue
            dtype_name = text(ds.attrs.get("dtype_name", ""))
            if dtype_name not in SSM_FLOATS:
                problems.append(f"/{path}/{name}: dtype_name {dtype_name!r} is not allowed "
                                f"({what} must be one of {', '.join(SSM_FLOATS)})")
            if ds.shape is None or len(ds.shape) < 1:
                problems.append(f"/{path}/{name}: {what} must have rank >= 1")
                continue
            shapes[name] = tuple(ds.shape)
        return shapes

    def same_num_slots(path, pools):
        slots = {name: shape[0] for name, shape in pools.items()}
        if len(set(slots.values())) > 1:
            problems.append(f"/{path}: the pools do not share num_slots (dimension 0): {slots}")

    if "config/ssm" in f:
        for key, value in f["config/ssm"].attrs.items():
            v = np.asarray(value)  # any integer width; the C++ reader also takes integral floats
            integral = v.size == 1 and (v.dtype.kind in "iu" or (v.dtype.kind == "f" and float(v.flat[0]).is_integer()))
            if not integral:
                problems.append(f"/config/ssm: attribute {key} = {text(value)!r} is not an integer")
    before = named_tensors("inputs/ssm", "state pools")
    same_num_slots("inputs/ssm", before)
    named_tensors("weights", "weights")
    for group in ("outputs", "expected"):
        if f"{group}/ssm_output" in f:
            ds = f[f"{group}/ssm_output"]
            if tuple(ds.shape or ()) != (tokens, heads, head_size):
                problems.append(f"/{group}/ssm_output: shape {list(ds.shape or ())} != {[tokens, heads, head_size]}")
            if text(ds.attrs.get("dtype_name", "")) not in FLOATS:
                problems.append(f"/{group}/ssm_output: dtype_name {text(ds.attrs.get('dtype_name', ''))!r} "
                                "is not a float type")
        after = named_tensors(f"{group}/ssm", "state pools")
        same_num_slots(f"{group}/ssm", after)
        if before and after:  # the pools after the step are the pools before it
            for name in sorted(set(before) | set(after)):
                if name not in after:
                    problems.append(f"missing dataset /{group}/ssm/{name} (the pool /inputs/ssm/{name} after the step)")
                elif name not in before:
                    problems.append(f"/{group}/ssm/{name}: no state pool of that name in /inputs/ssm")
                elif after[name] != before[name]:
                    problems.append(f"/{group}/ssm/{name}: shape {list(after[name])} != /inputs/ssm/{name} "
                                    f"{list(before[name])}")
    return problems


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--check", action="store_true", help="verify the schema; exit 1 on problems")
    parser.add_argument("--stats", action="store_true", help="also print each float dataset's finite min/max")
    args = parser.parse_args(argv)
    with h5py.File(args.path, "r") as f:
        describe(f, stats=args.stats)
        if args.check:
            problems = check(f)
            for problem in problems:
                print(f"error: {problem}", file=sys.stderr)
            print("ok" if not problems else f"{len(problems)} problem(s)")
            sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
