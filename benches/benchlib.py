"""Pieces shared by the baseline scripts: the prompts, the record format, the table.

Pure Python (no numpy, no torch) so that every benchmark venv can import it.
"""

import json
import os
import platform
import statistics
import time

# Prompt ids are drawn from the 151,643 ordinary (non-special) tokens of the Qwen3 vocabulary.
ORDINARY_TOKENS = 151643
MASK64 = (1 << 64) - 1


def prompt_ids(seed, n):
    """`n` pseudo-random token ids: xorshift64 (13, 7, 17) from state seed * 0x9E3779B97F4A7C15 | 1,
    each id = state % 151643. Seeds: 0 for the pp512 prompt, 1..B for the B decode prompts."""
    x = ((seed * 0x9E3779B97F4A7C15) & MASK64) | 1
    out = []
    for _ in range(n):
        x ^= (x << 13) & MASK64
        x ^= x >> 7
        x ^= (x << 17) & MASK64
        out.append(x % ORDINARY_TOKENS)
    return out


def _machine_cpu_s():
    """(busy, total) CPU seconds of all cores since boot, from /proc/stat; steal counts as busy."""
    with open("/proc/stat", encoding="ascii") as f:
        user, nice, system, idle, iowait, irq, softirq, steal = (int(x) for x in f.readline().split()[1:9])
    hz = os.sysconf("SC_CLK_TCK")
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return (total - idle - iowait) / hz, total / hz


class OthersClock:
    """Measures the share of the machine's CPU time that anything but this process used while the
    block ran (other processes, and the hypervisor's steal time): 0.5 on a 2-core machine means
    one core was taken away."""

    def __enter__(self):
        self.busy0, self.total0 = _machine_cpu_s()
        t = os.times()  # this process and the children it has waited for
        self.own0 = t.user + t.system + t.children_user + t.children_system
        return self

    def __exit__(self, *exc):
        busy1, total1 = _machine_cpu_s()
        t = os.times()
        others = (busy1 - self.busy0) - (t.user + t.system + t.children_user + t.children_system - self.own0)
        self.share = max(0.0, others) / max(total1 - self.total0, 1e-9)
        return False


def wait_for_quiet(max_others, timeout_s):
    """Sleeps in 1 s steps until other work uses at most `max_others` of the CPU time, or
    `timeout_s` has passed. Returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        with OthersClock() as clock:
            time.sleep(1.0)
        if clock.share <= max_others:
            break
    return time.monotonic() - t0


def measure(run, runs, max_others=0.1, retries=5, quiet_wait_s=60.0):
    """One warm-up call of `run`, then `runs` measured calls, each returning tokens/s.

    The machines this is meant for are shared: before each call it waits (up to `quiet_wait_s`)
    for other work to use at most `max_others` of the CPU time, and a call during which other
    work took more than that is thrown away and repeated, at most `retries` times in all; after
    that, calls are kept whatever the load. Returns (rates, others' share of the CPU time during
    each kept call, number of calls thrown away)."""
    run()
    rates, shares, dropped = [], [], 0
    while len(rates) < runs:
        wait_for_quiet(max_others, quiet_wait_s)
        with OthersClock() as clock:
            rate = run()
        if clock.share > max_others and dropped < retries:
            dropped += 1
            continue
        rates.append(rate)
        shares.append(round(clock.share, 3))
    return rates, shares, dropped


def record(engine, dtype, model, scenario, runs, **extra):
    """One JSON record (schema in benches/README.md); `runs` are tokens/s of the measured runs."""
    r = {
        "engine": engine,
        "dtype": dtype,
        "model": model,
        "scenario": scenario,
        "tokens_per_s": round(statistics.median(runs), 2),
        "runs": [round(x, 2) for x in runs],
    }
    r.update(extra)
    return r


def host():
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    # The 1-minute load average when the record is written: above the thread count, other work was
    # competing for the cores and the figure is low.
    try:
        load = round(os.getloadavg()[0], 2)
    except OSError:
        load = None
    return {"cpu": cpu, "loadavg_1m": load, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def print_table(records):
    print(f"{'engine':<13} {'dtype':<5} {'model':<11} {'scenario':<8} {'tok/s':>9}  runs")
    for r in records:
        runs = ", ".join(f"{x:.1f}" for x in r["runs"])
        note = ""
        if r.get("others_cpu"):
            note = f"  others' CPU <= {max(r['others_cpu']):.0%}, {r.get('dropped_runs', 0)} runs repeated"
        print(f"{r['engine']:<13} {r['dtype']:<5} {r['model']:<11} {r['scenario']:<8} "
              f"{r['tokens_per_s']:>9.1f}  [{runs}]{note}", flush=True)


def write_records(path, records):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(records, f, indent=2)
        f.write("\n")


def add_scenario_args(ap):
    """The scenario, repetition and noise-guard flags every baseline script shares."""
    ap.add_argument("--runs", type=int, default=5, help="measured runs per scenario (after one warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512, help="prompt tokens of the prefill test (0: skip it)")
    ap.add_argument("--decode", type=int, default=64, help="decode steps measured")
    ap.add_argument("--decode-prompt", type=int, default=16, help="prompt tokens per sequence before decoding")
    ap.add_argument("--batches", type=int, nargs="*", default=[1, 8])
    ap.add_argument("--max-others", type=float, default=0.1,
                    help="repeat a run during which other work used more than this share of the CPU time")
    ap.add_argument("--retries", type=int, default=5, help="at most this many repeated runs per scenario")
    ap.add_argument("--quiet-wait", type=float, default=60.0,
                    help="seconds to wait at most, before each run, for other work to go below --max-others")
    ap.add_argument("--json", help="write the records to this file (a JSON list)")
