#!/usr/bin/env python3
"""Interleaved A/B of compiled mode against header-only use (benchmarks/compiled_mode_bench.cpp).

Runs the header-only binary A and the compiled-mode binary B alternately, ROUNDS times each
(A, B, A, B, ...: drifting load on a shared machine affects both alike), every run with
--benchmark_format=json, and prints per benchmark the median CPU time of each and the ratio of
the medians B / A (1.00: as fast), with the bound rows (bound/...) beside them.

  scripts/bench_compiled_ab.py A B [--rounds N] [--min-time S]

Exit status: 0, or 1 when a binary fails or the two list different benchmarks.
"""

import argparse
import json
import statistics
import subprocess
import sys


def run(binary, min_time):
    out = subprocess.run([binary, "--benchmark_format=json", f"--benchmark_min_time={min_time}"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"bench_compiled_ab: {binary} exited with status {out.returncode}:\n{out.stderr[-2000:]}")
    data = json.loads(out.stdout)
    return {b["name"]: b["cpu_time"] for b in data["benchmarks"] if b.get("run_type", "iteration") == "iteration"}, \
        {b["name"]: b["time_unit"] for b in data["benchmarks"]}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("header_only")
    p.add_argument("compiled")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-time", default="0.2")
    a = p.parse_args()
    samples = {"A": {}, "B": {}}
    units = {}
    for r in range(a.rounds):
        for key, binary in (("A", a.header_only), ("B", a.compiled)):
            times, u = run(binary, a.min_time)
            units.update(u)
            for name, t in times.items():
                samples[key].setdefault(name, []).append(t)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    if set(samples["A"]) != set(samples["B"]):
        sys.exit("bench_compiled_ab: the two binaries list different benchmarks")
    print(f"{'benchmark':34s} {'header-only':>12s} {'compiled':>12s} {'B/A':>6s}   (median CPU time of {a.rounds} "
          f"interleaved runs each)")
    for name in samples["A"]:
        ma, mb = statistics.median(samples["A"][name]), statistics.median(samples["B"][name])
        unit = units.get(name, "")
        print(f"{name:34s} {ma:10.1f}{unit:>2s} {mb:10.1f}{unit:>2s} {mb / ma:6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
