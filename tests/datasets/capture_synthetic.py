#!/usr/bin/env python3
"""Drives datasets/capture/hybridtb_capture.py with synthetic numpy tensors (run by test_datasets).

  capture   --dir D                      capture one step of layer "layers.0.attn" WITHOUT /expected
  roundtrip --dir D --expected-from F    capture the same step again, /expected = F's recorded /expected
  gating    --dir D                      checks the layer filter, every-Nth-step, file/byte budgets, atomic writes
"""
import argparse
import os
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "datasets", "capture"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "harness", "scripts"))
import hybridtb_capture as cap  # noqa: E402
import write_batch_h5py as wb  # noqa: E402

LAYER = "layers.0.attn"


def synthetic_step():
    """The example batch of write_batch_h5py (2 decodes + a 4-token prefill, 2 CUDA-graph padding
    rows, bf16, sinks) with a prefix_sum SSM pool; bf16 tensors passed as uint16 bits, as
    `t.view(torch.int16)` gives them."""
    config, batch, inputs = wb.example_batch("bfloat16", "auto", seed=3)
    ssm = wb.example_ssm("prefix_sum", config, inputs["kv_cache"].shape[0], seed=3)
    for key in ("query", "key", "value", "kv_cache"):
        inputs[key] = (wb.to_bfloat16_bits(inputs[key]), "bfloat16")
    return config, batch, inputs, ssm


def read_group(g):
    out = {}
    for key, ds in g.items():
        if isinstance(ds, h5py.Dataset):
            out[key] = (ds[()], ds.attrs.get("dtype_name", None))
    return out


def recorded_expected(path):
    with h5py.File(path, "r") as f:
        e = f["expected"]
        expected = {k: (v if v[1] else v[0]) for k, v in read_group(e).items()}
        if "ssm" in e:
            expected["ssm"] = read_group(e["ssm"])
        metadata = {}

        def visit(name, obj):
            for attr, value in obj.attrs.items():
                if attr != "dtype_name":
                    metadata[f"{name}/{attr}"] = int(value)
            if isinstance(obj, h5py.Dataset):
                metadata[name] = obj[()]
        if "metadata" in e:
            for attr, value in e["metadata"].attrs.items():
                metadata[attr] = int(value)
            e["metadata"].visititems(visit)
        expected["metadata"] = metadata
    return expected


def capture_once(directory, expected=None):
    """begin() copies the inputs; the low-level writer stores them under a fixed name (the engine
    hooks name files by rank, pid, layer and step: tests/capture/)."""
    c = cap.Capturer(directory)
    assert c.enabled and c.should_capture(LAYER)
    config, batch, inputs, ssm = synthetic_step()
    pending = c.begin(LAYER, config, batch, inputs, ssm)
    # A forward would now write the KV cache and the pools in place: the snapshot must not change.
    inputs["kv_cache"][0][...] = 0
    path = os.path.join(directory, f"capture_{LAYER}_step0.h5")
    return cap.write_capture(path, pending["config"], pending["batch"], pending["inputs"], pending["ssm"], expected,
                             pending["provenance"])


def gating(directory):
    assert not cap.Capturer.from_env({}).enabled
    assert not cap.Capturer.from_env({}).should_capture(LAYER)
    c = cap.Capturer.from_env({"HYBRIDTB_CAPTURE_DIR": directory, "HYBRIDTB_CAPTURE_LAYERS": "layers.1*, *.attn2",
                               "HYBRIDTB_CAPTURE_MAX_FILES": "3", "HYBRIDTB_CAPTURE_EVERY_N_STEPS": "2"})
    written = []
    for step in range(6):
        for layer in ("layers.0.attn", "layers.1.attn", "layers.7.attn2"):
            if c.should_capture(layer):
                config, batch, inputs, ssm = synthetic_step()
                written.append(c.finish(c.begin(layer, config, batch, inputs, ssm)))
    names = sorted(os.path.basename(p) for p in written)
    pid = os.getpid()
    assert names == [f"capture_r0_p{pid}_layers.1.attn_s000000.h5", f"capture_r0_p{pid}_layers.1.attn_s000002.h5",
                     f"capture_r0_p{pid}_layers.7.attn2_s000000.h5"], names
    assert sorted(os.listdir(directory)) == names, os.listdir(directory)  # no temp files left behind
    # Byte budget: the first file exceeds 1 byte, so nothing after it.
    d2 = os.path.join(directory, "bytes")
    c = cap.Capturer(d2, max_bytes=1)
    assert c.should_capture(LAYER)
    config, batch, inputs, ssm = synthetic_step()
    c.finish(c.begin(LAYER, config, batch, inputs, ssm))
    assert not c.should_capture(LAYER)
    # A failed write leaves nothing: the temp file is removed, no file appears.
    d3 = os.path.join(directory, "fail")
    c = cap.Capturer(d3)
    c.should_capture(LAYER)
    config, batch, inputs, ssm = synthetic_step()
    config["kv_cache_dtype"] = "not_a_kv_cache_dtype"  # fails inside the writer, after the temp file exists
    try:
        c.finish(c.begin(LAYER, config, batch, inputs, ssm))
        raise AssertionError("expected a failure")
    except ValueError as e:
        assert "kv_cache_dtype" in str(e), e
    assert os.listdir(d3) == [], os.listdir(d3)
    print("gating ok")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["capture", "roundtrip", "gating"])
    p.add_argument("--dir", required=True)
    p.add_argument("--expected-from")
    a = p.parse_args()
    if a.mode == "capture":
        print(capture_once(a.dir))
    elif a.mode == "roundtrip":
        print(capture_once(a.dir, recorded_expected(a.expected_from)))
    else:
        gating(a.dir)


if __name__ == "__main__":
    main()
