#!/usr/bin/env python3
"""The capture module against fake vLLM engines built from the contract fixtures.

    capture_engine_test.py list                          the case names (one CTest test each)
    capture_engine_test.py check CASE --cli HYBRIDTB --workdir DIR

Each case makes a small batch with `hybridtb gen`, has the reference compute its results
(`hybridtb run`), builds the release's engine objects from a contract fixture (fake_engine.py),
installs the hooks by running the README's sitecustomize block verbatim, calls `forward` like
vLLM's Attention layer, and checks the files: `hybridtb info`, `hybridtb replay --backend
reference` (must pass: the engine wrote exactly what the reference computes), the index lines,
and the items the C++ reader does not know yet (schema 1.3) with h5py. Exit 0 = pass, 77 = skip.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "harness", "scripts"))

import h5py  # noqa: E402
import numpy as np  # noqa: E402

import fake_engine as fe  # noqa: E402  (loads real torch or the stand-in first)

CLI = None
WORK = None
CASES = {}
SMALL = ["--preset", "llama3-8b", "--set", "num_heads=4", "--set", "num_kv_heads=2", "--set", "head_size=32",
         "--set", "dtype=bfloat16"]


def case(fn):
    CASES[fn.__name__] = fn
    return fn


def run(cmd, check=True):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


def make_step(tag, gen_args, transform=None):
    """gen -> (optionally rewrite the inputs) -> reference results; returns a fe.Step."""
    src, ref = os.path.join(WORK, f"{tag}_src.h5"), os.path.join(WORK, f"{tag}_ref.h5")
    run([CLI, "gen", *gen_args, "--quiet", "--out", src])
    if transform:
        with h5py.File(src, "r+") as f:
            transform(f)
    run([CLI, "run", "--backend", "reference", "--batch", src, "--out", ref])
    return fe.Step(src, ref)


def readme_block(first_line):
    """The README's ```python block whose first line starts with `first_line`."""
    with open(os.path.join(ROOT, "datasets", "capture", "README.md"), encoding="utf-8") as f:
        text = f.read()
    for block in re.findall(r"```python\n(.*?)```", text, re.S):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"datasets/capture/README.md: no python block starting with {first_line!r}")


def install_from_readme(capture_dir, **env):
    """Runs the README's sitecustomize block verbatim with the capture environment set."""
    os.environ["HYBRIDTB_CAPTURE_DIR"] = capture_dir
    os.environ["HYBRIDTB_HOME"] = ROOT
    for k, v in env.items():
        os.environ[k] = str(v)
    exec(compile(readme_block("# sitecustomize.py"), "README.md:sitecustomize", "exec"), {"__name__": "sitecustomize"})
    import hybridtb_capture
    return hybridtb_capture


def index(capture_dir):
    path = os.path.join(capture_dir, "index.jsonl")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def h5_files(capture_dir):
    return sorted(os.path.join(capture_dir, n) for n in os.listdir(capture_dir) if n.endswith(".h5"))


def cli_info_and_replay(path, replay=True):
    p = run([CLI, "info", path], check=False)
    assert p.returncode == 0, f"hybridtb info {path}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    if replay:
        p = run([CLI, "replay", "--backend", "reference", "--quiet", "--no-rationale", path], check=False)
        assert p.returncode == 0 and "1 passed, 0 failed" in p.stdout, \
            f"hybridtb replay {path}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"


def check_cli(path, replay=True):
    """hybridtb info, and replay on the reference when the file has /expected.

    A capture's /expected holds what vLLM produced (tensors) but no hybridtb builder metadata
    (vLLM's metadata is under /capture/engine_metadata): until the C++ reader accepts /expected
    without metadata (schema 1.3, case files_as_written_cli), the replay runs on a copy whose
    /expected gets the metadata the reference's builder computes from the file's own config and
    batch (`hybridtb run`). Every captured tensor is still compared with the reference."""
    with h5py.File(path, "r") as f:
        has_expected = "expected" in f
    if not has_expected:
        cli_info_and_replay(path, replay=False)
        return
    base = os.path.join(WORK, "check_" + os.path.basename(path))
    without = base + ".inputs.h5"
    shutil.copyfile(path, without)
    with h5py.File(without, "r+") as f:
        del f["expected"]
    ran = base + ".run.h5"
    run([CLI, "run", "--backend", "reference", "--batch", without, "--out", ran])
    with h5py.File(path, "r") as src, h5py.File(ran, "r+") as g:
        src.copy(src["expected"], g, "expected")
        g.copy(g["outputs/metadata"], g["expected"], "metadata")
        del g["outputs"]
    cli_info_and_replay(ran, replay)


def py_check(path):
    """harness/scripts/read_batch_h5py.py's checks (the Python side of the schema, 1.3 included)."""
    import read_batch_h5py
    with h5py.File(path, "r") as f:
        problems = read_batch_h5py.check(f)
    assert not problems, f"{path}: {problems}"


def attr(f, name, group="/"):
    v = f[group].attrs[name]
    return v.decode() if isinstance(v, bytes) else v


