#!/usr/bin/env python3
"""Joins hybridtb_bench_ssm's JSON with the PyTorch mamba1 peer's JSON (same case names, same run)
and prints, per case, our median beside the peer's and the speed ratio peer_us / ours_us (> 1:
hybridtb is faster), with our % of the bound the benchmark measured. Writes the table as JSON
with --out.

    python3 experiments/peers/peer_ratio_ssm.py bench-ssm.json peer-ssm.json [--out ratios.json]
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ours")
    parser.add_argument("peer")
    parser.add_argument("--out")
    args = parser.parse_args()
    with open(args.ours) as f:
        ours_doc = json.load(f)
    with open(args.peer) as f:
        peer_doc = json.load(f)
    peers = {}
    for c in peer_doc["cases"]:
        peers.setdefault(c["name"], []).append(c)
    rows = []
    print(f"ours: {ours_doc.get('gpu', '?')}; peer: {peer_doc.get('environment', {}).get('device', '?')}")
    print(f"{'case':<18} {'ours_us':>10} {'%bound':>7} {'peer':<12} {'peer_us':>11} {'peer/ours':>10}")
    status = 0
    for mine in ours_doc["cases"]:
        name = mine.get("name")
        if name is None or "median_us" not in mine:
            continue
        bound = mine.get("pct_of_copy_bw", mine.get("pct_of_bound"))
        bound_text = f"{bound:>6.1f}%" if bound is not None else f"{'-':>7}"
        entries = peers.get(name) or [{"peer": "-", "skipped": "not run"}]
        for entry in entries:
            row = {"name": name, "ours_us": mine["median_us"], "ours_pct_of_bound": bound, "peer": entry["peer"]}
            if "median_us" in entry:
                row["peer_us"] = entry["median_us"]
                row["ratio"] = entry["median_us"] / mine["median_us"]
                print(f"{name:<18} {mine['median_us']:>10.1f} {bound_text} {entry['peer']:<12} "
                      f"{entry['median_us']:>11.1f} {row['ratio']:>10.2f}")
            else:
                row["peer_us"] = None
                row["ratio"] = None
                row["note"] = entry.get("skipped", "not run")
                print(f"{name:<18} {mine['median_us']:>10.1f} {bound_text} {entry['peer']:<12} "
                      f"{'-':>11} {'-':>10}  ({row['note'][:60]})")
            rows.append(row)
    if not rows:
        print("no case of the benchmark has a name and a median_us", file=sys.stderr)
        status = 1
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"ratios": rows}, f, indent=2)
    return status


if __name__ == "__main__":
    sys.exit(main())
