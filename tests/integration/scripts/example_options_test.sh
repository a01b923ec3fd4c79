#!/usr/bin/env bash
# The example programs' command lines (CLI11): --help prints the options and exits 0; a bad
# value or an unknown option exits 2 with a message that names the option; an option given
# twice keeps its last value (scripts/demo.sh relies on it); what each program needs but does
# not get is named, with where to get it.
#
#   tests/integration/scripts/example_options_test.sh QUICKSTART GENERATE MAKE_RANDOM_CHECKPOINT
set -uo pipefail
quickstart="$1" generate="$2" make_checkpoint="$3"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
failures=0

# check NAME EXPECTED_STATUS TEXT COMMAND...: the command exits with EXPECTED_STATUS and its
# output (stdout and stderr) contains TEXT.
check() {
  local name="$1" want="$2" text="$3" rc=0
  shift 3
  "$@" >"$tmp/out" 2>&1 || rc=$?
  if [ "$rc" != "$want" ] || ! grep -qF -- "$text" "$tmp/out"; then
    echo "FAIL: $name: exit status $rc (expected $want), output should contain '$text':"
    sed 's/^/    /' "$tmp/out"
    failures=$((failures + 1))
  else
    echo "ok: $name"
  fi
}

check "quickstart --help" 0 "--temperature" "$quickstart" --help
check "quickstart bad value" 2 "--gamma" "$quickstart" --gamma three
check "quickstart negative temperature" 2 "--temperature" "$quickstart" --temperature -1
check "quickstart unknown option" 2 "--fast" "$quickstart" --fast
check "quickstart last value wins" 0 "gamma 3" "$quickstart" --tokens 20 --gamma 2 --gamma 3

check "generate --help" 0 "--draft-stop" "$generate" --help
check "generate bad scheme" 2 "--scheme" "$generate" --scheme sideways
check "generate bad gamma" 2 "--gamma" "$generate" --gamma 3x
check "generate bad drafter" 2 "early-exit:0" "$generate" --drafter early-exit:0
check "generate top-p 0" 2 "--top-p" "$generate" --top-p 0
check "generate top-p above 1" 2 "--top-p" "$generate" --top-p 1.5
check "generate max-gamma 0" 2 "--max-gamma" "$generate" --gamma auto --max-gamma 0
check "generate without models" 2 "scripts/download_models.sh" env -u SPECDEC_MODELS_DIR "$generate"

check "make_random_checkpoint without output" 2 "OUTPUT.bin is required" "$make_checkpoint"
check "make_random_checkpoint bad preset" 2 "unknown preset 'tiny'" "$make_checkpoint" "$tmp/x.bin" --preset tiny
check "make_random_checkpoint bad number" 2 "--layers" "$make_checkpoint" "$tmp/x.bin" --layers two
check "make_random_checkpoint shape after preset" 0 "n_layers=2" \
  "$make_checkpoint" "$tmp/x.bin" --layers 2 --preset stories260K

if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
