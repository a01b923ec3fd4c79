#!/usr/bin/env python3
"""Markdown tables from the JSON output of benchmarks/verify_bench.

    build/bench/benchmarks/verify_bench --benchmark_min_time=0.05 --benchmark_repetitions=5 \
        --benchmark_report_aggregates_only=true --benchmark_out=verify.json --benchmark_out_format=json
    python3 scripts/bench_verify_report.py verify.json [--time real|cpu]

For every case (the benchmark name after "BM_<impl>/") it prints the median time of one call of
specdec::verify, of the log-sum-exp bound and of the naive implementation, and the ratios
verify/bound and naive/verify; then the median ratios to the bound per regime over V >= 32000;
then drafter-side sampling against its bounds and naive version. A benchmark iteration of
verify_bench runs a batch of K calls (counter "calls"); times here are per call. Medians come
from the "median" aggregates when the run had --benchmark_repetitions, else from the median of the
plain runs of each benchmark. Reads a file or, with "-", standard input. Standard library only.
"""

import argparse
import json
import statistics
import sys

UNIT_TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}

VERIFY_IMPLS = ("BM_verify", "BM_verify_token", "BM_verify_nocheck", "BM_verify_block_nocheck", "BM_naive", "BM_bound",
                "BM_bound_block", "BM_bound_q", "BM_bound_block_q")
SAMPLE_IMPLS = ("BM_sample", "BM_sample_weights", "BM_sample_naive", "BM_sample_bound", "BM_sample_bound_write")
REJECTION_IMPLS = ("BM_rejection", "BM_rejection_bound", "BM_rejection_bound_q")


def split_name(name):
    """'BM_verify/dist/plain/mix/V:512/gamma:1/T:0' -> ('BM_verify', 'dist/plain/mix/V:512/gamma:1/T:0')."""
    impl, _, case = name.partition("/")
    return impl, case


def per_call_us(run, field):
    calls = run.get("calls", 1.0) or 1.0
    return run[field] * UNIT_TO_US[run.get("time_unit", "ns")] / calls


def collect(benchmarks, field):
    """{(impl, case): {"us": median per-call time, "accept": ..., "diff": ...}}"""
    aggregated = {}
    plain = {}
    for b in benchmarks:
        if b.get("error_occurred"):
            impl, case = split_name(b.get("run_name", b["name"]))
            aggregated[(impl, case)] = {"error": b.get("error_message", "error")}
            continue
        run_name = b.get("run_name", b["name"])
        impl, case = split_name(run_name)
        if b.get("run_type") == "aggregate":
            if b.get("aggregate_name") == "median":
                aggregated[(impl, case)] = {
                    "us": per_call_us(b, field),
                    "accept": b.get("accept"),
                    "diff": b.get("outcome_diff"),
                    "R": b.get("R"),
                    "uniforms": b.get("uniforms"),
                }
        else:
            plain.setdefault((impl, case), []).append(b)
    for key, runs in plain.items():
        if key in aggregated:
            continue
        aggregated[key] = {
            "us": statistics.median(per_call_us(r, field) for r in runs),
            "accept": runs[0].get("accept"),
            "diff": runs[0].get("outcome_diff"),
            "R": runs[0].get("R"),
            "uniforms": runs[0].get("uniforms"),
        }
    return aggregated


def fmt_us(v):
    if v is None:
        return "–"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3f}"


def fmt_ratio(a, b):
    if a is None or b is None or b == 0:
        return "–"
    r = a / b
    return f"{r:.1f}" if r >= 10 else f"{r:.2f}"


def case_label(case):
    """'dist/plain/mix/V:512/gamma:1/T:0' -> ('dist', 'plain', 'mix', '512', '1', '0')."""
    parts = case.split("/")
    head, args = parts[:-3], dict(p.split(":", 1) for p in parts[-3:] if ":" in p)
    return head, args