def triton_release(name, step, capture_dir, env=None, **engine_kwargs):
    """Installs release `name`'s engine, the hooks (README), runs one forward; returns (engine, result)."""
    c = fe.contract(name)
    engines = {}
    mod = fe.install_release(c, engines)
    install_from_readme(capture_dir, **(env or {}))
    e = fe.Engine(step, c, **engine_kwargs)
    engines["current"] = e
    impl, md = fe.make_impl(mod, e), fe.make_metadata(mod, e)
    result = fe.call(impl, e, md)
    return c, e, impl, md, result


def assert_completed_capture(capture_dir, c, e, replay=True, schema="1.3"):
    """One completed file, valid, replaying on the reference; returns its path."""
    files = h5_files(capture_dir)
    assert len(files) == 1, files
    lines = index(capture_dir)
    assert [l["status"] for l in lines] == ["inputs saved", "completed"], lines
    assert lines[-1]["file"] == os.path.basename(files[0]) and lines[-1]["bytes"] == os.path.getsize(files[0])
    with h5py.File(files[0], "r") as f:
        assert attr(f, "schema_version") == schema
        assert attr(f, "engine_version", "config") == f"vllm {c['version']}", attr(f, "engine_version", "config")
        assert attr(f, "engine_version") == f"vllm {c['version']}"
        assert attr(f, "capture_status") == "completed"
        assert attr(f, "engine_kv_cache_layout") == c["triton"]["kv_cache"]["layout"]
        for key in ("model", "tp_rank", "tp_size", "rank", "engine_step", "torch_version", "cuda_version", "pid"):
            assert key in f.attrs, key
        # Only the referenced blocks: fewer than the engine's cache, block 0 first.
        nb = f["inputs/kv_cache"].shape[0]
        assert nb < e.nb, (nb, e.nb)
        assert f["batch/block_table"][()].max() < nb
        assert int(f["batch"].attrs["num_actual_tokens"]) == e.real
        assert f["inputs/query"].shape[0] == e.rows
    py_check(files[0])
    check_cli(files[0], replay)
    return files[0]


# ------------------------------------------------------------------------------------------------
# Releases: layouts, dtypes, padding.

