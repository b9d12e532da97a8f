#!/usr/bin/env python3
"""Where a profiled run's device time went, kernel by kernel, from Nsight Compute's per-kernel
summary (`ncu --print-summary per-kernel --csv --metrics gpu__time_duration.sum`).

    python3 benches/kernel_profile.py profile-qwen3_moe-decode-b1-bf16.csv [--top 12]

A kernel name appears once per launch shape (grid and block), as ncu summarises it; each line
gives the shape's launches, its mean time and its total (launches times mean), and its share of
the profile's whole. The last line printed is the summary (benches/gpu_session.sh notes it).
"""

import argparse
import csv
import sys


def rows(path):
    """(name, grid, block, launches, mean_us) of every kernel shape in the summary."""
    with open(path, newline="") as f:
        lines = [r for r in csv.reader(f) if r]
    # ncu prints its notes (==PROF==, warnings) before the table.
    at = next((i for i, r in enumerate(lines) if "Kernel Name" in r), None)
    if at is None:
        sys.exit(f"{path}: no per-kernel summary (no 'Kernel Name' column)")
    header = lines[at]
    col = {name: header.index(name) for name in ("Kernel Name", "Grid Size", "Block Size",
                                                 "Invocations", "Metric Name", "Metric Unit",
                                                 "Average")}
    out = []
    for r in lines[at + 1:]:
        if len(r) < len(header) or r[col["Metric Name"]] != "gpu__time_duration.sum":
            continue
        scale = {"ns": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}.get(
            r[col["Metric Unit"]].strip(), 1e-3)
        mean = float(r[col["Average"]].replace(",", "")) * scale
        out.append((r[col["Kernel Name"]], r[col["Grid Size"]], r[col["Block Size"]],
                    int(r[col["Invocations"]].replace(",", "")), mean))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu's per-kernel summary as CSV")
    ap.add_argument("--top", type=int, default=12, help="kernel shapes listed, largest first")
    args = ap.parse_args()
    shapes = rows(args.csv)
    if not shapes:
        sys.exit(f"{args.csv}: the summary lists no kernel time")
    total = sum(n * mean for _, _, _, n, mean in shapes)
    shapes.sort(key=lambda s: s[3] * s[4], reverse=True)
    print("| kernel | grid | block | launches | mean us | total us | share |")
    print("|---|---|---|---:|---:|---:|---:|")
    for name, grid, block, n, mean in shapes[:args.top]:
        print(f"| {name} | {grid} | {block} | {n} | {mean:.2f} | {n * mean:.0f} | "
              f"{100 * n * mean / total:.1f} % |")
    launches = sum(s[3] for s in shapes)
    name, _, _, n, mean = shapes[0]
    print(f"{launches} launches, {total:.0f} us in all; largest: {name} "
          f"{100 * n * mean / total:.0f} % ({n} x {mean:.1f} us)")


if __name__ == "__main__":
    main()
