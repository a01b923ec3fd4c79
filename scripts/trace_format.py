"""The trace file's format (docs/traces.md), shared by scripts/trace_report.py, which reads it,
and tests/integration/scripts/trace_format_check.py, which checks it: the fields of the run's summary
(otherData.specdec), of its baseline, and of each step event's args, with their types.
"""

import math


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# A field's type: the test and how a message names it.
TYPES = {
    "int": (is_int, "an integer"),
    "num": (is_num, "a number"),
    "str": (lambda v: isinstance(v, str), "a string"),
}

# RUN (otherData.specdec): every field must be present; each may be null when unknown.
RUN_FIELDS = {
    "tool": "str", "target": "str", "draft": "str", "label": "str", "temperature": "num",
    "seed": "int", "prompt": "str", "sequences": "int", "new_tokens": "int", "seconds": "num",
    "tokens_per_second": "num", "baseline": "baseline", "speedup": "num", "alpha": "num",
    "alpha_positions": "int", "cost_ratio": "num", "gamma_max": "int", "dropped_steps": "int",
}
BASELINE_FIELDS = {"tokens": "int", "seconds": "num", "tokens_per_second": "num"}

# STEP (the args of each "step" event): every field must be present and non-null.
STEP_FIELDS = {
    "sequence": "int", "step": "int", "plan": "str", "gamma": "int", "tree_nodes": "int",
    "drafted": "int", "accepted": "int", "next_kind": "str", "tokens": "list:int",
    "pieces": "list:str", "origins": "list:str", "beta": "list:num",
    "sibling_acceptance": "list:num", "target_passes": "int", "draft_ms": "num",
    "target_ms": "num", "library_ms": "num",
}
PLANS = ("plain", "chain", "tree")
NEXT_KINDS = ("correction", "bonus", "target")
