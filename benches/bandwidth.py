#!/usr/bin/env python3
"""Memory read bandwidth of this machine, the ceiling of batch-1 decode (see benches/README.md).

    python3 benches/bandwidth.py [--threads 1 2] [--gib 2] [--runs 5] [--passes 5] [--json FILE] [--torch]

Compiles a small C program (gcc -O3 -march=native -fopenmp) into target/bench/, which sums a
GIB GiB float buffer with THREADS OpenMP threads, 4 independent vector accumulators each
(AVX-512 loads when the CPU has them, else AVX2, else scalar), one untimed pass and PASSES timed
passes, printing GB/s (1e9 bytes/s) per pass. One run is one such program, its figure the median
pass; runs are taken as in the baselines (a warm-up, then RUNS runs, each when other work leaves
the CPU alone; see benchlib.measure). With --torch it also times Tensor.sum() and a bf16
matrix-vector product of the lm_head's shape (151936 x 1024) with torch.set_num_threads.
Needs only python3 and gcc; the records follow the baselines' JSON schema, with
engine "c-openmp" / "torch", scenario "read_bw" / "bf16_matvec", and GB/s in "gb_per_s".
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import host, measure, write_records  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

C_SOURCE = r"""
#include <immintrin.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double now(void) { return omp_get_wtime(); }

/* Sum of x[lo, hi) with four independent accumulators, so that loads, not adds, set the pace. */
static float sum_range(const float *x, size_t lo, size_t hi) {
    size_t i = lo;
#if defined(__AVX512F__)
    __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
    for (; i + 64 <= hi; i += 64) {
        a = _mm512_add_ps(a, _mm512_load_ps(x + i));
        b = _mm512_add_ps(b, _mm512_load_ps(x + i + 16));
        c = _mm512_add_ps(c, _mm512_load_ps(x + i + 32));
        d = _mm512_add_ps(d, _mm512_load_ps(x + i + 48));
    }
    float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
#elif defined(__AVX2__)
    __m256 a = _mm256_setzero_ps(), b = a, c = a, d = a;
    for (; i + 32 <= hi; i += 32) {
        a = _mm256_add_ps(a, _mm256_load_ps(x + i));
        b = _mm256_add_ps(b, _mm256_load_ps(x + i + 8));
        c = _mm256_add_ps(c, _mm256_load_ps(x + i + 16));
        d = _mm256_add_ps(d, _mm256_load_ps(x + i + 24));
    }
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(_mm256_add_ps(a, b), _mm256_add_ps(c, d)));
    float s = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
#else
    float a = 0, b = 0, c = 0, d = 0;
    for (; i + 4 <= hi; i += 4) { a += x[i]; b += x[i + 1]; c += x[i + 2]; d += x[i + 3]; }
    float s = a + b + c + d;
#endif
    for (; i < hi; i++) s += x[i];
    return s;
}

int main(int argc, char **argv) {
    size_t bytes = (size_t)(atof(argv[1]) * (1ull << 30));
    int runs = atoi(argv[2]);
    size_t n = bytes / sizeof(float) / 64 * 64;
    float *x = aligned_alloc(64, n * sizeof(float));
    if (!x) { fprintf(stderr, "out of memory\n"); return 1; }
    int threads = omp_get_max_threads();
    /* first touch from the threads that will read, so pages sit near them */
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) x[i] = (float)(i & 1023) * 1e-3f;
    double sink = 0;
    for (int r = -1; r < runs; r++) {
        double t0 = now(), total = 0;
        #pragma omp parallel reduction(+ : total)
        {
            int id = omp_get_thread_num(), nt = omp_get_num_threads();
            size_t chunk = n / nt / 64 * 64;
            size_t lo = id * chunk, hi = id == nt - 1 ? n : lo + chunk;
            total += sum_range(x, lo, hi);
        }
        double dt = now() - t0;
        sink += total;
        if (r >= 0) printf("%.3f\n", n * sizeof(float) / dt / 1e9);
    }
    fprintf(stderr, "threads %d, %zu bytes, checksum %g\n", threads, n * sizeof(float), sink);
    free(x);
    return 0;
}
"""


def build(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    src = os.path.join(out_dir, "bandwidth.c")
    exe = os.path.join(out_dir, "bandwidth")
    with open(src, "w", encoding="utf-8") as f:
        f.write(C_SOURCE)
    subprocess.run(["gcc", "-O3", "-march=native", "-fopenmp", src, "-o", exe], check=True)
    return exe


def c_pass(exe, threads, gib, passes):
    """One run of the C program: the median GB/s of its `passes` timed passes."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), OMP_PROC_BIND="spread", OMP_PLACES="cores")
    res = subprocess.run([exe, str(gib), str(passes)], env=env, check=True, capture_output=True, text=True)
    return statistics.median(float(line) for line in res.stdout.split())


