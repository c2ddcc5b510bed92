#!/usr/bin/env python3
"""Tests of harness/python/hybridtb_h5 against the C++ side (CTest: tests/python_h5/CMakeLists.txt).

    hybridtb_h5_test.py list
    hybridtb_h5_test.py check CASE --cli build/harness/cli/hybridtb --workdir DIR

roundtrip_*: the writer's command line (`python3 -m hybridtb_h5.writer`, found through PYTHONPATH
alone) writes one kind of item; `hybridtb info` accepts the file, `hybridtb run` runs it, and every
tensor and /config attribute the writer stored comes back from the C++ writer unchanged, with the
outputs that item implies. lazy_check_*: the lazy reader checks a large `hybridtb gen` file within
a memory bound (peak RSS) and a time bound, and indexes a slice without reading the rest.
fp8_decode: the reader's fp8 values at the format's landmarks. import_*: the package and the old
script names import without any sys.path change by the caller. tensor_parallel_rank_files: `gen --tp`
rank files (1.4) pass the reader's check, and one without its ssm_hidden does not.
"""
import argparse
import os
import resource
import subprocess
import sys
import time

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE_DIR = os.path.join(ROOT, "harness", "python")

# name -> the writer's arguments
ROUNDTRIPS = {
    "bf16_auto": [],
    "fp16": ["--dtype", "float16"],
    "fp32": ["--dtype", "float32"],
    "kv_fp8": ["--kv-cache-dtype", "fp8"],
    "kv_fp8_e4m3": ["--kv-cache-dtype", "fp8_e4m3"],
    "kv_fp8_e5m2": ["--kv-cache-dtype", "fp8_e5m2"],
    "kv_int8_per_token_head": ["--kv-cache-dtype", "int8_per_token_head"],
    "kv_fp8_per_token_head": ["--kv-cache-dtype", "fp8_per_token_head"],
    "ssm_zero": ["--ssm", "zero"],
    "ssm_prefix_sum_flat": ["--ssm", "prefix_sum_flat"],
    "ssm_prefix_sum": ["--ssm", "prefix_sum"],
    "ssm_ema": ["--ssm", "ema"],
    "ssm_mamba1": ["--ssm", "mamba1", "--dtype", "float32"],
    "layer_gdn": ["--layer-kind", "gdn"],
    "layer_mamba2": ["--layer-kind", "mamba2", "--dtype", "float32"],
    "mm_prefix_range": ["--mm-prefix"],
    "num_accepted_tokens": ["--num-accepted-tokens"],
    "output_scale": ["--output-scale", "0.5"],
}
CASES = [f"roundtrip_{name}" for name in ROUNDTRIPS] + ["lazy_check_large_file", "lazy_indexing", "fp8_decode",
                                                         "import_without_path_changes", "tensor_parallel_rank_files"]


def package_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_DIR
    return env


def run(command, **kwargs):
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, **kwargs)
    if result.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, command))} exited {result.returncode}:\n"
                             f"{result.stdout}\n{result.stderr}")
    return result.stdout


def text(value):
    return value.decode() if isinstance(value, bytes) else value


def same_values(a, b):
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind == "f" or b.dtype.kind == "f":
        return np.array_equal(a.astype(np.float64), b.astype(np.float64), equal_nan=True)
    return np.array_equal(a, b)


