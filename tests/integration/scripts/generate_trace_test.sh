#!/usr/bin/env bash
# specdec-generate --trace and --stats-json on the real pair in SPECDEC_MODELS_DIR, at the default
# length: a chain run with --compare and a planned tree run each write a trace that conforms to
# the format (trace_format_check.py), whose steps add up to the tokens the summary line reports;
# the statistics file parses; the report of the chain run renders in a headless browser
# (report_browser_test.sh: skipped inside when chromium is absent). Exit status 77 (skipped)
# without the model files.
#
#   tests/integration/scripts/generate_trace_test.sh path/to/specdec-generate [PYTHON]
set -uo pipefail
generate="${1:?usage: generate_trace_test.sh path/to/specdec-generate [PYTHON]}"
python="${2:-python3}"
here="$(dirname "${BASH_SOURCE[0]}")"
# shellcheck source=require_models.sh
source "$here/require_models.sh"
failures=0

# run NAME ARGS...: a run with --trace and --stats-json that must exit 0 and write conforming files.
run() {
  local name="$1" rc=0
  shift
  "$generate" --models "$models" --no-color --trace "$tmp/$name.json" --stats-json "$tmp/$name.stats.json" "$@" \
    >"$tmp/$name.out" 2>&1 || rc=$?
  if [ "$rc" != 0 ]; then
    echo "FAIL: $name: exit status $rc:"; tail -n 5 "$tmp/$name.out" | sed 's/^/    /'
    failures=$((failures + 1)); return
  fi
  if ! "$python" "$here/trace_format_check.py" "$tmp/$name.json"; then failures=$((failures + 1)); return; fi
  # The trace's steps hold every generated token: their count is the summary line's.
  local reported traced
  reported="$(sed -n 's/^tokens \([0-9]*\),.*/\1/p' "$tmp/$name.out")"
  traced="$("$python" -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(sum(len(e["args"]["tokens"]) for e in d["traceEvents"] if e.get("ph") == "X" and e["name"] == "step"))' "$tmp/$name.json")"
  if [ -z "$reported" ] || [ "$reported" != "$traced" ]; then
    echo "FAIL: $name: the summary reports ${reported:-no} tokens, the trace's steps hold $traced"
    failures=$((failures + 1)); return
  fi
  if ! "$python" -c 'import json, sys
d = json.load(open(sys.argv[1]))
assert d["stats"]["steps"] > 0 and "run" in d, "no steps or no run summary"' "$tmp/$name.stats.json"; then
    echo "FAIL: $name: the statistics file"; failures=$((failures + 1)); return
  fi
  echo "ok: $name ($traced tokens traced)"
}

run chain --compare --gamma 4
run tree --tree 2,2,1,1 --gamma auto
run adaptive --gamma auto --temperature 0

# The report of a real run in the browser.
rc=0
SPECDEC_PYTHON="${SPECDEC_PYTHON:-$python}" bash "$here/report_browser_test.sh" "$tmp/chain.json" || rc=$?
if [ "$rc" = 77 ]; then echo "(the browser check was skipped)"; elif [ "$rc" != 0 ]; then failures=$((failures + 1)); fi

if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
