#!/usr/bin/env python3
"""How busy the device was over a traced run, from Nsight Systems' `cuda_gpu_trace` report.

    python3 benches/timeline.py timeline-qwen3_moe-decode-b1_cuda_gpu_trace.csv [--gap-us 10]

Every row of the report (kernels and copies) is device activity from its start for its duration.
The span runs from the first start to the last end; what the union of the rows leaves of it is
the device waiting, for the host to launch, to copy, to decide the next step. The gaps longer
than `--gap-us` are listed by size, since a step's host work shows as one such gap per step. The
last line printed is the summary (benches/gpu_session.sh notes it).
"""

import argparse
import csv
import statistics
import sys


def column(header, prefix):
    """The index of the first column whose name starts with `prefix` (nsys adds units)."""
    for i, name in enumerate(header):
        if name.strip().startswith(prefix):
            return i
    sys.exit(f"no column starting with {prefix!r} in {header}")


def intervals(path):
    """(start, end) in ns of every row, sorted."""
    with open(path, newline="") as f:
        rows = [r for r in csv.reader(f) if r]
    # nsys may print notes before the table: the header is the first row naming a start.
    at = next(i for i, r in enumerate(rows) if any(c.strip().startswith("Start") for c in r))
    header, body = rows[at], rows[at + 1:]
    start, duration = column(header, "Start"), column(header, "Duration")
    out = []
    for r in body:
        try:
            s, d = float(r[start]), float(r[duration])
        except (ValueError, IndexError):
            continue
        out.append((s, s + d))
    return sorted(out)


def gaps(spans):
    """The union's busy time and the gaps between its pieces, in ns."""
    busy, holes = 0.0, []
    cur_start, cur_end = spans[0]
    for s, e in spans[1:]:
        if s > cur_end:
            busy += cur_end - cur_start
            holes.append(s - cur_end)
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    busy += cur_end - cur_start
    return busy, holes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="the cuda_gpu_trace report as CSV")
    ap.add_argument("--gap-us", type=float, default=10.0, help="gaps listed from this long (us)")
    args = ap.parse_args()
    spans = intervals(args.trace)
    if not spans:
        sys.exit("no device activity in the trace")
    busy, holes = gaps(spans)
    span = spans[-1][1] - spans[0][0]
    long = sorted((h for h in holes if h >= args.gap_us * 1e3), reverse=True)
    print(f"{len(spans)} kernels and copies over {span / 1e6:.3f} ms")
    if long:
        print(f"gaps of {args.gap_us:g} us or more: {len(long)}, median "
              f"{statistics.median(long) / 1e3:.1f} us, largest "
              + ", ".join(f"{h / 1e3:.1f}" for h in long[:10]) + " us")
    idle = span - busy
    print(f"device busy {busy / 1e6:.3f} ms of {span / 1e6:.3f} ms ({100 * busy / span:.1f} %); "
          f"idle {idle / 1e6:.3f} ms, {sum(long) / 1e6:.3f} ms of it in {len(long)} gaps of "
          f"{args.gap_us:g} us or more")


if __name__ == "__main__":
    main()
