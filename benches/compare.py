#!/usr/bin/env python3
"""Put benchmark records side by side (see benches/README.md).

    python3 benches/compare.py results/*.json

Reads JSON lists of records from any of the scripts here or from `routed bench --json`, and prints
one row per engine and dtype, one column per model and scenario, each cell the median tokens/s.
When a cell has records from several files, the last one read wins.
"""

import json
import sys


def main():
    cells, rows, cols = {}, [], []
    for path in sys.argv[1:]:
        with open(path, encoding="utf-8") as f:
            for r in json.load(f):
                if "tokens_per_s" not in r:
                    continue
                row, col = (r["engine"], r["dtype"]), (r["model"], r["scenario"])
                rows += [row] if row not in rows else []
                cols += [col] if col not in cols else []
                cells[row, col] = r["tokens_per_s"]
    if not cells:
        sys.exit("no records with tokens_per_s")
    print("| engine, dtype | " + " | ".join(f"{m} {s}" for m, s in cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for row in rows:
        vals = [f"{cells[row, c]:,.1f}" if (row, c) in cells else "" for c in cols]
        print(f"| {row[0]} {row[1]} | " + " | ".join(vals) + " |")


if __name__ == "__main__":
    main()