def roundtrip(name, cli, workdir):
    source, result = os.path.join(workdir, "in.h5"), os.path.join(workdir, "out.h5")
    run([sys.executable, "-m", "hybridtb_h5.writer", source, *ROUNDTRIPS[name]], env=package_env(), cwd=workdir)
    run([cli, "info", source])
    run([cli, "run", "--quiet", "--force", "--batch", source, "--out", result])
    with h5py.File(source, "r") as a, h5py.File(result, "r") as b:
        tensors = []
        a.visititems(lambda path, obj: tensors.append(path) if isinstance(obj, h5py.Dataset) else None)
        for path in tensors:
            assert path in b, f"/{path} written by Python is missing after the C++ round trip"
            assert text(a[path].attrs["dtype_name"]) == text(b[path].attrs["dtype_name"]), path
            assert same_values(a[path][()], b[path][()]), f"/{path} changed in the round trip"
        for key, value in a["config"].attrs.items():
            assert key in b["config"].attrs, f"/config {key} lost in the round trip"
            value, back = text(value), text(b["config"].attrs[key])
            if key == "kv_cache_dtype" and value == "fp8":
                value = "fp8_e4m3"  # vLLM's platform fp8 is e4m3fn; SCHEMA.md §5.2: read as fp8_e4m3
            same = value == back if isinstance(value, str) else same_values(value, back)
            assert same, f"/config {key}: {value!r} != {back!r}"
        for key, value in (a["config/ssm"].attrs.items() if "config/ssm" in a else []):
            assert int(b["config/ssm"].attrs[key]) == int(value), f"/config/ssm {key}"
        assert int(b["batch"].attrs["num_actual_tokens"]) == int(a["batch"].attrs["num_actual_tokens"])

        # The outputs the item implies.
        actual = int(a["batch"].attrs["num_actual_tokens"])
        output = b["outputs/output"][()]
        assert output.shape[0] == a["batch/slot_mapping"].shape[0]
        assert np.isfinite(output[:actual]).all(), "every real token row of /outputs/output is computed"
        for pool in (a["inputs/ssm"].keys() if "inputs/ssm" in a else []):
            assert b[f"outputs/ssm/{pool}"].shape == a[f"inputs/ssm/{pool}"].shape, f"pool {pool} after the step"
        if "per_token_head" in text(a["config"].attrs["kv_cache_dtype"]):
            for cache in ("k_scale_cache", "v_scale_cache"):
                assert b[f"outputs/{cache}"].shape == a[f"inputs/{cache}"].shape
        if text(a["config"].attrs.get("ssm_mode", "none")) not in ("none", "gdn", "mamba2"):
            assert "outputs/ssm_output" in b, "a layer with an SSM branch writes its contribution"
        if "layer_kind" in a["config"].attrs and text(a["config"].attrs["layer_kind"]) != "full_attention":
            assert "outputs/attn_output" not in b and "inputs/query" not in b


def tensor_parallel_rank_files(cli, workdir):
    """`gen --tp 2` rank files (1.4) pass the reader's check; one without /inputs/ssm_hidden does not."""
    step = os.path.join(workdir, "step.h5")
    run([cli, "gen", "--preset", "mamba-2.8b", "--set", "ssm.intermediate_size=64", "--set", "ssm.dt_rank=4",
         "--mix", "d2@20+p1x8", "--tp", "2", "--quiet", "--out", step])
    sys.path.insert(0, PACKAGE_DIR)
    from hybridtb_h5.reader import check
    for rank in (0, 1):
        with h5py.File(os.path.join(workdir, f"step.tp2-rank{rank}.h5"), "r") as f:
            assert text(f.attrs["schema_version"]) == "1.4"
            assert int(f["config"].attrs["tp_rank"]) == rank and int(f["config"].attrs["tp_size"]) == 2
            assert check(f) == [], check(f)
    broken = os.path.join(workdir, "broken.h5")
    with h5py.File(os.path.join(workdir, "step.tp2-rank1.h5"), "r") as src, h5py.File(broken, "w") as dst:
        for key, value in src.attrs.items():
            dst.attrs[key] = value
        for name in src:
            src.copy(src[name], dst, name=name)
        del dst["inputs/ssm_hidden"]
    with h5py.File(broken, "r") as f:
        problems = check(f)
    assert any("missing dataset /inputs/ssm_hidden" in p for p in problems), problems


def peak_rss_of_python(code, *args):
    """Runs `code` in a fresh interpreter (hybridtb_h5 importable) and returns (stdout, peak RSS bytes, seconds)."""
    wrapped = code + "\nimport resource\nprint('RSS', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    start = time.monotonic()
    out = run([sys.executable, "-c", wrapped, *args], env=package_env())
    seconds = time.monotonic() - start
    rss = int(out.strip().splitlines()[-1].split()[1]) * 1024  # Linux: KiB
    return out, rss, seconds


