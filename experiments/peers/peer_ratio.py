#!/usr/bin/env python3
"""Joins hybridtb_bench_attention's JSON with the peers' JSON files (same case names, same run):
the PyTorch peer (torch_attention_peer.py: sdpa, flex) and, when given, vLLM's Triton kernel
(vllm_attention_peer.py: vllm = its attention call, vllm_step = KV write + attention). Prints, per
case, our median beside each peer's and the speed ratio peer_us / ours_us (> 1: hybridtb is faster).
Writes the joined table as JSON with --out.

    python3 experiments/peers/peer_ratio.py bench.json peer.json [peer-vllm.json] [--out ratios.json]
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ours")
    parser.add_argument("peer", nargs="+")
    parser.add_argument("--out")
    args = parser.parse_args()
    with open(args.ours) as f:
        ours = {c["name"]: c for c in json.load(f)["cases"]}
    peer_cases = []
    for path in args.peer:
        with open(path) as f:
            peer_cases += json.load(f)["cases"]
    names = [n for n in ("sdpa", "flex", "vllm", "vllm_step") if any(c.get("peer") == n for c in peer_cases)]
    peers = {}
    for c in peer_cases:
        peers.setdefault(c["name"], {})[c["peer"]] = c
    rows = []
    print(f"{'case':<22} {'ours_us':>9} " + " ".join(f"{n + '_us':>12}" for n in names) + " " +
          " ".join(f"{n + '/ours':>14}" for n in names))
    for name, mine in ours.items():
        row = {"name": name, "ours_us": mine["median_us"]}
        cells = []
        for peer in names:
            entry = peers.get(name, {}).get(peer)
            if entry is None or "median_us" not in entry:
                row[f"{peer}_us"] = None
                row[f"{peer}_ratio"] = None
                row[f"{peer}_note"] = entry.get("skipped") if entry else "not run"
                continue
            row[f"{peer}_us"] = entry["median_us"]
            row[f"{peer}_ratio"] = entry["median_us"] / mine["median_us"]
        for key in [n + "_us" for n in names] + [n + "_ratio" for n in names]:
            value = row[key]
            width = 14 if "ratio" in key else 12
            cells.append(f"{value:>{width}.2f}" if value is not None and "ratio" in key else
                         f"{value:>{width}.1f}" if value is not None else f"{'-':>{width}}")
        print(f"{name:<22} {mine['median_us']:>9.1f} " + " ".join(cells))
        rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"ratios": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