def sort_key(case):
    head, args = case_label(case)
    regime_order = {"all_accepted": 0, "first_reject": 1, "mix": 2}
    filter_order = {"plain": 0, "topk40": 1, "topp0.9": 2}
    draft, filt, regime = (head + ["", "", ""])[:3]
    return (
        draft != "dist",
        filter_order.get(filt, 9),
        int(args.get("V", 0)),
        int(args.get("gamma", 0)),
        int(args.get("T", 0)),
        regime_order.get(regime, 9),
    )


def value(data, impl, case, key="us"):
    entry = data.get((impl, case))
    if entry is None or "error" in entry:
        return None
    return entry.get(key)


def verify_table(data):
    cases = sorted({case for (impl, case) in data if impl in VERIFY_IMPLS}, key=sort_key)
    if not cases:
        return []
    has_nocheck = any(impl in ("BM_verify_nocheck", "BM_verify_block_nocheck") for (impl, _) in data)
    head = ["draft", "filter", "regime", "V", "γ", "T", "accept", "token µs", "bound µs", "token/bound",
            "naive µs", "naive/token", "block µs", "block bound µs", "block/bound"]
    if has_nocheck:
        head += ["token nocheck µs", "nocheck/bound", "block nocheck µs", "block nocheck/bound"]
    has_q = any(impl in ("BM_bound_q", "BM_bound_block_q") for (impl, _) in data)
    if has_q:
        head += ["bound+q µs", "token/bound+q", "block bound+q µs", "block/bound+q"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    errors = []
    for case in cases:
        parts, args = case_label(case)
        draft, filt, regime = (parts + ["", "", ""])[:3]
        t = value(data, "BM_verify_token", case)
        b = value(data, "BM_bound", case)
        n = value(data, "BM_naive", case)
        v = value(data, "BM_verify", case)
        bb = value(data, "BM_bound_block", case)
        acc = value(data, "BM_verify_token", case, "accept")
        row = [draft, filt, regime, args.get("V", "?"), args.get("gamma", "?"), args.get("T", "?"),
               "–" if acc is None else f"{acc:.2f}", fmt_us(t), fmt_us(b), fmt_ratio(t, b), fmt_us(n),
               fmt_ratio(n, t), fmt_us(v), fmt_us(bb), fmt_ratio(v, bb)]
        if has_nocheck:
            nc = value(data, "BM_verify_nocheck", case)
            bnc = value(data, "BM_verify_block_nocheck", case)
            row += [fmt_us(nc), fmt_ratio(nc, b), fmt_us(bnc), fmt_ratio(bnc, bb)]
        if has_q:
            bq = value(data, "BM_bound_q", case)
            bbq = value(data, "BM_bound_block_q", case)
            row += [fmt_us(bq), fmt_ratio(t, bq), fmt_us(bbq), fmt_ratio(v, bbq)]
        lines.append("| " + " | ".join(row) + " |")
        for impl in VERIFY_IMPLS:
            e = data.get((impl, case))
            if e is not None and "error" in e:
                errors.append(f"- {impl}/{case}: {e['error']}")
    return lines + ([""] + errors if errors else [])


SUMMARY_COLUMNS = (
    # (title, implementation, bound, drafts, temperature)
    ("T = 0, token", "BM_verify_token", "BM_bound", ("dist", "point"), "0"),
    ("T = 0, block", "BM_verify", "BM_bound_block", ("dist", "point"), "0"),
    ("T = 1, token, default check", "BM_verify_token", "BM_bound", ("dist",), "1"),
    ("T = 1, token, unchecked", "BM_verify_nocheck", "BM_bound", ("dist",), "1"),
    ("T = 1, point-mass drafts", "BM_verify_token", "BM_bound", ("point",), "1"),
    ("T = 1, block, default check", "BM_verify", "BM_bound_block", ("dist", "point"), "1"),
    ("T = 1, block, unchecked", "BM_verify_block_nocheck", "BM_bound_block", ("dist",), "1"),
    # The default check against the bound that also reads the draft columns it checks.
    ("T = 1, token, default check / bound+q", "BM_verify_token", "BM_bound_q", ("dist",), "1"),
    ("T = 1, block, default check / bound+q", "BM_verify", "BM_bound_block_q", ("dist",), "1"),
)


def summary_table(data, min_vocab=32000):
    """Median (min–max) ratio to the bound per regime and column, over plain sampling at V >= min_vocab."""
    cases = sorted({case for (impl, case) in data if impl in VERIFY_IMPLS}, key=sort_key)
    head = ["regime"] + [c[0] for c in SUMMARY_COLUMNS]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    any_value = False
    for regime, title in (("all_accepted", "all accepted"), ("mix", "typical mix"), ("first_reject", "first reject")):
        row = [title]
        for _, impl, bound, drafts, temp in SUMMARY_COLUMNS:
            ratios = []
            for case in cases:
                parts, args = case_label(case)
                draft, filt, reg = (parts + ["", "", ""])[:3]
                if (filt != "plain" or reg != regime or draft not in drafts or args.get("T") != temp
                        or int(args.get("V", 0)) < min_vocab):
                    continue
                v, b = value(data, impl, case), value(data, bound, case)
                if v is not None and b:
                    ratios.append(v / b)
            if ratios:
                any_value = True
                row.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}, n = {len(ratios)})")
            else:
                row.append("–")
        lines.append("| " + " | ".join(row) + " |")
    return lines if any_value else []