def lazy_check(cli, workdir):
    path = os.path.join(workdir, "large.h5")
    # 8 decodes at context 16k on llama3-8b: a 512 MiB bf16 KV cache (removed again on success).
    run([cli, "gen", "--quiet", "--preset", "llama3-8b", "--mix", "d8@16k", "--out", path])
    size = os.path.getsize(path)
    assert size > 500 << 20, size
    out, rss, seconds = peak_rss_of_python(
        "import sys, h5py\nfrom hybridtb_h5 import check\n"
        "f = h5py.File(sys.argv[1], 'r')\nproblems = check(f)\nprint('PROBLEMS', problems)\n", path)
    assert "PROBLEMS []" in out, out
    # bf16 arrives as float32: loading the KV cache whole would take twice the file's size (a
    # reader that loads each dataset whole peaks at 2.3 GiB and takes ~100 s on this file), and
    # HDF5's own conversion of bf16 runs at ~10 MB/s.
    assert rss < 192 << 20, f"check() peaked at {rss >> 20} MiB on a {size >> 20} MiB file"
    assert seconds < 20, f"check() took {seconds:.1f} s"

    out, rss, seconds = peak_rss_of_python(
        "import sys, h5py, numpy as np\nfrom hybridtb_h5 import open_batch\n"
        "with open_batch(sys.argv[1]) as b, h5py.File(sys.argv[1], 'r') as f:\n"
        "    t = b['inputs/kv_cache']\n"
        "    assert t.shape == f['inputs/kv_cache'].shape and t.dtype_name == 'bfloat16'\n"
        "    block = t[7]\n"
        "    assert np.array_equal(block, f['inputs/kv_cache'][7], equal_nan=True)\n"
        "    assert b.config['num_heads'] == 32\n"
        "    assert np.array_equal(t[-3:-1, 1, :, 2], f['inputs/kv_cache'][-3:-1, 1, :, 2], equal_nan=True)\n"
        "    print('SLICE ok')\n"
        "    print('ROWS', block.shape)\n", path)
    assert "ROWS (2, 16, 8, 128)" in out, out
    assert "SLICE ok" in out, out
    assert rss < 128 << 20, f"opening and indexing one block peaked at {rss >> 20} MiB"
    assert seconds < 20, f"opening and indexing one block took {seconds:.1f} s"
    os.remove(path)


def lazy_indexing(workdir):
    """LazyTensor indexing of bfloat16 (its fast path reads raw bits) equals h5py's own conversion."""
    sys.path.insert(0, PACKAGE_DIR)  # this test process only; the package itself needs no such line
    from hybridtb_h5 import open_batch
    from hybridtb_h5.writer import to_bfloat16_bits, write_tensor
    path = os.path.join(workdir, "bf16.h5")
    values = np.random.default_rng(1).standard_normal((6, 3, 4)).astype("<f4")
    values[2, 1, 3] = np.nan
    with h5py.File(path, "w") as f:
        write_tensor(f, "float", values, "bfloat16")                      # the 2-byte float type
        f.create_dataset("bits", data=to_bfloat16_bits(values)).attrs["dtype_name"] = "bfloat16"  # uint16 bits
    keys = [(), Ellipsis, 0, 5, -1, slice(1, 4), slice(None, None, 2), slice(-2, None), slice(4, 2),
            (2, 1), (slice(1, 3), 0), (slice(None), slice(None), 3), (-3, slice(0, 2), 1), (1, Ellipsis),
            (Ellipsis, 2), [0, 3]]
    with open_batch(path) as b, h5py.File(path, "r") as f:
        expected_all = f["float"][()]  # h5py's conversion: the exact values
        for name in ("float", "bits"):
            t = b[name]
            for key in keys:
                got = t[key]
                want = expected_all[key]
                assert np.array_equal(np.asarray(got), want, equal_nan=True), f"{name}[{key!r}]: {got} != {want}"
                assert np.asarray(got).dtype == np.float32, f"{name}[{key!r}]"
        blocks = list(b["float"].blocks(max_bytes=3 * 4 * 2 * 2))  # two rows a block
        assert [start for start, _ in blocks] == [0, 2, 4]
        assert np.array_equal(np.concatenate([rows for _, rows in blocks]), expected_all, equal_nan=True)