@case
def triton_v0_10_layout():
    """0.10: the cache is [2, NB, BS, H, D] (unbind(0)); the file holds it as [NB, 2, BS, H, D]."""
    step = make_step("t10", SMALL + ["--mix", "d3@40+c1x5@20+p1x7"])
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.10.1.1", step, d)
    assert e.kv_cache.shape[0] == 2 and e.kv_cache.shape[1] == e.nb
    path = assert_completed_capture(d, c, e)
    with h5py.File(path, "r") as f:  # the gathered blocks are the batch's blocks, renumbered
        table = f["batch/block_table"][()]
        got = fe.bits_of(f["inputs/kv_cache"])[0]
    src, src_table = step.inputs["kv_cache"][0], step.batch["block_table"]
    for r in range(table.shape[0]):
        for j in range(-(-int(step.batch["seq_lens"][r]) // e.block_size)):
            assert np.array_equal(got[table[r, j]], src[src_table[r, j]]), (r, j)


class tensor_parallel_state:
    """vLLM's parallel state as an initialised TP group would answer, for the block's duration."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def __enter__(self):
        module = types.ModuleType("vllm.distributed.parallel_state")
        module.get_tensor_model_parallel_rank = lambda: self.rank
        module.get_tensor_model_parallel_world_size = lambda: self.size
        self.saved = sys.modules.get("vllm.distributed.parallel_state")
        sys.modules["vllm.distributed.parallel_state"] = module
        return self

    def __exit__(self, *exc):
        if self.saved is None:
            sys.modules.pop("vllm.distributed.parallel_state", None)
        else:
            sys.modules["vllm.distributed.parallel_state"] = self.saved


@case
def triton_tensor_parallel_rank():
    """A TP rank's attention (rank 1 of 2): a schema-1.4 rank file with /config tp_size and tp_rank,
    valid for both readers and replaying on the reference (attention needs no other rank)."""
    step = make_step("ttp", SMALL + ["--mix", "d3@40+p1x7"])
    d = os.path.join(WORK, "cap")
    with tensor_parallel_state(1, 2):
        c, e, *_ = triton_release("vllm-0.33.0", step, d)
    path = assert_completed_capture(d, c, e, schema="1.4")
    with h5py.File(path, "r") as f:
        assert int(f["config"].attrs["tp_size"]) == 2 and int(f["config"].attrs["tp_rank"]) == 1
        assert attr(f, "tp_rank") == "1" and attr(f, "tp_size") == "2"


@case
def seed_hybrid_tensor_parallel_refused():
    """A TP rank of the seed's hybrid layer with a mamba1 branch: its SSM input is every head's
    hidden row, which the rank's hook does not see; the step is skipped with that reason."""
    step = make_step("htp", ["--preset", "hymba-small", "--set", "num_heads=4", "--set", "num_kv_heads=2",
                             "--set", "head_size=32", "--set", "ssm.intermediate_size=64", "--set", "ssm.dt_rank=8",
                             "--ssm-slots", "off", "--mix", "d2@40+p1x7"])
    d = os.path.join(WORK, "cap")
    with tensor_parallel_state(0, 2):
        seed_hybrid_forward(step, d, "benchmark")
    assert h5_files(d) == [], h5_files(d)
    lines = index(d)
    assert len(lines) == 1 and lines[0]["status"] == "skipped", lines
    assert "tensor-parallel rank 0 of 2 with SSM branch 'mamba1'" in lines[0]["reason"], lines


@case
def triton_v0_10_piecewise_padding():
    """0.10/0.11 piecewise graphs: slot_mapping is sliced to the real tokens, q/k/v stay padded."""
    step = make_step("t10p", SMALL + ["--mix", "d4@33+p1x6"])
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.10.1.1", step, d, padding="piecewise", pad_rows=5)
    assert e.md_values["slot_mapping"].shape[0] == e.real and e.query.shape[0] == e.real + 5
    path = assert_completed_capture(d, c, e)
    with h5py.File(path, "r") as f:
        sm = f["batch/slot_mapping"][()]
        assert sm.shape[0] == e.real + 5 and np.all(sm[e.real:] == -1)
        assert "piecewise" in attr(f, "capture_notes")
    assert "piecewise" in index(d)[0]["reason"]


@case
def triton_v0_11_piecewise_padding():
    """0.11 (schema layout [NB, 2, ...]) with piecewise padding and an fp8_e5m2 cache."""
    step = make_step("t11p", SMALL + ["--set", "kv_cache_dtype=fp8_e5m2", "--mix", "d3@33+c1x4@17"])
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.11.0", step, d, padding="piecewise", pad_rows=4)
    path = assert_completed_capture(d, c, e)
    with h5py.File(path, "r") as f:
        assert f["inputs/kv_cache"].attrs["dtype_name"] in ("float8_e5m2", b"float8_e5m2")
        assert np.all(f["batch/slot_mapping"][()][e.real:] == -1)


@case
def triton_v0_11_fp8_cache():
    """--kv-cache-dtype fp8: vLLM keeps the string "fp8" and allocates uint8; the file holds
    float8_e4m3fn bytes (unchanged) and kv_cache_dtype fp8_e4m3."""
    step = make_step("t11f", SMALL + ["--set", "kv_cache_dtype=fp8", "--mix", "d3@40+p1x9"])
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.11.0", step, d)
    assert "fp8" in c["cache_dtypes"]["stored_as_uint8"] and str(e.kv_cache.dtype) == "torch.uint8"
    assert not e.fp8_query  # 0.11's Triton backend quantises the query inside forward
    path = assert_completed_capture(d, c, e)
    with h5py.File(path, "r") as f:
        assert attr(f, "kv_cache_dtype", "config") == "fp8_e4m3"
        assert attr(f, "engine_kv_cache_dtype") == "fp8"
        assert f["inputs/kv_cache"].attrs["dtype_name"] in ("float8_e4m3fn", b"float8_e4m3fn")
        assert f["inputs/kv_cache"].dtype == np.uint8


@case
def triton_v0_12_full_padding():
    """0.12 FULL graphs: num_actual_tokens is the padded count, padding requests have block-table
    rows -1; the file has the real count and null-block rows."""
    step = make_step("t12p", SMALL + ["--mix", "d5@50"])
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.12.0", step, d, padding="full", pad_rows=3, pad_reqs=3)
    assert c["cudagraph"]["full_mode_pads_metadata"] and e.md_values["num_actual_tokens"] == e.real + 3
    path = assert_completed_capture(d, c, e)
    with h5py.File(path, "r") as f:
        assert f["batch/query_start_loc"].shape[0] == 5 + 3 + 1
        assert np.all(f["batch/block_table"][()][5:] == 0)
        assert "FULL" in attr(f, "capture_notes")


@case
def triton_v0_12_fp8_query():
    """0.12 quantises the query before forward when the cache is fp8: the file keeps the fp8
    bytes (dtype_name float8_e4m3fn) and q_scale; /config dtype stays bf16. Checked with h5py:
    the C++ reader checks the file (case fp8_query_cli)."""
    d = fp8_query_capture()
    files = h5_files(d)
    assert len(files) == 1
    with h5py.File(files[0], "r") as f:
        q = f["inputs/query"]
        assert attr(f, "schema_version") == "1.3"
        assert q.attrs["dtype_name"] in ("float8_e4m3fn", b"float8_e4m3fn") and q.dtype == np.uint8
        assert attr(f, "dtype", "config") == "bfloat16" and attr(f, "engine_query_dtype") == "float8_e4m3fn"
        assert f["inputs/q_scale"].shape == () and float(f["inputs/q_scale"][()]) == 1.0
        assert f["inputs/q_scale"].attrs["dtype_name"] in ("float32", b"float32")
        e = FP8_ENGINE[0]
        assert np.array_equal(q[()][: e.real], e.query_bytes[: e.real])
        assert attr(f, "capture_status") == "completed"
    py_check(files[0])
    print("fp8 query stored as fp8 bytes + q_scale (C++ check: case fp8_query_cli)")


FP8_ENGINE = []


def fp8_query_capture():
    """A capture whose query arrives as fp8. The batch's query is made fp8-representable first,
    so the reference's results are those of the query the kernel sees."""
    def fp8_representable_query(f):
        q = f["inputs/query"]
        values = q[()]
        rounded = fe.e4m3_table()[fe.e4m3_encode(values)].astype(np.float32)
        del f["inputs/query"]
        fe.wb.write_tensor(f["inputs"], "query", rounded, "bfloat16")
    step = make_step("t12q", SMALL + ["--set", "kv_cache_dtype=fp8", "--mix", "d3@40+p1x9"], fp8_representable_query)
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.12.0", step, d)
    assert e.fp8_query and str(e.query.dtype) == "torch.float8_e4m3fn"
    FP8_ENGINE.append(e)
    return d


@case
def fp8_query_cli():
    """hybridtb info + replay on the fp8-query capture: the C++ side of schema 1.3 reads
    /inputs/query as float8_e4m3fn or float8_e5m2 with /config dtype the model dtype, and
    /inputs/q_scale."""
    d = fp8_query_capture()
    check_cli(h5_files(d)[0])


@case
def files_as_written_cli():
    """hybridtb info + replay on a completed capture exactly as written: /expected holds vLLM's
    bf16 output and no hybridtb builder metadata. replay accepts /expected without metadata and
    takes its tolerance from /expected's dtype when that is coarser than the candidate's."""
    step = make_step("aw", SMALL + ["--mix", "d3@40+c1x5@20+p1x7"])
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.12.0", step, d, output_dtype="bfloat16")
    cli_info_and_replay(h5_files(d)[0])


@case
def python_scripts_fp8_and_errors():
    """write_batch_h5py / read_batch_h5py: vLLM's "fp8" is float8_e4m3fn as in the C++ reader
    (hybridtb info accepts the file); unknown values and an fp8 query without q_scale are refused
    with the field named."""
    import write_batch_h5py as wbh
    import read_batch_h5py
    path = os.path.join(WORK, "fp8.h5")
    run([sys.executable, os.path.join(ROOT, "harness", "scripts", "write_batch_h5py.py"), path,
         "--kv-cache-dtype", "fp8"])
    with h5py.File(path, "r") as f:
        assert f["inputs/kv_cache"].attrs["dtype_name"] in ("float8_e4m3fn", b"float8_e4m3fn")
        assert attr(f, "kv_cache_dtype", "config") == "fp8"
    py_check(path)
    cli_info_and_replay(path, replay=False)
    config, batch, inputs = wbh.example_batch("bfloat16", "auto")
    for bad_config, bad_inputs, field in (
            (dict(config, kv_cache_dtype="fp8_inc"), inputs, "/config kv_cache_dtype"),
            (config, dict(inputs, query=(np.zeros(inputs["query"].shape, np.uint8), "float8_e4m3fn")), "/inputs/query"),
            (config, dict(inputs, q_scale=1.0), "/inputs/q_scale")):
        try:
            wbh.write_hybrid_batch(os.path.join(WORK, "bad.h5"), bad_config, batch, bad_inputs)
            raise AssertionError(f"accepted a bad {field}")
        except ValueError as e:
            assert field in str(e), (field, str(e))
    good = os.path.join(WORK, "fp8q.h5")
    wbh.write_hybrid_batch(good, dict(config, engine_version="vllm 0.12.0"), batch,
                           dict(inputs, query=(np.full(inputs["query"].shape, 0x38, np.uint8), "float8_e4m3fn"),
                                q_scale=0.5))
    with h5py.File(good, "r+") as f:
        assert attr(f, "schema_version") == "1.3" and attr(f, "engine_version", "config") == "vllm 0.12.0"
        assert read_batch_h5py.check(f) == []
        del f["inputs/q_scale"]
    with h5py.File(good, "r") as f:
        assert any("q_scale is missing" in p for p in read_batch_h5py.check(f))


@case
def triton_v0_33_layout():
    """0.33: the cache is the logical page [NB, H, BS, 2D] and a separate do_kv_cache_update writes
    it before forward; the file is still consistent (the reference rewrites the same bytes)."""
    step = make_step("t33", SMALL + ["--mix", "d3@40+c1x5@20+p1x7"])
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.33.0", step, d)
    assert len(e.kv_cache.shape) == 4 and not c["triton"]["kv_cache"]["written_in_forward"]
    assert_completed_capture(d, c, e)


@case
def triton_v0_33_full_padding():
    """0.33: FULL-graph padding with the 4-D cache layout."""
    step = make_step("t33p", SMALL + ["--mix", "d6@70"])
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.33.0", step, d, padding="full", pad_rows=2, pad_reqs=2)
    path = assert_completed_capture(d, c, e)
    with h5py.File(path, "r") as f:
        assert np.all(f["batch/seq_lens"][()][6:] == 0) and "FULL" in attr(f, "capture_notes")


@case
def triton_v0_33_fp8_e5m2():
    """0.33 with an fp8_e5m2 cache in the 4-D layout; the query is not fp8 (only fp8/fp8_e4m3 are)."""
    step = make_step("t33e5", SMALL + ["--set", "kv_cache_dtype=fp8_e5m2", "--mix", "d2@40+p1x5"])
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.33.0", step, d)
    assert not e.fp8_query
    path = assert_completed_capture(d, c, e)
    with h5py.File(path, "r") as f:
        assert attr(f, "kv_cache_dtype", "config") == "fp8_e5m2"


# ------------------------------------------------------------------------------------------------
# The seed's hybrid backend.

def seed_hybrid_forward(step, capture_dir, adapter_mode):
    """Installs the seed's HybridAttentionImpl on 0.12's engine and the hooks (README), runs one
    forward; returns (release, engine)."""
    seed, release = fe.contract("seed-hybrid"), fe.contract("vllm-0.12.0")
    engines = {}
    mod, tmod = fe.install_seed(seed, release, engines)
    install_from_readme(capture_dir)
    e = fe.Engine(step, release)
    engines["current"] = e
    impl, md = fe.make_hybrid(mod, tmod, e, adapter_mode, seed)
    fe.call(impl, e, md)
    return release, e


def hybrid_case(tag, gen_args, adapter_mode, expected_ssm_mode, transform=None):
    step = make_step(tag, gen_args, transform)
    d = os.path.join(WORK, "cap")
    release, e = seed_hybrid_forward(step, d, adapter_mode)
    path = assert_completed_capture(d, release, e)  # one file: the inner Triton call is not captured again
    with h5py.File(path, "r") as f:
        assert attr(f, "ssm_mode", "config") == expected_ssm_mode
        assert attr(f, "hook") == "hybrid" and attr(f, "engine_ssm_mode") == adapter_mode
        m = f["capture/engine_metadata/mamba"]
        nd = int(m.attrs["num_decodes"])
        assert np.array_equal(m["state_indices_tensor_d"][()], f["batch/block_table"][()][:nd, 0])
    return path


@case
def seed_hybrid_prefix_sum():
    """HybridAttentionImpl with the adapter in prefix_sum mode: ssm_mode prefix_sum_flat."""
    hybrid_case("hps", SMALL + ["--set", "ssm_mode=prefix_sum_flat", "--mix", "d3@40+p1x6"], "prefix_sum",
                "prefix_sum_flat")


def a_log_round_trips(f):
    """vLLM keeps A = -exp(A_log) (float32) and the capture writes log(-A): choose A_log values
    for which that round trip is exact in float32, so the replay can compare exactly."""
    a_log = f["weights/A_log"][()].astype(np.float32)
    for _ in range(8):
        a_log = np.log(np.exp(a_log.astype(np.float64)).astype(np.float32).astype(np.float64)).astype(np.float32)
    again = np.log(np.exp(a_log.astype(np.float64)).astype(np.float32).astype(np.float64)).astype(np.float32)
    assert np.array_equal(again, a_log)
    f["weights/A_log"][...] = a_log


@case
def seed_hybrid_disabled():
    """The adapter in its default mode (disabled: a zero contribution): ssm_mode zero."""
    hybrid_case("hz", SMALL + ["--set", "ssm_mode=zero", "--mix", "d2@40+p1x6"], "disabled", "zero")


@case
def seed_hybrid_mamba1():
    """The adapter's Mamba-1 pipeline: weights (A as -exp(A_log)), pools compacted with the KV
    blocks, the conv state kept in vLLM's (K-1, I) per slot (SD, as the file's engine_version says)."""
    path = hybrid_case("hm1", ["--preset", "hymba-small", "--set", "num_heads=4", "--set", "num_kv_heads=2",
                               "--set", "head_size=32", "--set", "ssm.intermediate_size=64", "--set", "ssm.dt_rank=8",
                               "--ssm-slots", "off", "--mix", "d2@40+p1x7"], "benchmark", "mamba1",
                       a_log_round_trips)
    with h5py.File(path, "r") as f:
        nb = f["inputs/kv_cache"].shape[0]
        assert f["inputs/ssm/conv_state"].shape == (nb, 3, 64) and f["expected/ssm/ssm_state"].shape == (nb, 64, 16)


# ------------------------------------------------------------------------------------------------
# The contracts.

ENGINE_RULE_KEYS = ("pad_slot_id", "null_block_id", "padded_request_state_index", "state_index_skip_rule",
                    "mamba_cache_modes", "treat_short_extends_as_decodes", "conv_state_layout", "norm_eps_from_config")
RELEASES = {"vllm-0.10.1.1": "0.10.1.1", "vllm-0.11.0": "0.11.0", "vllm-0.12.0": "0.12.0", "vllm-0.33.0": "0.33.0"}


@case
def contract_engine_rules_keys():
    """Every fixture's engine_rules has exactly the agreed keys, each with a <key>_source string."""
    for name in list(RELEASES) + ["seed-hybrid"]:
        rules = fe.contract(name)["engine_rules"]
        assert sorted(rules) == sorted(list(ENGINE_RULE_KEYS) + [k + "_source" for k in ENGINE_RULE_KEYS]), name
        for k in ENGINE_RULE_KEYS:
            assert isinstance(rules[k + "_source"], str) and rules[k + "_source"], (name, k)
        assert rules["state_index_skip_rule"] in ("negative", "nonpositive", None), name
        assert rules["conv_state_layout"] in ("DS", "SD", None), name


@case
def contracts_match_releases():
    """extract_vllm_contract.py on the unpacked releases reproduces the committed fixtures
    (HYBRIDTB_VLLM_SRC/<release>; skipped where it is not set or holds none), and a directory
    that is not a release is refused with exit 2 and the reason."""
    script = os.path.join(ROOT, "datasets", "capture", "contracts", "extract_vllm_contract.py")
    p = run([sys.executable, script, WORK], check=False)
    assert p.returncode == 2 and "no vllm/ directory" in p.stderr, (p.returncode, p.stderr)
    src = os.environ.get("HYBRIDTB_VLLM_SRC", "")
    if not src:
        print("skipped: HYBRIDTB_VLLM_SRC is not set (a folder of unpacked vLLM releases, one per version)")
        sys.exit(77)
    checked = 0
    for name, release in RELEASES.items():
        root = os.path.join(src, release)
        if not os.path.isdir(os.path.join(root, "vllm")):
            continue
        out = os.path.join(WORK, name + ".json")
        run([sys.executable, script, root, "-o", out])
        with open(out, encoding="utf-8") as f:
            assert json.load(f) == fe.contract(name), f"{name}: the extractor's output differs from the fixture"
        checked += 1
    if not checked:
        print(f"skipped: no unpacked vLLM release under {src}")
        sys.exit(77)


# ------------------------------------------------------------------------------------------------
# Refusals, failures, budgets, ranks, options.

@case
def stream_capture_skipped():
    """During CUDA-graph capture nothing is copied: an index line says so, forward still runs."""
    step = make_step("sc", SMALL + ["--mix", "d2@40"])
    d = os.path.join(WORK, "cap")
    torch = fe.torch
    original = torch.cuda.is_current_stream_capturing
    torch.cuda.is_current_stream_capturing = lambda: True
    try:
        c, e, impl, md, result = triton_release("vllm-0.12.0", step, d)
    finally:
        torch.cuda.is_current_stream_capturing = original
    assert h5_files(d) == []
    lines = index(d)
    assert len(lines) == 1 and lines[0]["status"] == "skipped" and "CUDA-graph capture" in lines[0]["reason"], lines
    assert e.calls == 1 and np.array_equal(fe.to_numpy_bits(e.output)[: e.real], fe.to_numpy_bits(e.ref_output)[: e.real])


@case
def forward_raises():
    """forward raises: the exception reaches the caller unchanged, the inputs are on disk with
    status "inputs saved", valid for hybridtb."""
    step = make_step("fr", SMALL + ["--mix", "d2@40+p1x5"])
    d = os.path.join(WORK, "cap")
    c = fe.contract("vllm-0.11.0")
    engines = {}
    mod = fe.install_release(c, engines)
    install_from_readme(d)
    e = fe.Engine(step, c)
    e.raise_in_forward = RuntimeError("kernel launch failed")
    engines["current"] = e
    try:
        fe.call(fe.make_impl(mod, e), e, fe.make_metadata(mod, e))
        raise AssertionError("forward's exception was swallowed")
    except RuntimeError as err:
        assert str(err) == "kernel launch failed"
    files = h5_files(d)
    assert len(files) == 1
    with h5py.File(files[0], "r") as f:
        assert attr(f, "capture_status") == "inputs saved" and "expected" not in f
    lines = index(d)
    assert [l["status"] for l in lines] == ["inputs saved", "inputs saved"], lines
    assert "forward raised RuntimeError: kernel launch failed" in lines[-1]["reason"]
    check_cli(files[0], replay=False)


@case
def two_ranks_one_directory():
    """Two TP ranks capture the same layer and step into one directory: two files, one index."""
    d = os.path.join(WORK, "cap")
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank))
        p = subprocess.run([sys.executable, __file__, "rank-child", "--cli", CLI, "--workdir",
                            os.path.join(WORK, f"r{rank}"), "--capture-dir", d], env=env, capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr
    files = h5_files(d)
    assert len(files) == 2 and {os.path.basename(f)[:10] for f in files} == {"capture_r0", "capture_r1"}, files
    lines = index(d)
    assert sorted(l["rank"] for l in lines if l["status"] == "completed") == [0, 1], lines
    for path in files:
        with h5py.File(path, "r") as f:
            assert attr(f, "rank") in ("0", "1") and attr(f, "layer") == "model.layers.0.self_attn.attn"
        check_cli(path)


def rank_child(capture_dir):
    step = make_step("rk", SMALL + ["--mix", "d2@40+p1x5"])
    c, e, *_ = triton_release("vllm-0.12.0", step, capture_dir)


@case
def budget_exceeded():
    """The predicted size is over HYBRIDTB_CAPTURE_MAX_BYTES: nothing written, the index says why."""
    step = make_step("bx", SMALL + ["--mix", "d3@40+p1x9"])
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.12.0", step, d, env={"HYBRIDTB_CAPTURE_MAX_BYTES": 20000})
    assert [n for n in os.listdir(d) if n != "index.jsonl"] == [], os.listdir(d)
    lines = index(d)
    assert len(lines) == 1 and lines[0]["status"] == "skipped" and lines[0]["predicted_bytes"] > 20000, lines
    assert "HYBRIDTB_CAPTURE_MAX_BYTES=20000" in lines[0]["reason"]
    assert np.array_equal(fe.to_numpy_bits(e.output)[: e.real], fe.to_numpy_bits(e.ref_output)[: e.real])


@case
def size_is_the_batch():
    """A cache 40x bigger than the batch needs: the file holds only the referenced blocks, and the
    prediction made before copying is within 25% of the file's size."""
    step = make_step("sz", SMALL + ["--mix", "d4@60+p1x20"])
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.12.0", step, d, extra_blocks=400)
    path = assert_completed_capture(d, c, e)
    size = os.path.getsize(path)
    table, seq_lens = step.batch["block_table"], step.batch["seq_lens"]
    needed = {0} | {int(table[r, j]) for r in range(len(seq_lens)) for j in range(-(-int(seq_lens[r]) // 16))}
    with h5py.File(path, "r") as f:
        assert f["inputs/kv_cache"].shape[0] == len(needed), (f["inputs/kv_cache"].shape, len(needed))
    per_block = int(np.prod(e.kv_cache.shape)) // e.nb * 2
    assert size < 20 * per_block + 200_000, size
    predicted = index(d)[0]["predicted_bytes"]
    assert 0.75 * size <= predicted <= 1.25 * size, (predicted, size)


@case
def refused_cache_dtype():
    """An fp8_inc cache cannot be described by the schema: skipped with the reason, serving goes on."""
    step = make_step("rf", SMALL + ["--set", "kv_cache_dtype=fp8", "--mix", "d2@40"])
    d = os.path.join(WORK, "cap")
    c, e, *_ = triton_release("vllm-0.11.0", step, d, kv_cache_dtype="fp8_inc")
    assert h5_files(d) == []
    lines = index(d)
    assert lines[0]["status"] == "skipped" and "'fp8_inc' is not supported" in lines[0]["reason"], lines
    assert np.array_equal(fe.to_numpy_bits(e.output)[: e.real], fe.to_numpy_bits(e.ref_output)[: e.real])


@case
def per_head_q_scale_refused():
    """0.33 can quantise the query per KV-head group (a q_scale per KV head): the schema has one
    q_scale, so the call is skipped with the reason, never written with one of the scales."""
    step = make_step("phq", SMALL + ["--set", "kv_cache_dtype=fp8", "--mix", "d2@40"])
    d = os.path.join(WORK, "cap")
    c = fe.contract("vllm-0.33.0")
    assert c["attention_layer"]["per_head_q_scale"]
    engines = {}
    mod = fe.install_release(c, engines)
    install_from_readme(d)
    e = fe.Engine(step, c)
    assert e.fp8_query
    e.layer._q_scale = fe.tensor(np.array([1.0, 0.5], np.float32), "float32")
    engines["current"] = e
    fe.call(fe.make_impl(mod, e), e, fe.make_metadata(mod, e))
    assert h5_files(d) == []
    lines = index(d)
    assert lines[0]["status"] == "skipped" and "layer._q_scale: expected one scale" in lines[0]["reason"], lines


@case
def hook_error_turns_capture_off():
    """A bug inside the capture (here: metadata whose block table cannot be read) is logged to the
    index, turns capture off, and forward runs as if nothing happened."""
    step = make_step("he", SMALL + ["--mix", "d2@40"])
    d = os.path.join(WORK, "cap")
    c = fe.contract("vllm-0.12.0")
    engines = {}
    mod = fe.install_release(c, engines)
    install_from_readme(d)
    e = fe.Engine(step, c)
    engines["current"] = e
    impl, md = fe.make_impl(mod, e), fe.make_metadata(mod, e)

    class Unreadable:  # looks like a tensor, fails when read (a lost device)
        shape = (2, 3)
        dtype = "torch.int32"

        def detach(self):
            raise ValueError("device lost")
    md.block_table = Unreadable()
    result = fe.call(impl, e, md)
    assert result is e.output and e.calls == 1
    md2 = fe.make_metadata(mod, e)
    fe.call(impl, e, md2)
    assert e.calls == 2 and h5_files(d) == []
    lines = index(d)
    assert [l["status"] for l in lines] == ["capture disabled"], lines
    assert "device lost" in lines[0]["reason"]


@case
def step_and_layer_selection():
    """HYBRIDTB_CAPTURE_LAYERS / EVERY_N_STEPS / FIRST_STEPS / STEP_RANGE, in metadata-only mode."""
    step = make_step("sel", SMALL + ["--mix", "d2@40"])
    d = os.path.join(WORK, "cap")
    c = fe.contract("vllm-0.12.0")
    engines = {}
    mod = fe.install_release(c, engines)
    install_from_readme(d, HYBRIDTB_CAPTURE_LAYERS="*layers.1.*,*layers.3.*", HYBRIDTB_CAPTURE_EVERY_N_STEPS=2,
                        HYBRIDTB_CAPTURE_STEP_RANGE="2:", HYBRIDTB_CAPTURE_FIRST_STEPS=7,
                        HYBRIDTB_CAPTURE_METADATA_ONLY=1)
    for s in range(9):
        for layer in range(4):
            e = fe.Engine(step, c, layer_name=f"model.layers.{layer}.self_attn.attn")
            engines["current"] = e
            fe.call(fe.make_impl(mod, e), e, fe.make_metadata(mod, e))
    got = sorted((l["layer"].split(".")[2], l["step"]) for l in index(d))
    assert got == [(layer, s) for layer in ("1", "3") for s in (2, 4, 6)], got
    assert all(l["status"] == "metadata saved" for l in index(d))
    names = sorted(os.listdir(d))
    assert len([n for n in names if n.endswith(".json")]) == 6 and not h5_files(d), names
    with open(os.path.join(d, index(d)[0]["file"]), encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["config"]["num_heads"] == 4 and doc["provenance"]["engine_version"] == "vllm 0.12.0"


@case
def readme_explicit_patch():
    """The README's explicit block: install(backends=()) hooks nothing, patch() hooks the class."""
    step = make_step("ex", SMALL + ["--mix", "d2@40+p1x5"])
    d = os.path.join(WORK, "cap")
    c = fe.contract("vllm-0.12.0")
    engines = {}
    mod = fe.install_release(c, engines)
    os.environ.update(HYBRIDTB_CAPTURE_DIR=d)
    sys.path.insert(0, os.path.join(ROOT, "datasets", "capture"))
    exec(compile(readme_block("# explicit hooks"), "README.md:explicit", "exec"), {})
    e = fe.Engine(step, c)
    engines["current"] = e
    fe.call(fe.make_impl(mod, e), e, fe.make_metadata(mod, e))
    assert_completed_capture(d, c, e)


@case
def import_hook_patches_later_import():
    """install() before vLLM is imported: the class is patched when its module is imported."""
    step = make_step("ih", SMALL + ["--mix", "d2@40+p1x5"])
    d = os.path.join(WORK, "cap")
    c = fe.contract("vllm-0.12.0")
    pkg = os.path.join(WORK, "pkg")
    mod_path = c["triton"]["module"].split(".")
    for i in range(1, len(mod_path)):
        os.makedirs(os.path.join(pkg, *mod_path[:i]), exist_ok=True)
        with open(os.path.join(pkg, *mod_path[:i], "__init__.py"), "w") as f:
            f.write(f"__version__ = {c['version']!r}\n" if i == 1 else "")
    with open(os.path.join(pkg, *mod_path[:-1], mod_path[-1] + ".py"), "w") as f:
        f.write("import fake_engine, json, sys\n"
                "_c = fake_engine.contract('vllm-0.12.0')\n"
                "_m = fake_engine.install_release(_c, fake_engine.ENGINES)\n"
                "TritonAttentionImpl = _m.TritonAttentionImpl\n"
                "TritonAttentionMetadata = _m.TritonAttentionMetadata\n")
    hc = install_from_readme(d)
    sys.path.insert(0, pkg)
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]
    import importlib
    mod = importlib.import_module(c["triton"]["module"])
    assert getattr(mod.TritonAttentionImpl.forward, "_hybridtb_capture", None) == "triton"
    e = fe.Engine(step, c)
    fe.ENGINES["current"] = e
    fe.call(fe.make_impl(mod, e), e, fe.make_metadata(mod, e))
    assert_completed_capture(d, c, e)
    assert hc is sys.modules["hybridtb_capture"]


def main():
    global CLI, WORK
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["list", "check", "rank-child"])
    p.add_argument("case", nargs="?")
    p.add_argument("--cli")
    p.add_argument("--workdir")
    p.add_argument("--capture-dir")
    a = p.parse_args()
    if a.mode == "list":
        print("\n".join(CASES))
        return 0
    CLI, WORK = a.cli, a.workdir
    if os.path.isdir(WORK) and a.mode == "check":
        import shutil
        shutil.rmtree(WORK)
    os.makedirs(WORK, exist_ok=True)
    if a.mode == "rank-child":
        rank_child(a.capture_dir)
        return 0
    if a.case not in CASES:
        print(f"unknown case {a.case!r}; cases: {', '.join(CASES)}", file=sys.stderr)
        return 2
    print(f"torch: {'real ' + fe.torch.__version__ + ' on ' + fe.DEVICE if fe.REAL_TORCH else 'numpy stand-in'}")
    CASES[a.case]()
    print(f"{a.case}: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
