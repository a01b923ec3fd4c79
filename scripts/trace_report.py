#!/usr/bin/env python3
"""Turns a specdec trace (specdec-generate --trace FILE) into one self-contained HTML page.

    python3 scripts/trace_report.py TRACE.json [-o REPORT.html]

The page has the run's summary, the generated text coloured by where each token came from, and
five charts (PNG images embedded as data URIs: no network, no external script or style):
acceptance per draft position, the plan over time, time per step, tokens per step, and the
expected speedup against gamma. The trace format is described in docs/traces.md.

The trace is untrusted input: a missing file, invalid JSON or a missing or mistyped field ends
the program with one line naming the file and the problem (exit status 1). Needs matplotlib
(Debian: python3-matplotlib) for the charts.

References: Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative
Decoding", ICML 2023 (arXiv:2211.17192): Eq. 1 (the i.i.d. acceptance model), Theorem 3.8 (the
expected walltime improvement), Figure 1 (the text coloured by origin).
"""

import argparse
import base64
import html
import io
import json
import math
import os
import sys

PROG = "trace_report"


class TraceError(Exception):
    """A problem with the input trace; the message names where it is."""


# --- reading and validating the trace ------------------------------------------------------

from trace_format import (BASELINE_FIELDS, NEXT_KINDS, PLANS, RUN_FIELDS, STEP_FIELDS,  # noqa: E402
                          TYPES as _KIND_CHECKS, is_int as _is_int, is_num as _is_num)
ORIGINS = ("draft", "correction", "bonus", "target")


def _check_value(value, kind, where):
    if kind.startswith("list:"):
        item = kind[5:]
        if not isinstance(value, list):
            raise TraceError(f"{where}: expected a list, got {_describe(value)}")
        test, what = _KIND_CHECKS[item]
        for i, v in enumerate(value):
            if not test(v):
                raise TraceError(f"{where}[{i}]: expected {what}, got {_describe(v)}")
        return
    test, what = _KIND_CHECKS[kind]
    if not test(value):
        raise TraceError(f"{where}: expected {what}, got {_describe(value)}")


def _describe(v):
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return f"{v!r}" if math.isfinite(v) else "a non-finite number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "an object"
    return type(v).__name__


def _reject_constant(name):
    raise ValueError(f"non-finite number {name} (not JSON)")


