#!/usr/bin/env bash
# specdec-random-pair --trace with two sequences: the trace conforms to the format
# (trace_format_check.py), has one track per sequence, carries the run's label, and its steps hold
# every generated token (2 x 24).
#
#   tests/integration/scripts/random_pair_trace_test.sh path/to/specdec-random-pair [PYTHON]
set -euo pipefail
program="${1:?usage: random_pair_trace_test.sh path/to/specdec-random-pair [PYTHON]}"
python="${2:-python3}"
here="$(dirname "${BASH_SOURCE[0]}")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$program" --tokens 24 --batch 2 --trace "$tmp/trace.json" --stats-json "$tmp/stats.json" > "$tmp/out" 2>&1 || {
  echo "FAIL: specdec-random-pair exited with status $?"; tail -n 5 "$tmp/out"; exit 1; }
"$python" "$here/trace_format_check.py" "$tmp/trace.json"
"$python" - "$tmp/trace.json" "$tmp/stats.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
steps = [e["args"] for e in d["traceEvents"] if e.get("ph") == "X" and e["name"] == "step"]
run = d["otherData"]["specdec"]
problems = []
if sorted({s["sequence"] for s in steps}) != [0, 1]:
    problems.append("expected steps of sequences 0 and 1")
for q in (0, 1):
    n = sum(len(s["tokens"]) for s in steps if s["sequence"] == q)
    if n != 24:
        problems.append(f"sequence {q}: the trace holds {n} tokens, 24 were generated")
if "random weights" not in run["label"] or run["speedup"] is None or run["baseline"] is None:
    problems.append("the run summary lacks the random-weights label, the speedup or the baseline")
if json.load(open(sys.argv[2]))["run"]["new_tokens"] != 48:
    problems.append("the statistics file does not count 48 new tokens")
if problems:
    print("FAIL: " + "; ".join(problems))
    sys.exit(1)
print("ok: two tracks, 48 tokens, labelled")
PY
