#!/usr/bin/env python3
"""Checks a trace file (specdec-generate --trace FILE) against the format of docs/traces.md.

    trace_format_check.py TRACE.json            exit 0 when it conforms, else 1 and the first problem
    trace_format_check.py --self-test TRACE.json   the negative control: TRACE must pass, and copies
                                                with one fault each (a field removed, a wrong type,
                                                origins that do not match the tokens, ...) must fail,
                                                each with a message naming the fault

Checks: valid JSON (no NaN); an object with displayTimeUnit "ms", a traceEvents list and
otherData.specdec (RUN) with every field, each of its type or null; every event has ph and pid 1;
metadata events name the process and the threads; every complete ("X") event has name, pid, tid,
ts and dur (numbers, ts and dur >= 0) and is one of step / draft / target pass / verify; each step
event's args (STEP) has every field with its type, origins and pieces as long as tokens, origins
the first `accepted` "draft" then next_kind (cut short only), a plan's numbers consistent with it
(plain: gamma 0, nothing drafted; only a tree has tree_nodes), tid = sequence + 1, the steps of
a sequence numbered 0, 1, 2, ... (when no step was dropped), a "target pass" and a "verify"
event per step; and the tokens of the steps add up to RUN.new_tokens when no step was dropped.
Needs only the Python standard library.
"""

import copy
import json
import math
import os
import sys
import tempfile

PROG = "trace_format_check"


class FormatError(Exception):
    pass


# The field tables are the report's own (scripts/trace_format.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "scripts"))
from trace_format import BASELINE_FIELDS as BASELINE, RUN_FIELDS as RUN, STEP_FIELDS as STEP  # noqa: E402
from trace_format import TYPES, is_int as _is_int, is_num as _is_num  # noqa: E402,F401

X_NAMES = ("step", "draft", "target pass", "verify")


def _type(value, kind, where):
    if kind.startswith("list:"):
        if not isinstance(value, list):
            raise FormatError(f"{where}: expected a list")
        test, what = TYPES[kind[5:]]
        for i, v in enumerate(value):
            if not test(v):
                raise FormatError(f"{where}[{i}]: expected {what}")
        return
    test, what = TYPES[kind]
    if not test(value):
        raise FormatError(f"{where}: expected {what}, got {json.dumps(value)[:40]}")


def _field(obj, name, where):
    if name not in obj:
        raise FormatError(f"{where}: missing field '{name}'")
    return obj[name]


def _no_constant(name):
    raise ValueError(f"non-finite number {name}")


