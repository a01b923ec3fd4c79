#!/usr/bin/env bash
# scripts/trace_report.py on bad input: a missing file, invalid JSON, a field removed, a wrong
# type, a mismatch between tokens and origins, an out-of-range alpha must each end with exit
# status 1 and one line on stderr that names the file and the problem, never a traceback. (The
# input is checked before matplotlib is loaded, so this test needs only Python 3.)
#
#   tests/integration/scripts/report_input_test.sh TRACE.json [PYTHON]
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
report_script="$here/../../../scripts/trace_report.py"
trace="${1:?usage: report_input_test.sh TRACE.json [PYTHON]}"
python="${2:-python3}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0

# derive NAME EXPRESSION: $tmp/NAME.json is the trace after EXPRESSION (on d, the parsed JSON;
# step(d) is its first chain step that accepted a draft token).
derive() {
  "$python" - "$trace" "$tmp/$1.json" "$2" <<'EOF'
import json, sys
src, dst, expr = sys.argv[1:4]
d = json.load(open(src, encoding="utf-8"))
def step(d):
    steps = [e for e in d["traceEvents"] if e.get("ph") == "X" and e.get("name") == "step"]
    return next((e for e in steps if e["args"]["plan"] == "chain" and e["args"]["accepted"] > 0), steps[0])
exec(expr)
json.dump(d, open(dst, "w", encoding="utf-8"))
EOF
}

# expect_error FILE TEXT: the report of FILE must fail with one stderr line naming FILE and TEXT.
expect_error() {
  local file="$1" text="$2" rc=0
  "$python" "$report_script" "$file" -o "$tmp/out.html" >"$tmp/stdout" 2>"$tmp/stderr" || rc=$?
  local lines
  lines="$(wc -l <"$tmp/stderr")"
  if [ "$rc" != 1 ] || [ "$lines" != 1 ] || ! grep -qF -- "$file" "$tmp/stderr" \
     || ! grep -qF -- "$text" "$tmp/stderr" || grep -q Traceback "$tmp/stderr"; then
    echo "FAIL: $(basename "$file"): exit status $rc, $lines stderr line(s), expected 1 line naming" \
         "the file and '$text':"
    sed 's/^/    /' "$tmp/stderr"
    failures=$((failures + 1))
  else
    echo "ok: $(cat "$tmp/stderr")"
  fi
}

expect_error "$tmp/absent.json" "cannot read"
printf '{"traceEvents": [' >"$tmp/truncated.json"
expect_error "$tmp/truncated.json" "not valid JSON"
printf '{"traceEvents": [], "otherData": {"specdec": {"x": NaN}}}' >"$tmp/nan.json"
expect_error "$tmp/nan.json" "not valid JSON"
printf '[1, 2]' >"$tmp/array.json"
expect_error "$tmp/array.json" "expected a JSON object"
derive no_origins 'del step(d)["args"]["origins"]'
expect_error "$tmp/no_origins.json" "missing field 'origins'"
derive no_alpha 'del d["otherData"]["specdec"]["alpha"]'
expect_error "$tmp/no_alpha.json" "missing field 'otherData.specdec.alpha'"
derive no_run 'del d["otherData"]'
expect_error "$tmp/no_run.json" "missing field 'otherData'"
derive string_ms 'step(d)["args"]["target_ms"] = "12"'
expect_error "$tmp/string_ms.json" "target_ms: expected a number"
derive short_origins 'step(d)["args"]["origins"].pop()'
expect_error "$tmp/short_origins.json" "origins:"
derive bad_alpha 'd["otherData"]["specdec"]["alpha"] = 1.5'
expect_error "$tmp/bad_alpha.json" "not in [0, 1]"
derive bad_origin 'step(d)["args"]["origins"][0] = "<script>"'
expect_error "$tmp/bad_origin.json" "is not one of"

if [ "$failures" = 0 ]; then
  echo "every bad input was refused with one line"
  exit 0
fi
echo "$failures FAILED"
exit 1
