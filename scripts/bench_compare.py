#!/usr/bin/env python3
"""Compares Google Benchmark JSON files case by case: the median real time of each case in each
file, and each file's ratio to the first (the baseline), summarized as the median and range of
the ratios per benchmark family. Several files of the same binary (interleaved runs) may be given
for one label as LABEL=FILE1,FILE2: the median is taken over all their repetitions.

usage: bench_compare.py BASE=old1.json,old2.json NEW=new1.json,new2.json [...]
"""
import json
import statistics
import sys
from collections import defaultdict


def medians(paths):
    times = defaultdict(list)
    for path in paths:
        with open(path) as f:
            for b in json.load(f)["benchmarks"]:
                if b.get("run_type") == "aggregate":
                    continue
                times[b["run_name"]].append(b["real_time"])
    return {name: statistics.median(t) for name, t in times.items()}


def main(args):
    if len(args) < 2:
        sys.exit(__doc__)
    runs = []
    for arg in args:
        label, _, files = arg.partition("=")
        runs.append((label, medians(files.split(","))))
    base_label, base = runs[0]
    for label, data in runs[1:]:
        families = defaultdict(list)
        for name, t in data.items():
            if name in base:
                families[name.split("/")[0]].append(t / base[name])
        print(f"{label} / {base_label}: median time ratio per family (min .. max over cases)")
        for family, ratios in sorted(families.items()):
            print(f"  {family:28s} {statistics.median(ratios):5.3f}  ({min(ratios):.3f} .. {max(ratios):.3f}, "
                  f"{len(ratios)} cases)")
        everything = [r for ratios in families.values() for r in ratios]
        print(f"  {'all':28s} {statistics.median(everything):5.3f}  ({len(everything)} cases)")


if __name__ == "__main__":
    main(sys.argv[1:])