def check(path):
    """Returns a one-line summary, or raises FormatError naming the first problem."""
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except OSError as e:
        raise FormatError(f"cannot read: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise FormatError("not UTF-8 text") from None
    try:
        doc = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as e:
        raise FormatError(f"not valid JSON: line {e.lineno} column {e.colno}: {e.msg}") from None
    except (ValueError, RecursionError) as e:
        raise FormatError(f"not valid JSON: {e}") from None
    if not isinstance(doc, dict):
        raise FormatError("the top level is not a JSON object")
    if _field(doc, "displayTimeUnit", "top level") != "ms":
        raise FormatError('displayTimeUnit: expected "ms"')
    events = _field(doc, "traceEvents", "top level")
    if not isinstance(events, list):
        raise FormatError("traceEvents: expected a list")
    other = _field(doc, "otherData", "top level")
    if not isinstance(other, dict):
        raise FormatError("otherData: expected an object")
    run = _field(other, "specdec", "otherData")
    if not isinstance(run, dict):
        raise FormatError("otherData.specdec: expected an object")
    for name, kind in RUN.items():
        value = _field(run, name, "otherData.specdec")
        if value is None:
            continue
        where = f"otherData.specdec.{name}"
        if kind == "baseline":
            if not isinstance(value, dict):
                raise FormatError(f"{where}: expected an object or null")
            for bname, bkind in BASELINE.items():
                bvalue = _field(value, bname, where)
                if bvalue is not None:
                    _type(bvalue, bkind, f"{where}.{bname}")
        else:
            _type(value, kind, where)
    if run["tool"] is not None and run["tool"] not in ("specdec-generate", "specdec-random-pair"):
        raise FormatError('otherData.specdec.tool: expected "specdec-generate" or "specdec-random-pair"')
    if run["alpha"] is not None and not 0 <= run["alpha"] <= 1:
        raise FormatError("otherData.specdec.alpha: not in [0, 1]")

    steps = []
    per_tid = {}  # tid -> {name: count}
    threads = set()
    process_named = False
    for i, ev in enumerate(events):
        where = f"traceEvents[{i}]"
        if not isinstance(ev, dict):
            raise FormatError(f"{where}: expected an object")
        ph = _field(ev, "ph", where)
        if ph not in ("M", "X"):
            raise FormatError(f"{where}.ph: {json.dumps(ph)[:20]} is neither \"M\" nor \"X\"")
        for name in ("name", "pid", "tid"):
            _field(ev, name, where)
        _type(ev["name"], "str", f"{where}.name")
        _type(ev["pid"], "int", f"{where}.pid")
        _type(ev["tid"], "int", f"{where}.tid")
        if ev["pid"] != 1:
            raise FormatError(f"{where}.pid: expected 1")
        if ph == "M":
            args = _field(ev, "args", where)
            if not isinstance(args, dict) or not isinstance(args.get("name"), str):
                raise FormatError(f"{where}.args: expected an object with a string 'name'")
            if ev["name"] == "process_name":
                process_named = True
            elif ev["name"] == "thread_name":
                threads.add(ev["tid"])
            else:
                raise FormatError(f"{where}.name: unknown metadata event {ev['name']!r}")
            continue
        for name in ("ts", "dur"):
            _type(_field(ev, name, where), "num", f"{where}.{name}")
            if ev[name] < 0:
                raise FormatError(f"{where}.{name}: negative")
        if ev["name"] not in X_NAMES:
            raise FormatError(f"{where}.name: {ev['name']!r} is not one of {', '.join(X_NAMES)}")
        if ev.get("cat") != "specdec":
            raise FormatError(f'{where}.cat: expected "specdec"')
        counts = per_tid.setdefault(ev["tid"], {})
        counts[ev["name"]] = counts.get(ev["name"], 0) + 1
        if ev["name"] != "step":
            continue
        args = _field(ev, "args", where)
        if not isinstance(args, dict):
            raise FormatError(f"{where}.args: expected an object")
        where += ".args"
        for name, kind in STEP.items():
            _type(_field(args, name, where), kind, f"{where}.{name}")
        for name in ("sequence", "step", "gamma", "tree_nodes", "drafted", "accepted", "target_passes"):
            if args[name] < 0:
                raise FormatError(f"{where}.{name}: negative")
        for name in ("draft_ms", "target_ms", "library_ms"):
            if args[name] < 0:
                raise FormatError(f"{where}.{name}: negative")
        plan, kind = args["plan"], args["next_kind"]
        if plan not in ("plain", "chain", "tree"):
            raise FormatError(f"{where}.plan: {plan!r} is not plain, chain or tree")
        if kind not in ("correction", "bonus", "target"):
            raise FormatError(f"{where}.next_kind: {kind!r} is not correction, bonus or target")
        n = len(args["tokens"])
        for name in ("pieces", "origins"):
            if len(args[name]) != n:
                raise FormatError(f"{where}.{name}: {len(args[name])} entries, tokens has {n}")
        expected = (["draft"] * args["accepted"] + [kind])[:n]
        if args["origins"] != expected or n > args["accepted"] + 1:
            raise FormatError(f"{where}.origins: expected the first {args['accepted']} (accepted) "
                              f"\"draft\", then \"{kind}\" (next_kind), cut only at the end")
        if plan == "plain":
            if args["gamma"] or args["drafted"] or args["accepted"] or kind != "target":
                raise FormatError(f"{where}: a plain step has gamma, drafted and accepted 0 and "
                                  f"next_kind \"target\"")
        elif kind == "target" and args["drafted"]:
            # (A chain or tree step whose drafter proposed nothing ends with the target's token.)
            raise FormatError(f"{where}.next_kind: \"target\" in a {plan} step that drafted tokens")
        if plan != "tree" and args["tree_nodes"]:
            raise FormatError(f"{where}.tree_nodes: nonzero in a {plan} step")
        if args["accepted"] > args["drafted"]:
            raise FormatError(f"{where}.accepted: more than drafted")
        if plan == "chain" and args["drafted"] and (kind == "bonus") != (args["accepted"] == args["drafted"]):
            raise FormatError(f"{where}.next_kind: \"{kind}\" with {args['accepted']} of "
                              f"{args['drafted']} accepted")
        if ev["tid"] != args["sequence"] + 1:
            raise FormatError(f"{where}.sequence: the event's tid is not sequence + 1")
        steps.append(args)

    if not process_named:
        raise FormatError("traceEvents: no process_name metadata event")
    for tid, counts in sorted(per_tid.items()):
        if tid not in threads:
            raise FormatError(f"traceEvents: no thread_name metadata event for tid {tid}")
        for name in ("target pass", "verify"):
            if counts.get(name, 0) != counts.get("step", 0):
                raise FormatError(f"traceEvents: tid {tid} has {counts.get('step', 0)} step events "
                                  f"but {counts.get(name, 0)} \"{name}\" events")
    by_seq = {}
    for s in steps:
        by_seq.setdefault(s["sequence"], []).append(s["step"])
    for seq, idx in sorted(by_seq.items()):
        if len(set(idx)) != len(idx):
            raise FormatError(f"sequence {seq}: a step index appears twice")
        if not run["dropped_steps"] and sorted(idx) != list(range(len(idx))):
            raise FormatError(f"sequence {seq}: steps are not numbered 0, 1, 2, ... "
                              f"(and dropped_steps is 0)")
    total = sum(len(s["tokens"]) for s in steps)
    if not run["dropped_steps"] and run["new_tokens"] is not None and run["new_tokens"] != total:
        raise FormatError(f"otherData.specdec.new_tokens: {run['new_tokens']}, but the step events "
                          f"append {total} tokens")
    return f"{len(events)} events, {len(steps)} steps, {len(by_seq)} sequence(s)"


# --- negative control ----------------------------------------------------------------------

def _steps(doc):
    return [e for e in doc["traceEvents"] if e.get("ph") == "X" and e.get("name") == "step"]


def _spec_step(doc):
    """A chain step with an accepted draft token and its next token (else any step)."""
    steps = _steps(doc)
    for e in steps:
        a = e["args"]
        if a.get("plan") == "chain" and a.get("accepted", 0) > 0 and \
                len(a.get("origins", [])) == a["accepted"] + 1:
            return e
    return steps[0]


def _mutations():
    def drop_step_field(name):
        return lambda d: _spec_step(d)["args"].pop(name)
    return [
        ("step field removed (origins)", drop_step_field("origins"), "missing field 'origins'"),
        ("step field removed (beta)", drop_step_field("beta"), "missing field 'beta'"),
        ("step field removed (library_ms)", drop_step_field("library_ms"),
         "missing field 'library_ms'"),
        ("RUN field removed (alpha)", lambda d: d["otherData"]["specdec"].pop("alpha"),
         "missing field 'alpha'"),
        ("RUN removed", lambda d: d["otherData"].pop("specdec"), "missing field 'specdec'"),
        ("X event without dur", lambda d: _spec_step(d).pop("dur"), "missing field 'dur'"),
        ("ts as a string", lambda d: _spec_step(d).__setitem__("ts", "0"), ".ts: expected a number"),
        ("origins shorter than tokens", lambda d: _spec_step(d)["args"]["origins"].pop(),
         "origins: "),
        ("origins out of order", lambda d: _spec_step(d)["args"]["origins"].reverse(), ".origins"),
        ("tokens as strings", lambda d: _spec_step(d)["args"].__setitem__(
            "tokens", [str(t) for t in _spec_step(d)["args"]["tokens"]]), ".tokens[0]: expected an integer"),
        ("unknown plan", lambda d: _spec_step(d)["args"].__setitem__("plan", "fork"), ".plan"),
        ("boolean gamma", lambda d: _spec_step(d)["args"].__setitem__("gamma", True),
         ".gamma: expected an integer"),
        ("traceEvents not a list", lambda d: d.__setitem__("traceEvents", {}), "traceEvents: expected a list"),
        ("new_tokens off by one", lambda d: d["otherData"]["specdec"].__setitem__(
            "new_tokens", (d["otherData"]["specdec"]["new_tokens"] or 0) + 1), "new_tokens"),
    ]


def self_test(path):
    failures = 0
    try:
        print(f"ok: the trace passes ({check(path)})")
    except FormatError as e:
        print(f"FAIL: {path} must pass but: {e}")
        return 1
    with open(path, encoding="utf-8") as f:
        base = json.load(f)
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(name, f, expect) for name, f, expect in _mutations()]
        for name, mutate, expect in cases:
            doc = copy.deepcopy(base)
            mutate(doc)
            p = os.path.join(tmp, "mutated.json")
            with open(p, "w", encoding="utf-8") as f:
                json.dump(doc, f)
            failures += _expect_rejected(name, p, expect)
        p = os.path.join(tmp, "truncated.json")
        with open(path, encoding="utf-8") as src, open(p, "w", encoding="utf-8") as f:
            f.write(src.read()[:200])
        failures += _expect_rejected("truncated file", p, "not valid JSON")
        failures += _expect_rejected("missing file", os.path.join(tmp, "absent.json"), "cannot read")
    print("self-test: " + ("all faults caught" if failures == 0 else f"{failures} FAILED"))
    return 1 if failures else 0


def _expect_rejected(name, path, expect):
    try:
        check(path)
    except FormatError as e:
        if expect in str(e):
            print(f"ok: {name}: rejected ({e})")
            return 0
        print(f"FAIL: {name}: rejected, but the message does not say {expect!r}: {e}")
        return 1
    print(f"FAIL: {name}: accepted")
    return 1


def main(argv):
    if len(argv) == 2 and argv[0] == "--self-test":
        return self_test(argv[1])
    if len(argv) != 1 or argv[0].startswith("-"):
        print("usage: trace_format_check.py [--self-test] TRACE.json", file=sys.stderr)
        return 2
    try:
        summary = check(argv[0])
    except FormatError as e:
        print(f"{PROG}: {argv[0]}: {e}", file=sys.stderr)
        return 1
    print(f"{argv[0]}: ok ({summary})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
