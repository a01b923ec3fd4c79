#!/usr/bin/env bash
# specdec-conformance's --max-context and --min-acceptance on the real pair in SPECDEC_MODELS_DIR:
#  - --max-context past the models' window is cut to the window, said so, and the contract then
#    builds contexts that long; a shorter one is used as given;
#  - the measured acceptance is printed; --min-acceptance above it fails the run (exit status 1)
#    with a message that says the output is still exact; below it, the run passes;
#  - --min-acceptance outside [0, 1] is a usage error (exit status 2).
# Exit status 77 (skipped) without the model files.
#
#   tests/integration/scripts/conformance_options_test.sh path/to/specdec-conformance
set -uo pipefail
conformance="${1:?usage: conformance_options_test.sh path/to/specdec-conformance}"
# shellcheck source=require_models.sh
source "$(dirname "${BASH_SOURCE[0]}")/require_models.sh"
failures=0

# expect NAME STATUS PATTERN ARGS...: the run must exit with STATUS and print a line matching PATTERN.
# expect NAME STATUS PATTERN ARGS...: a run with ARGS exits with STATUS and prints a line matching
# PATTERN. (Checks with the same ARGS as the one before share its run.)
last_args="" last_rc=0
expect() {
  local name="$1" status="$2" pattern="$3" rc=0
  shift 3
  if [ "$*" = "$last_args" ]; then
    rc=$last_rc
  else
    "$conformance" --models "$models" "$@" >"$tmp/out" 2>&1 || rc=$?
    last_args="$*" last_rc=$rc
  fi
  if [ "$rc" != "$status" ]; then
    echo "FAIL: $name: exit status $rc (expected $status); its last lines:"
    tail -n 6 "$tmp/out" | sed 's/^/    /'
    failures=$((failures + 1))
  elif ! grep -Eq -- "$pattern" "$tmp/out"; then
    echo "FAIL: $name: no line matches /$pattern/; its last lines:"
    tail -n 6 "$tmp/out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: $name"
  fi
}

expect "--max-context past the window is cut to it" 0 "contexts up to 256 tokens" --max-context 1000 --samples 500
expect "--max-context past the window is said so" 0 "past the models' window" --max-context 1000 --samples 500
expect "--max-context within the window is used as given" 0 "contexts up to 120 tokens" --max-context 120 --samples 500
expect "the measured acceptance is printed" 0 "^acceptance: 0\.[0-9]+ of [0-9]+ drafted tokens accepted" --samples 500 --min-acceptance 0.5
expect "--min-acceptance below the measured rate passes" 0 "^all passed" --samples 500 --min-acceptance 0.5
expect "--min-acceptance above the measured rate fails" 1 "below --min-acceptance 0.990: the output is still exact" \
  --samples 500 --min-acceptance 0.99
expect "--min-acceptance outside [0, 1] is a usage error" 2 "min-acceptance" --min-acceptance 1.5

if [ "$failures" -ne 0 ]; then
  echo "$failures checks failed"
  exit 1
fi
echo "all 7 checks passed"