def load_trace(path):
    """Reads and validates the trace; returns (run, steps, process_name)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TraceError(f"cannot read: {e.strerror or e}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise TraceError(f"not UTF-8 text (byte {e.start})") from None
    try:
        doc = json.loads(text, parse_constant=_reject_constant)
    except json.JSONDecodeError as e:
        raise TraceError(f"not valid JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
    except ValueError as e:
        raise TraceError(f"not valid JSON: {e}") from None
    except RecursionError:
        raise TraceError("not valid JSON: nested too deeply") from None

    if not isinstance(doc, dict):
        raise TraceError(f"expected a JSON object at the top, got {_describe(doc)}")
    if "traceEvents" not in doc:
        raise TraceError("missing field 'traceEvents'")
    events = doc["traceEvents"]
    if not isinstance(events, list):
        raise TraceError(f"traceEvents: expected a list, got {_describe(events)}")
    other = doc.get("otherData")
    if not isinstance(other, dict):
        raise TraceError("missing field 'otherData' (an object)" if other is None
                         else f"otherData: expected an object, got {_describe(other)}")
    if "specdec" not in other:
        raise TraceError("missing field 'otherData.specdec' (the run's summary)")
    run = other["specdec"]
    if not isinstance(run, dict):
        raise TraceError(f"otherData.specdec: expected an object, got {_describe(run)}")
    for name, kind in RUN_FIELDS.items():
        where = f"otherData.specdec.{name}"
        if name not in run:
            raise TraceError(f"missing field '{where}'")
        value = run[name]
        if value is None:
            continue
        if kind == "baseline":
            if not isinstance(value, dict):
                raise TraceError(f"{where}: expected an object or null, got {_describe(value)}")
            for bname, bkind in BASELINE_FIELDS.items():
                if bname not in value:
                    raise TraceError(f"missing field '{where}.{bname}'")
                if value[bname] is not None:
                    _check_value(value[bname], bkind, f"{where}.{bname}")
        else:
            _check_value(value, kind, where)
    if run["alpha"] is not None and not 0.0 <= run["alpha"] <= 1.0:
        raise TraceError(f"otherData.specdec.alpha: {run['alpha']!r} is not in [0, 1]")
    if run["cost_ratio"] is not None and run["cost_ratio"] < 0:
        raise TraceError(f"otherData.specdec.cost_ratio: {run['cost_ratio']!r} is negative")

    steps = []
    process_name = None
    for i, ev in enumerate(events):
        where = f"traceEvents[{i}]"
        if not isinstance(ev, dict):
            raise TraceError(f"{where}: expected an object, got {_describe(ev)}")
        ph = ev.get("ph")
        if ph == "M" and ev.get("name") == "process_name" and isinstance(ev.get("args"), dict):
            if isinstance(ev["args"].get("name"), str):
                process_name = ev["args"]["name"]
        if ph != "X" or ev.get("name") != "step":
            continue
        for name in ("ts", "dur"):
            if name not in ev:
                raise TraceError(f"{where} (a step event): missing field '{name}'")
            _check_value(ev[name], "num", f"{where}.{name}")
        args = ev.get("args")
        if not isinstance(args, dict):
            raise TraceError(f"{where} (a step event): missing field 'args' (an object)")
        for name, kind in STEP_FIELDS.items():
            if name not in args:
                raise TraceError(f"{where}.args: missing field '{name}'")
            _check_value(args[name], kind, f"{where}.args.{name}")
        if args["plan"] not in PLANS:
            raise TraceError(f"{where}.args.plan: {args['plan']!r} is not one of {', '.join(PLANS)}")
        if args["next_kind"] not in NEXT_KINDS:
            raise TraceError(f"{where}.args.next_kind: {args['next_kind']!r} is not one of "
                             f"{', '.join(NEXT_KINDS)}")
        for j, o in enumerate(args["origins"]):
            if o not in ORIGINS:
                raise TraceError(f"{where}.args.origins[{j}]: {o!r} is not one of {', '.join(ORIGINS)}")
        n = len(args["tokens"])
        for name in ("pieces", "origins"):
            if len(args[name]) != n:
                raise TraceError(f"{where}.args.{name}: {len(args[name])} entries for {n} tokens")
        for name in ("sequence", "step", "gamma", "tree_nodes", "drafted", "accepted", "target_passes"):
            if args[name] < 0:
                raise TraceError(f"{where}.args.{name}: {args[name]} is negative")
        for name in ("draft_ms", "target_ms", "library_ms"):
            if args[name] < 0:
                raise TraceError(f"{where}.args.{name}: {args[name]!r} is negative")
        step = dict(args)
        step["ts"] = ev["ts"]
        step["dur"] = ev["dur"]
        steps.append(step)
    steps.sort(key=lambda s: (s["sequence"], s["step"], s["ts"]))
    return run, steps, process_name


# --- numbers for the charts ----------------------------------------------------------------

def expected_speedup(alpha, gamma, c):
    """Leviathan et al. 2023, Theorem 3.8: the expected improvement factor in walltime of
    speculative decoding with gamma draft tokens per step, acceptance rate alpha and cost ratio c,
    (1 - alpha^(gamma+1)) / ((1 - alpha)(gamma c + 1)); at alpha = 1 its limit (gamma+1)/(gamma c+1).
    gamma = 0 gives 1 (plain decoding)."""
    if gamma == 0:
        return 1.0
    if 1.0 - alpha < 1e-12:
        return (gamma + 1) / (gamma * c + 1)
    return (1.0 - alpha ** (gamma + 1)) / ((1.0 - alpha) * (gamma * c + 1))


def beta_per_position(steps):
    """Mean beta of each chain draft position (1-based) over the steps that tested it, with the
    count and the standard error: [(position, mean, count, stderr)]."""
    sums = {}
    for s in steps:
        for i, b in enumerate(s["beta"]):
            sums.setdefault(i, []).append(b)
    out = []
    for i in sorted(sums):
        v = sums[i]
        m = sum(v) / len(v)
        se = (math.sqrt(sum((x - m) ** 2 for x in v) / (len(v) - 1) / len(v))
              if len(v) > 1 else 0.0)
        out.append((i + 1, m, len(v), se))
    return out


def all_betas(steps):
    return [b for s in steps for b in s["beta"]]


def run_alpha(run, steps):
    """The run's alpha (RUN.alpha), else the mean of every beta of the trace; and how many tested
    positions it rests on. (None, 0) without either."""
    betas = all_betas(steps)
    if run["alpha"] is not None:
        n = run["alpha_positions"] if run["alpha_positions"] is not None else len(betas)
        return run["alpha"], n, "RUN.alpha"
    if betas:
        return sum(betas) / len(betas), len(betas), "the mean of the trace's beta values"
    return None, 0, None


def cost_ratio(run, steps):
    """RUN.cost_ratio; else mean(draft_ms per draft call) over the chain steps (one draft call per
    drafted token) / mean(target_ms) of the plain steps. (c, how) or (None, why not)."""
    if run["cost_ratio"] is not None:
        return run["cost_ratio"], "RUN.cost_ratio"
    chain = [s for s in steps if s["plan"] == "chain" and s["drafted"] > 0]
    plain = [s for s in steps if s["plan"] == "plain"]
    if not chain or not plain:
        missing = "chain steps" if not chain else "plain steps"
        return None, f"RUN.cost_ratio is null and the trace has no {missing} to estimate it from"
    per_call = sum(s["draft_ms"] for s in chain) / sum(s["drafted"] for s in chain)
    target = sum(s["target_ms"] for s in plain) / len(plain)
    if target <= 0:
        return None, "RUN.cost_ratio is null and the plain steps' target time is zero"
    return per_call / target, (f"estimated from the trace: {per_call:.3g} ms per draft call / "
                               f"{target:.3g} ms per plain target step")


def batch_steps(steps):
    """One entry per distinct step of the run: in a batch the sequences' step events share their
    start time and their draft/target/library times, so events with the same start are merged."""
    merged = {}
    for s in steps:
        key = round(s["ts"], 3)
        if key not in merged:
            merged[key] = s
    return [merged[k] for k in sorted(merged)]


# --- charts --------------------------------------------------------------------------------

PLAN_STYLE = {  # colour, marker
    "plain": ("#888888", "x"),
    "chain": ("#1f77b4", "o"),
    "tree": ("#d62728", "^"),
}


def _mpl(s, width=110):
    """Untrusted text for a matplotlib label: '$' would start mathtext."""
    s = s.replace("\n", " ")
    if len(s) > width:
        s = s[: width - 1] + "…"
    return s.replace("$", r"\$")


class Charts:
    def __init__(self, plt, ticker, run, steps):
        self.plt = plt
        self.ticker = ticker
        self.run = run
        self.steps = steps
        self.label = run["label"] or ""

    def _figure(self, title, nrows=1, height=3.6):
        try:
            fig, axes = self.plt.subplots(nrows, 1, figsize=(8.4, height), layout="constrained",
                                          squeeze=False, sharex=True)
        except TypeError:  # matplotlib before 3.5
            fig, axes = self.plt.subplots(nrows, 1, figsize=(8.4, height), constrained_layout=True,
                                          squeeze=False, sharex=True)
        full = title
        if self.label:
            import textwrap
            full += "\n" + "\n".join(textwrap.wrap(_mpl(self.label, 300), 100))
        fig.suptitle(full, fontsize=10)
        return fig, [a[0] for a in axes]

    def _png(self, fig):
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, metadata={"Software": None})
        self.plt.close(fig)
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")

    # chart 1: Leviathan et al. 2023, Eq. 1 assumes the betas are i.i.d. with mean alpha, so the
    # prediction for every draft position is beta_i = alpha.
    def acceptance(self):
        per = beta_per_position(self.steps)
        if not per:
            return None, ("no β data: no chain step of the trace tested a draft position "
                          "(plain or tree steps only)")
        alpha, n_alpha, src = run_alpha(self.run, self.steps)
        fig, (ax,) = self._figure("Acceptance per draft position: measured mean β vs the i.i.d. model")
        xs = [p for p, _, _, _ in per]
        ax.errorbar(xs, [m for _, m, _, _ in per], yerr=[se for _, _, _, se in per], fmt="o-",
                    color="#1f77b4", capsize=3, label="measured mean β (± standard error)")
        if alpha is not None:
            ax.axhline(alpha, color="#d62728", ls="--",
                       label=f"i.i.d. model (Leviathan et al. Eq. 1): β_i = α = {alpha:.3f}")
        for p, m, n, _ in per:  # the count of steps that tested the position, along the top
            ax.text(p, 0.985, f"n={n}", transform=ax.get_xaxis_transform(), ha="center",
                    va="top", fontsize=8, color="#555555")
        ax.set_xlabel("draft position i (1 = first drafted token)")
        ax.set_ylabel("acceptance β_i")
        ax.set_ylim(0, 1.1)
        ax.set_xticks(xs)
        ax.legend(loc="lower left", fontsize=8)
        ax.grid(alpha=0.3)
        caption = (f"Mean β of each chain draft position over the steps that tested it (n under each "
                   f"point); the dashed line is the i.i.d. model's prediction, α from {src}"
                   + (f" ({n_alpha} tested positions)" if alpha is not None else "") +
                   ". A falling curve means later positions are accepted less often than the model "
                   "assumes, so long chains pay less than Theorem 3.8 predicts.")
        return self._png(fig), caption

    # chart 2: the plan per step (gamma of a chain, depth of a tree, 0 for plain steps).
    def plan(self):
        if not self.steps:
            return None, "no step events in the trace"
        seqs = sorted({s["sequence"] for s in self.steps})
        shown = seqs[:6]
        fig, axes = self._figure("Plan over time: γ (chain) or depth (tree) per step",
                                 nrows=len(shown), height=1.6 + 1.3 * len(shown))
        top = max([s["gamma"] for s in self.steps] + [self.run["gamma_max"] or 0, 1])
        for ax, seq in zip(axes, shown):
            mine = [s for s in self.steps if s["sequence"] == seq]
            ax.step([s["step"] for s in mine], [s["gamma"] for s in mine], where="mid",
                    color="#bbbbbb", lw=1, zorder=1)
            for plan in PLANS:
                pts = [s for s in mine if s["plan"] == plan]
                if pts:
                    colour, marker = PLAN_STYLE[plan]
                    ax.scatter([s["step"] for s in pts], [s["gamma"] for s in pts], c=colour,
                               marker=marker, s=28, zorder=2,
                               label={"plain": "plain (0)", "chain": "chain: γ",
                                      "tree": "tree: depth"}[plan])
            ax.set_ylabel(f"seq {seq}")
            ax.set_ylim(-0.5, top + 0.8)
            ax.yaxis.set_major_locator(self.ticker.MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        handles = {}
        for ax in axes:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
        axes[0].legend(handles.values(), handles.keys(), loc="upper left",
                       bbox_to_anchor=(1.01, 1.0), fontsize=8)
        axes[-1].xaxis.set_major_locator(self.ticker.MaxNLocator(integer=True))
        axes[-1].set_xlabel("step (within its sequence)")
        caption = ("The draft length γ (or the tree's depth) the planner chose at each step, one "
                   "panel per sequence; plain steps (no draft) sit at 0.")
        if len(seqs) > len(shown):
            caption += f" Only the first {len(shown)} of {len(seqs)} sequences are shown."
        return self._png(fig), caption

    # chart 3: where each step's time went.
    def timing(self):
        rows = batch_steps(self.steps)
        if not rows:
            return None, "no step events in the trace"
        fig, (ax,) = self._figure("Time per step: draft / target / library")
        xs = list(range(len(rows)))
        d = [s["draft_ms"] for s in rows]
        t = [s["target_ms"] for s in rows]
        lib = [s["library_ms"] for s in rows]
        colours = ("#2ca02c", "#1f77b4", "#ff7f0e")
        if len(rows) <= 300:
            ax.bar(xs, d, 0.8, color=colours[0], label="draft", lw=0)
            ax.bar(xs, t, 0.8, bottom=d, color=colours[1], label="target", lw=0)
            ax.bar(xs, lib, 0.8, bottom=[a + b for a, b in zip(d, t)], color=colours[2],
                   label="library", lw=0)
        else:  # thousands of bars are slow to draw and too thin to see: stacked areas, step-wise
            ax.stackplot(xs, d, t, lib, colors=colours, labels=("draft", "target", "library"),
                         step="mid", lw=0)
        ax.set_xlabel("step of the run (in time order)")
        ax.set_ylabel("milliseconds")
        ax.xaxis.set_major_locator(self.ticker.MaxNLocator(integer=True))
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        total = sum(d) + sum(t) + sum(lib)
        share = ("" if total <= 0 else
                 f" Of the total: draft {100 * sum(d) / total:.0f}%, target {100 * sum(t) / total:.0f}%,"
                 f" library {100 * sum(lib) / total:.0f}%.")
        caption = ("Each bar is one step: the draft model's time, the target pass and the library's "
                   "own work (verification, commit, planning). In a batch the times are those of "
                   "the batch step, shared by its sequences, so one bar stands for all of them."
                   + share)
        return self._png(fig), caption

    # chart 4: tokens appended per step (one target pass each for a chain or plain step).
    def tokens_per_call(self):
        if not self.steps:
            return None, "no step events in the trace"
        fig, (ax,) = self._figure("Tokens per step (per target call)")
        top = max(len(s["tokens"]) for s in self.steps)
        ks = list(range(0, top + 1))
        bottom = [0] * len(ks)
        for plan in PLANS:
            counts = [0] * len(ks)
            for s in self.steps:
                if s["plan"] == plan:
                    counts[len(s["tokens"])] += 1
            if any(counts):
                ax.bar(ks, counts, 0.8, bottom=bottom, color=PLAN_STYLE[plan][0], label=plan)
                bottom = [a + b for a, b in zip(bottom, counts)]
        mean = sum(len(s["tokens"]) for s in self.steps) / len(self.steps)
        ax.axvline(mean, color="#333333", ls=":", label=f"mean {mean:.2f}")
        ax.set_xlabel("tokens appended by the step")
        ax.set_ylabel("steps")
        ax.set_xticks(ks)
        ax.yaxis.set_major_locator(self.ticker.MaxNLocator(integer=True))
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        ax.grid(alpha=0.3, axis="y")
        caption = ("How many tokens each step appended (accepted draft tokens plus the correction or "
                   "bonus token). Plain decoding gives 1 per target pass; every step to the right of "
                   "1 saved target passes. Under the i.i.d. model a chain of γ gives on average "
                   "(1 − α^(γ+1)) / (1 − α) tokens (Leviathan et al. Eq. 1).")
        return self._png(fig), caption

    # chart 5: Leviathan et al. 2023, Theorem 3.8, for gamma = 0..10 at the run's alpha and c.
    def speedup(self):
        alpha, n_alpha, src = run_alpha(self.run, self.steps)
        if alpha is None:
            return None, ("skipped: no α (RUN.alpha is null and the trace has no β values), so "
                          "Theorem 3.8 cannot be evaluated")
        c, how = cost_ratio(self.run, self.steps)
        if c is None:
            return None, f"skipped: no cost ratio c ({how})"
        gammas = list(range(0, 11))
        ys = [expected_speedup(alpha, g, c) for g in gammas]
        fig, (ax,) = self._figure(f"Expected speedup vs γ (Leviathan et al. Thm 3.8), "
                                  f"α = {alpha:.3f}, c = {c:.3g}")
        ax.plot(gammas, ys, "o-", color="#1f77b4", ms=4, label="Theorem 3.8")
        best = max(gammas, key=lambda g: ys[g])
        ax.annotate(f"best γ = {best}: {ys[best]:.2f}×", (best, ys[best]),
                    textcoords="offset points", xytext=(0, 8), fontsize=8,
                    ha="right" if best >= 8 else ("left" if best <= 1 else "center"))
        ax.axhline(1.0, color="#888888", lw=1, ls=":", label="plain decoding (1×)")
        mean_gamma = (sum(s["gamma"] for s in self.steps) / len(self.steps)) if self.steps else None
        note = ""
        if mean_gamma is not None and self.run["speedup"] is not None:
            ax.plot([mean_gamma], [self.run["speedup"]], "D", color="#d62728", ms=8,
                    label=f"measured: {self.run['speedup']:.2f}× at mean γ {mean_gamma:.2f}")
        elif mean_gamma is not None:
            ax.axvline(mean_gamma, color="#d62728", ls="--", lw=1,
                       label=f"run's mean γ {mean_gamma:.2f} (no measured speedup)")
            note = " The run has no measured speedup (no baseline run), so only its mean γ is marked."
        ax.set_xlabel("γ (draft tokens per step)")
        ax.set_ylabel("walltime improvement factor")
        ax.set_xticks(gammas)
        top = max(ys + ([self.run["speedup"]] if self.run["speedup"] is not None else []))
        ax.set_ylim(0, top * 1.18)
        ax.legend(loc="lower right", fontsize=8)
        ax.grid(alpha=0.3)
        caption = (f"Expected walltime improvement (1 − α^(γ+1)) / ((1 − α)(γc + 1)) of Theorem 3.8 "
                   f"for γ = 0..10, with α = {alpha:.3f} from {src} and c = {c:.3g} ({how}). "
                   f"Speculation pays where the curve is above 1. The run's own point is at its "
                   f"mean γ over all steps (plain steps count as 0; a tree's depth as γ).{note}")
        if n_alpha < 30:
            caption += (f" α rests on only {n_alpha} tested positions: read the curve as an "
                        f"illustration.")
        return self._png(fig), caption


CHARTS = (
    ("acceptance", "Acceptance per draft position"),
    ("plan", "Plan over time"),
    ("timing", "Time per step"),
    ("tokens_per_call", "Tokens per step"),
    ("speedup", "Speedup against γ"),
)


# --- the page ------------------------------------------------------------------------------

def _esc(v):
    return html.escape("" if v is None else str(v), quote=True)


def _fmt(v, spec="", suffix=""):
    if v is None:
        return "unknown"
    return f"{v:{spec}}{suffix}"


def _piece_html(piece):
    piece = piece.replace("\r\n", "\n").replace("\r", "\n")
    return "<br>".join(html.escape(part, quote=True) for part in piece.split("\n"))


ORIGIN_LEGEND = (
    ("draft", "accepted draft token"),
    ("correction", "target correction (after a rejection)"),
    ("bonus", "bonus token (all drafts accepted)"),
    ("target", "plain target token"),
)


def text_section(run, steps):
    """Leviathan et al. 2023, Figure 1: the output coloured by where each token came from."""
    counts = {o: 0 for o, _ in ORIGIN_LEGEND}
    for s in steps:
        for o in s["origins"]:
            counts[o] += 1
    out = ['<section id="text"><h2>Generated text by origin</h2>',
           '<p class="legend">']
    for o, what in ORIGIN_LEGEND:
        out.append(f'<span class="item"><span class="tok o-{o}">{_esc(what)}</span> {counts[o]}</span> ')
    out.append("</p>")
    out.append('<p class="small">As in Leviathan et al. 2023, Figure 1. A thin bar marks the start '
               'of each step; hover over a token for its step and id.</p>')
    seqs = sorted({s["sequence"] for s in steps})
    if not seqs:
        out.append('<p class="note">The trace has no step events.</p>')
    for seq in seqs:
        mine = [s for s in steps if s["sequence"] == seq]
        n = sum(len(s["tokens"]) for s in mine)
        out.append(f'<h3>Sequence {seq} <span class="small">({len(mine)} steps, {n} tokens)</span></h3>')
        spans = []  # one line: white space between the spans would show in the pre-wrap block
        for s in mine:
            for j, (tok, piece, origin) in enumerate(zip(s["tokens"], s["pieces"], s["origins"])):
                cls = f"tok o-{origin}" + (" st" if j == 0 else "")
                title = f"step {s['step']} ({s['plan']}), {origin}, token {tok}"
                spans.append(f'<span class="{cls}" title="{_esc(title)}">{_piece_html(piece)}</span>')
        out.append('<div class="gen">' + "".join(spans) + "</div>")
    out.append("</section>")
    return "\n".join(out)


def header_section(run, steps, trace_path, process_name):
    alpha_pos = run["alpha_positions"]
    if run["alpha"] is not None and alpha_pos is not None and alpha_pos >= 30:
        alpha = f"{run['alpha']:.3f} <span class=\"small\">(from {alpha_pos} tested draft positions)</span>"
    else:
        alpha = ("too few tested positions to estimate <span class=\"small\">("
                 f"{_esc(alpha_pos if alpha_pos is not None else 'unknown')} tested)</span>")
    if run["speedup"] is not None:
        speedup = f"{run['speedup']:.2f}× measured"
        base = run["baseline"]
        if base is not None and base.get("tokens_per_second") is not None:
            speedup += f" <span class=\"small\">(plain target decoding: {base['tokens_per_second']:.1f} tokens/s)</span>"
    else:
        speedup = "not measured (no baseline run)"
    seqs = run["sequences"] if run["sequences"] is not None else len({s["sequence"] for s in steps})
    rows = [
        ("target", _esc(_fmt(run["target"]))),
        ("draft", _esc(_fmt(run["draft"]))),
        ("tokens", f"{_esc(_fmt(run['new_tokens']))} <span class=\"small\">in "
                   f"{_esc(seqs)} sequence(s), {len(steps)} steps</span>"),
        ("tokens/s", _esc(_fmt(run["tokens_per_second"], ".1f"))
                     + f" <span class=\"small\">({_esc(_fmt(run['seconds'], '.3f', ' s'))})</span>"),
        ("speedup vs baseline", speedup),
        ("α (acceptance rate)", alpha),
        ("cost ratio c", _esc(_fmt(run["cost_ratio"], ".3g"))),
        ("γ max", _esc(_fmt(run["gamma_max"]))),
        ("temperature, seed", f"{_esc(_fmt(run['temperature'], 'g'))}, {_esc(_fmt(run['seed']))}"),
        ("prompt", f"<span class=\"prompt\">{_piece_html(run['prompt'] or '')}</span>"),
    ]
    out = ['<header>', '<h1>specdec run report</h1>']
    if run["label"]:
        out.append(f'<p class="label">{_esc(run["label"])}</p>')
    out.append(f'<p class="small">trace {_esc(os.path.basename(trace_path))}'
               + (f" · {_esc(process_name)}" if process_name else "") + "</p>")
    out.append('<table class="summary">')
    for k, v in rows:
        out.append(f"<tr><th>{_esc(k)}</th><td>{v}</td></tr>")
    out.append("</table>")
    if run["dropped_steps"]:
        out.append(f'<p class="note">The recorder dropped {run["dropped_steps"]} step(s) (its '
                   f'capacity): the text and the charts show only the steps it kept.</p>')
    out.append("</header>")
    return "\n".join(out)


CSS = """
body { font-family: "DejaVu Sans", Verdana, sans-serif; margin: 1.5em auto; max-width: 64em;
       color: #222; line-height: 1.4; padding: 0 1em; }
h1 { margin-bottom: 0.2em; }
.label { background: #fff3cd; border: 2px solid #e0a800; padding: 0.5em 0.8em; font-weight: bold;
         font-size: 1.15em; }
.small { color: #666; font-size: 0.85em; font-weight: normal; }
.note { background: #f3f3f3; border-left: 4px solid #999; padding: 0.5em 0.8em; }
table.summary th { text-align: left; padding-right: 1.5em; font-weight: normal; color: #555; }
.gen { white-space: pre-wrap; font-family: "DejaVu Sans Mono", monospace; font-size: 0.9em;
       border: 1px solid #ddd; padding: 0.6em; line-height: 1.7; word-wrap: break-word; }
.prompt { white-space: pre-wrap; font-family: "DejaVu Sans Mono", monospace; }
.tok { border-radius: 2px; }
.tok.st { border-left: 1px solid #777; }
.o-draft { background: #bfe8bf; }
.o-correction { background: #c6d8ff; text-decoration: underline; }
.o-bonus { background: #ffe08a; }
.o-target { background: #e4e4e4; }
.legend .tok { padding: 0 0.3em; }
.legend .item { white-space: nowrap; margin-right: 1em; }
figure { margin: 1.5em 0; }
figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.9em; color: #444; }
figcaption .caveat { color: #8a5a00; font-style: italic; }
footer { margin-top: 2em; font-size: 0.85em; color: #666; }
"""

# After load: how many chart images decoded (complete with a width), for a headless browser check.
LOAD_SCRIPT = """
window.addEventListener("load", function () {
  var imgs = document.querySelectorAll("img.chart");
  var rendered = 0;
  for (var i = 0; i < imgs.length; i++) {
    if (imgs[i].complete && imgs[i].naturalWidth > 0) { rendered++; }
  }
  document.body.dataset.chartsExpected = String(imgs.length);
  document.body.dataset.chartsRendered = String(rendered);
});
"""


def build_page(run, steps, trace_path, process_name, charts):
    label = run["label"] or ""
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>specdec report: {_esc(os.path.basename(trace_path))}</title>",
           f"<style>{CSS}</style></head><body>",
           header_section(run, steps, trace_path, process_name),
           text_section(run, steps),
           '<section id="charts"><h2>Charts</h2>']
    for k, (title, uri, caption) in enumerate(charts, 1):
        caveat = f' <span class="caveat">{_esc(label)}</span>' if label else ""
        out.append(f'<figure id="chart{k}"><h3>{k}. {_esc(title)}</h3>')
        if uri is not None:
            out.append(f'<img class="chart" alt="{_esc(title)}" src="{uri}">')
            out.append(f"<figcaption>{_esc(caption)}{caveat}</figcaption>")
        else:
            out.append(f'<p class="note">Chart not drawn: {_esc(caption)}</p>')
        out.append("</figure>")
    out.append("</section>")
    out.append('<footer>Leviathan, Kalman &amp; Matias, "Fast Inference from Transformers via '
               'Speculative Decoding", ICML 2023 (arXiv:2211.17192): Eq. 1 (the i.i.d. acceptance '
               'model), Theorem 3.8 (expected walltime improvement), Figure 1 (text by origin).'
               '</footer>')
    out.append(f"<script>{LOAD_SCRIPT}</script>")
    out.append("</body></html>\n")
    return "\n".join(out)


# --- main ----------------------------------------------------------------------------------

def _progress(msg):
    if sys.stderr.isatty():
        sys.stderr.write("\r\033[K" + msg)
        sys.stderr.flush()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="trace_report.py",
                                 description="Make a self-contained HTML report from a specdec trace.")
    ap.add_argument("trace", help="trace file written by specdec-generate --trace")
    ap.add_argument("-o", "--output", help="HTML file to write (default: the trace's name with .html)")
    args = ap.parse_args(argv)
    trace = args.trace
    output = args.output or (os.path.splitext(trace)[0] + ".html")

    try:
        run, steps, process_name = load_trace(trace)
    except TraceError as e:
        print(f"{PROG}: {trace}: {e}", file=sys.stderr)
        return 1
    if os.path.abspath(output) == os.path.abspath(trace):
        print(f"{PROG}: {trace}: the output would overwrite the trace; name another with -o",
              file=sys.stderr)
        return 1

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker as ticker
    except ImportError:
        print(f"{PROG}: matplotlib is not installed for {sys.executable} "
              f"(Debian: apt install python3-matplotlib)", file=sys.stderr)
        return 1

    drawer = Charts(plt, ticker, run, steps)
    charts = []
    for k, (method, title) in enumerate(CHARTS, 1):
        _progress(f"report: chart {k}/{len(CHARTS)} ({title})...")
        try:
            uri, caption = getattr(drawer, method)()
        except Exception as e:  # a chart that cannot be drawn becomes a note, not a failure
            plt.close("all")
            uri, caption = None, f"drawing failed: {type(e).__name__}: {e}"
        charts.append((title, uri, caption))
    _progress(f"report: writing {output}...")
    page = build_page(run, steps, trace, process_name, charts)
    try:
        with open(output, "w", encoding="utf-8", errors="replace") as f:
            f.write(page)
    except OSError as e:
        _progress("")
        print(f"{PROG}: {output}: cannot write: {e.strerror or e}", file=sys.stderr)
        return 1
    _progress("")
    drawn = sum(1 for _, uri, _ in charts if uri is not None)
    print(f"{output} ({drawn}/{len(charts)} charts, {len(steps)} steps)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as e:  # never a traceback for the user; name the problem
        print(f"{PROG}: unexpected error: {type(e).__name__}: {e}", file=sys.stderr)
        sys.exit(1)
