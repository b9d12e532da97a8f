#!/usr/bin/env python3
"""Put benchmark records side by side (see benches/README.md).

    python3 benches/compare.py results/*.json

Reads JSON lists of records from any of the scripts here or from `routed bench --json`, and prints
one row per engine and dtype, one column per model and scenario, each cell the median tokens/s.
When a cell has records from several files, the last one read wins. Kernel records (`us` per
launch: `routed bench kernels`, `torch_kernels.py`) get a second table, one row per case, each
engine's microseconds and GB/s, and the share of the device's copy bandwidth (`hbm_copy`).
"""

import json
import sys


def kernel_table(records):
    """Prints the kernel records side by side: per case, each engine's us and GB/s."""
    copy = [r["gb_per_s"] for r in records if r["scenario"] == "hbm_copy"]
    cases, engines, cells = [], [], {}
    for r in records:
        if r["scenario"] == "hbm_copy":
            continue
        case = (r["model"], r["scenario"])
        cases += [case] if case not in cases else []
        engines += [r["engine"]] if r["engine"] not in engines else []
        cells[case, r["engine"]] = r
    if copy:
        print(f"\ndevice copy bandwidth: {copy[-1]:,.0f} GB/s (hbm_copy)")
    print("\n| case | " + " | ".join(f"{e} us | {e} GB/s" for e in engines) + " |")
    print("|---|" + "---:|---:|" * len(engines))
    for case in cases:
        vals = []
        for e in engines:
            r = cells.get((case, e))
            if r is None:
                vals += ["", ""]
                continue
            share = f" ({100 * r['gb_per_s'] / copy[-1]:.0f} %)" if copy else ""
            vals += [f"{r['us']:,.2f}", f"{r['gb_per_s']:,.0f}{share}"]
        print(f"| {case[0]} {case[1]} | " + " | ".join(vals) + " |")


def main():
    cells, rows, cols, kernels = {}, [], [], []
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            for r in json.load(f):
                if "us" in r:
                    kernels.append(r)
                if "tokens_per_s" not in r:
                    continue
                row, col = (r["engine"], r["dtype"]), (r["model"], r["scenario"])
                rows += [row] if row not in rows else []
                cols += [col] if col not in cols else []
                cells[row, col] = r["tokens_per_s"]
    if not cells and not kernels:
        sys.exit("no records with tokens_per_s or us")
    if not cells:
        kernel_table(kernels)
        return
    print("| engine, dtype | " + " | ".join(f"{m} {s}" for m, s in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for row in rows:
        vals = [f"{cells[row, c]:,.1f}" if (row, c) in cells else "" for c in cols]
        print(f"| {row[0]} {row[1]} | " + " | ".join(vals) + " |")
    if kernels:
        kernel_table(kernels)


if __name__ == "__main__":
    main()
