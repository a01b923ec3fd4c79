#!/usr/bin/env bash
# The planner's commands of specdec-generate on the real pair in SPECDEC_MODELS_DIR, at the
# default length (256 tokens), each must end with exit status 0:
#   --gamma auto --measure-profile FILE     measures and saves a profile, plans from it
#   --gamma auto --profile FILE (3 times)   the same seed gives the same text every time
#   --tree 2,2,1,1 --gamma auto --profile   the tree planner from the profile, reproducibly too
#   --drafter 'lookup>model' (and with --gamma auto --profile)   hierarchical drafting
# and the summary says where the costs came from and what the plan is. A malformed profile is
# refused with an error naming the file and the line. Exit status 77 (skipped) without the models.
#
#   tests/integration/scripts/generate_planner_test.sh path/to/specdec-generate
set -uo pipefail
generate="${1:?usage: generate_planner_test.sh path/to/specdec-generate}"
# shellcheck source=require_models.sh
source "$(dirname "${BASH_SOURCE[0]}")/require_models.sh"
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# run NAME ARGS...: specdec-generate must exit with status 0 and generate 256 tokens (or stop at
# a stop token); its output is left in $tmp/out, its text (before the summary) in $tmp/text.
run() {
  local name="$1" rc=0
  shift
  "$generate" --models "$models" --no-color "$@" >"$tmp/out" 2>&1 || rc=$?
  local n
  n="$(sed -n 's/^tokens \([0-9]*\),.*/\1/p' "$tmp/out")"
  sed '/^drafter /,$d' "$tmp/out" >"$tmp/text"
  if [ "$rc" != 0 ] || [ -z "$n" ]; then
    echo "FAIL: $name: exit status $rc (expected 0):"
    tail -n 5 "$tmp/out" | sed 's/^/    /'
    failures=$((failures + 1))
    return 1
  fi
  echo "ok: $name ($n tokens)"
}
expect() {  # expect PATTERN WHAT: the last run's output contains PATTERN
  grep -q -- "$1" "$tmp/out" || fail "$2: no '$1' in the output"
}

run "--gamma auto --measure-profile" --gamma auto --measure-profile "$tmp/pair.profile" &&
  expect "profile measured and saved to" "--measure-profile"
head -n 1 "$tmp/pair.profile" | grep -q '^specdec-engine-profile 1$' || fail "the saved profile has no header"
expect "^plan: " "--measure-profile"

for i in 1 2 3; do
  run "--gamma auto --profile (run $i)" --gamma auto --profile "$tmp/pair.profile" --seed 9 &&
    expect "the same seed gives the same tokens" "--profile"
  cp "$tmp/text" "$tmp/text.$i"
done
cmp -s "$tmp/text.1" "$tmp/text.2" && cmp -s "$tmp/text.1" "$tmp/text.3" ||
  fail "--profile: the same seed gave different text"

for i in 1 2; do
  run "--tree 2,2,1,1 --gamma auto --profile (run $i)" --tree 2,2,1,1 --gamma auto --profile "$tmp/pair.profile" \
    --seed 3 && expect "^plan: " "--tree --profile"
  cp "$tmp/text" "$tmp/tree.$i"
done
cmp -s "$tmp/tree.1" "$tmp/tree.2" || fail "--tree --profile: the same seed gave different text"

run "--drafter lookup>model" --drafter 'lookup>model' && expect "drafter lookup>model" "lookup>model"
run "--drafter lookup>model --gamma auto --profile" --drafter 'lookup>model' --gamma auto --profile "$tmp/pair.profile"

# A malformed profile: exit status 1, the file and the line named.
printf 'specdec-engine-profile 1\ntarget_pass 1 x\ndraft_step 1\n' >"$tmp/bad.profile"
rc=0
"$generate" --models "$models" --no-color --gamma auto --profile "$tmp/bad.profile" >"$tmp/out" 2>&1 || rc=$?
if [ "$rc" != 1 ]; then fail "a malformed profile: exit status $rc (expected 1)"; fi
expect "bad.profile" "a malformed profile"
expect "line 2" "a malformed profile"

if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