def fp8_decode(workdir):
    sys.path.insert(0, PACKAGE_DIR)  # this test process only; the package itself needs no such line
    from hybridtb_h5 import open_batch
    from hybridtb_h5.writer import write_tensor
    path = os.path.join(workdir, "fp8.h5")
    landmarks = {  # byte -> value, from the OCP FP8 formats (E4M3: bias 7, no inf; E5M2: bias 15, IEEE)
        "float8_e4m3fn": {0x00: 0.0, 0x38: 1.0, 0xB8: -1.0, 0x7E: 448.0, 0x01: 2.0 ** -9, 0x08: 2.0 ** -6,
                          0x7F: np.nan, 0xFF: np.nan},
        "float8_e5m2": {0x00: 0.0, 0x3C: 1.0, 0xBC: -1.0, 0x7B: 57344.0, 0x01: 2.0 ** -16, 0x7C: np.inf,
                        0xFC: -np.inf, 0x7D: np.nan},
    }
    with h5py.File(path, "w") as f:
        for name, table in landmarks.items():
            write_tensor(f, name, np.array(list(table), dtype=np.uint8), name)
    with open_batch(path) as b:
        for name, table in landmarks.items():
            values = b[name][:]
            assert values.dtype == np.float32
            assert np.array_equal(values, np.array(list(table.values()), dtype=np.float32), equal_nan=True), \
                f"{name}: {values}"
            assert np.array_equal(b[name].raw[:], np.array(list(table), dtype=np.uint8))


def import_without_path_changes(workdir):
    code = ("import hybridtb_h5, hybridtb_h5.reader, hybridtb_h5.writer\n"
            "print(hybridtb_h5.__file__)\n"
            "print(sorted(n for n in hybridtb_h5.__all__ if not hasattr(hybridtb_h5, n)))\n")
    out = run([sys.executable, "-c", code], env=package_env(), cwd=workdir)
    assert out.splitlines()[0] == os.path.join(PACKAGE_DIR, "hybridtb_h5", "__init__.py"), out
    assert out.splitlines()[1] == "[]", out
    # The script names still import (the capture tests' fake engines and existing capture code use
    # them) and give the package's functions.
    code = ("import read_batch_h5py, write_batch_h5py, hybridtb_h5.reader as r, hybridtb_h5.writer as w\n"
            "assert write_batch_h5py.write_hybrid_batch is w.write_hybrid_batch\n"
            "assert write_batch_h5py.example_ssm is w.example_ssm and read_batch_h5py.check is r.check\n"
            "print('ok')\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(ROOT, "harness", "scripts")
    env.pop("PYTHONHOME", None)
    assert run([sys.executable, "-c", code], env=env, cwd=workdir).strip() == "ok"
    # And the capture module, which imports write_batch_h5py.
    env["PYTHONPATH"] = os.path.join(ROOT, "datasets", "capture")
    run([sys.executable, "-c", "import hybridtb_capture"], env=env, cwd=workdir)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("action", choices=["list", "check"])
    parser.add_argument("case", nargs="?")
    parser.add_argument("--cli")
    parser.add_argument("--workdir")
    args = parser.parse_args()
    if args.action == "list":
        print("\n".join(CASES))
        return
    os.makedirs(args.workdir, exist_ok=True)
    if args.case.startswith("roundtrip_"):
        roundtrip(args.case[len("roundtrip_"):], args.cli, args.workdir)
    elif args.case == "lazy_check_large_file":
        lazy_check(args.cli, args.workdir)
    elif args.case == "lazy_indexing":
        lazy_indexing(args.workdir)
    elif args.case == "fp8_decode":
        fp8_decode(args.workdir)
    elif args.case == "import_without_path_changes":
        import_without_path_changes(args.workdir)
    elif args.case == "tensor_parallel_rank_files":
        tensor_parallel_rank_files(args.cli, args.workdir)
    else:
        parser.error(f"unknown case {args.case!r} (see `list`)")
    print(f"{args.case}: ok")


if __name__ == "__main__":
    main()