def torch_rates(threads, gib, args):
    import torch

    torch.set_num_threads(threads)
    x = torch.ones(int(gib * (1 << 30)) // 4, dtype=torch.float32)

    def sum_pass():
        t0 = time.perf_counter()
        x.sum()
        return x.numel() * 4 / (time.perf_counter() - t0) / 1e9

    sums = measure(sum_pass, args.runs, args.max_others, args.retries, args.quiet_wait)
    x = None  # the buffer is freed before the product's weights are made
    w = torch.randn(151936, 1024).to(torch.bfloat16)
    v = torch.randn(1024).to(torch.bfloat16)

    def matvec_pass():
        t0 = time.perf_counter()
        w @ v
        return w.numel() * 2 / (time.perf_counter() - t0) / 1e9

    return sums, measure(matvec_pass, args.runs, args.max_others, args.retries, args.quiet_wait), torch.__version__


def rec(engine, scenario, measured, **extra):
    runs, others, dropped = measured
    r = {"engine": engine, "dtype": "f32", "model": None, "scenario": scenario,
         "gb_per_s": round(statistics.median(runs), 2), "runs": [round(x, 2) for x in runs],
         "others_cpu": others, "dropped_runs": dropped}
    r.update(extra)
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[2], help="thread counts to measure")
    ap.add_argument("--gib", type=float, default=2.0, help="buffer size in GiB")
    ap.add_argument("--runs", type=int, default=5, help="measured runs (after one warm-up)")
    ap.add_argument("--passes", type=int, default=5,
                    help="timed passes over the buffer in one run of the C program (after one untimed)")
    ap.add_argument("--max-others", type=float, default=0.1,
                    help="repeat a run during which other work used more than this share of the CPU time")
    ap.add_argument("--retries", type=int, default=5, help="at most this many repeated runs per measurement")
    ap.add_argument("--quiet-wait", type=float, default=60.0,
                    help="seconds to wait at most, before each run, for other work to go below --max-others")
    ap.add_argument("--torch", action="store_true", help="also measure with torch (must be importable)")
    ap.add_argument("--json", help="write the records to this file (a JSON list)")
    args = ap.parse_args()

    exe = build(os.path.join(REPO, "target", "bench"))
    records = []
    for t in args.threads:
        runs = measure(lambda: c_pass(exe, t, args.gib, args.passes), args.runs, args.max_others, args.retries,
                       args.quiet_wait)
        records.append(rec("c-openmp", "read_bw", runs, threads=t, buffer_gib=args.gib, passes=args.passes,
                           **host()))
        if args.torch:
            sums, mv, version = torch_rates(t, args.gib, args)
            records.append(rec("torch", "read_bw", sums, threads=t, buffer_gib=args.gib, torch=version, **host()))
            records.append(rec("torch", "bf16_matvec", mv, threads=t, shape=[151936, 1024], torch=version,
                               **host()))
            records[-1]["dtype"] = "bf16"
    for r in records:
        runs = ", ".join(f"{x:.1f}" for x in r["runs"])
        print(f"{r['engine']:<9} {r['scenario']:<12} threads {r['threads']}: median {r['gb_per_s']:.1f} GB/s "
              f"(max {max(r['runs']):.1f}) [{runs}]  others' CPU <= {max(r['others_cpu']):.0%}, "
              f"{r['dropped_runs']} runs repeated")
    if args.json:
        write_records(args.json, records)


if __name__ == "__main__":
    main()