def sample_table(data):
    cases = sorted({case for (impl, case) in data if impl in SAMPLE_IMPLS},
                   key=lambda c: (c.split("/")[0] != "plain", int(case_label(c)[1].get("V", 0))))
    if not cases:
        return []
    head = ["filter", "V", "T", "standardize_and_sample µs", "weights µs", "bound µs", "bound+write µs",
            "naive µs", "specdec/bound", "specdec/bound+write", "weights/bound", "naive/specdec"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for case in cases:
        parts = case.split("/")
        args = dict(p.split(":", 1) for p in parts if ":" in p)
        s = value(data, "BM_sample", case)
        sw = value(data, "BM_sample_weights", case)
        b = value(data, "BM_sample_bound", case)
        w = value(data, "BM_sample_bound_write", case)
        n = value(data, "BM_sample_naive", case)
        row = [parts[0], args.get("V", "?"), args.get("T", "?"), fmt_us(s), fmt_us(sw), fmt_us(b), fmt_us(w),
               fmt_us(n), fmt_ratio(s, b), fmt_ratio(s, w), fmt_ratio(sw, b), fmt_ratio(n, s)]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def rejection_table(data):
    cases = sorted({case for (impl, case) in data if impl in REJECTION_IMPLS},
                   key=lambda c: tuple(-float(v) if k == "R" else float(v)
                                       for k, v in (p.split(":", 1) for p in c.split("/"))))
    if not cases:
        return []
    head = ["V", "R", "uniforms per call", "verify µs", "bound µs", "verify/bound", "bound+q µs", "verify/bound+q"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for case in cases:
        args = dict(p.split(":", 1) for p in case.split("/"))
        v = value(data, "BM_rejection", case)
        b = value(data, "BM_rejection_bound", case)
        bq = value(data, "BM_rejection_bound_q", case)
        r = value(data, "BM_rejection", case, "R")
        n = value(data, "BM_rejection", case, "uniforms")
        lines.append("| " + " | ".join([args.get("V", "?"), "–" if r is None else f"{r:.2g}",
                                        "–" if n is None else f"{n:.0f}", fmt_us(v), fmt_us(b), fmt_ratio(v, b),
                                        fmt_us(bq), fmt_ratio(v, bq)]) + " |")
    return lines


def parts_table(data):
    """The parts of a rejection call (BM_pass, BM_proposals) beside the bound of its row (R = 0.01)."""
    vocabs = sorted({int(case.split("/")[0].split(":")[1])
                     for (impl, case) in data if impl in ("BM_pass", "BM_proposals")})
    if not vocabs:
        return []
    head = ["V", "pass µs, checked", "pass µs, unchecked", "bound µs", "bound+q µs", "checked/bound",
            "unchecked/bound", "ns per proposal: alone", "in groups of 4", "of 8"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for vocab in vocabs:
        c1 = value(data, "BM_pass", f"V:{vocab}/check:1")
        c0 = value(data, "BM_pass", f"V:{vocab}/check:0")
        b = value(data, "BM_rejection_bound", f"V:{vocab}/R:0.01")
        bq = value(data, "BM_rejection_bound_q", f"V:{vocab}/R:0.01")
        groups = [value(data, "BM_proposals", f"V:{vocab}/group:{k}") for k in (1, 4, 8)]
        lines.append("| " + " | ".join([str(vocab), fmt_us(c1), fmt_us(c0), fmt_us(b), fmt_us(bq), fmt_ratio(c1, b),
                                        fmt_ratio(c0, b)] + ["–" if g is None else f"{g * 1e3:.0f}" for g in groups])
                     + " |")
    return lines


def print_section(title, lines):
    """A titled table, after a blank line; nothing when the table is empty."""
    if not lines:
        return
    print()
    print(title)
    print()
    for line in lines:
        print(line)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("json", help="verify_bench JSON output (--benchmark_out=... or --benchmark_format=json), or -")
    ap.add_argument("--time", choices=("cpu", "real"), default="cpu",
                    help="which time to quote (default cpu: robust on a shared machine)")
    args = ap.parse_args()
    with (sys.stdin if args.json == "-" else open(args.json, encoding="utf-8")) as f:
        doc = json.load(f)
    data = collect(doc.get("benchmarks", []), "cpu_time" if args.time == "cpu" else "real_time")
    ctx = doc.get("context", {})
    reps = {b.get("repetitions") for b in doc.get("benchmarks", []) if "repetitions" in b}
    print(f"Median {args.time} time per call (µs); host {ctx.get('host_name', '?')}, "
          f"{ctx.get('num_cpus', '?')} CPUs @ {ctx.get('mhz_per_cpu', '?')} MHz, "
          f"repetitions {', '.join(str(r) for r in sorted(reps)) or '?'}, {ctx.get('date', '')}.")
    print()
    print("token / block: specdec::verify with token / block (default) verification, draft columns checked; "
          "bound: log-sum-exp (T=0: max) of the rows token verification needs for the outcome; block bound: of the rows "
          "block verification needs (p_1..p_k up to the first zero block weight, and p_γ+1 when all are accepted); naive: baselines.hpp (token verification). accept: token acceptance rate of the batch. "
          "bound+q (draft distributions, T=1): the same passes, each also reading its position's draft column (log_sum_exp_reading), the least work of a pass that checks the draft columns as verify does by default.")
    print()
    for line in verify_table(data):
        print(line)
    print_section("Ratio to the bound, median (min–max, number of cases) over plain sampling at V >= 32000, every γ:",
                  summary_table(data))
    print_section("Rejection cost against the residual mass R: token verification of one draft token that is always "
                  "rejected (p(x) = 0, q(x) = R, residual mass R); the draw after it takes about 1/R proposals (2 "
                  "uniforms each) or, past the budget, the exact pass. bound: log-sum-exp of the row; bound+q: reading q "
                  "too.", rejection_table(data))
    print_section("Parts of a rejection call (R = 0.01): the normalizing pass over the row alone (BM_pass), against "
                  "the bound of that row; the residual draw's proposals alone (BM_proposals), made one at a time or "
                  "side by side.", parts_table(data))
    print_section("Drafter side: standardize_and_sample (q normalized) and standardize_weights_and_sample (weights "
                  "and their scale, as speculative decoding drafts) vs naive softmax + std::discrete_distribution; "
                  "bound: log-sum-exp of the row; bound+write: that pass storing its exps, then one pass scaling "
                  "them to sum 1 (the least work that writes a normalized q).", sample_table(data))

if __name__ == "__main__":
    main()
