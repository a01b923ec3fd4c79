#!/usr/bin/env bash
# specdec-random-pair with trees (llama2::controlled_drafter::propose_tree). Each run checks the
# greedy identity itself (exit status 1 otherwise).
#  - Acceptance by sibling rank is what was set: one level of two children, the first right with
#    probability 0.5 and the second always right when the first is not, gives exactly 2 tokens
#    per target pass; with the second never right, fewer; a chain of 4 always right, exactly 5.
#  - Two sequences under a fixed tree 2,2,1,1 (the multi-sequence tree pass), at the default
#    length (200 tokens); the other runs are shorter (60 and 64 tokens).
#  - The planner within 3,2,1 from a measured, saved and reloaded profile: the same plan twice.
#  - Misuse refused with a message: --siblings without --tree, a zero branching.
#
#   tests/integration/scripts/random_pair_tree_test.sh path/to/specdec-random-pair
set -euo pipefail
program="${1:?usage: random_pair_tree_test.sh path/to/specdec-random-pair}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run NAME ARGS...: the program's output in $tmp/NAME
  local name="$1"; shift
  "$program" "$@" > "$tmp/$name" 2>&1 || { tail -n 5 "$tmp/$name"; fail "$* exited with status $?"; }
}
per_pass() { sed -n 's/^tokens per target pass \([0-9.]*\) per sequence.*/\1/p' "$tmp/$1"; }

run second_always --tokens 60 --tree 2 --alpha 0.5 --siblings 1
[ "$(per_pass second_always)" = "2.00" ] || fail "tree 2, second child always right: $(per_pass second_always) tokens per pass, expected 2.00"
run second_never --tokens 60 --tree 2 --alpha 0.5 --siblings 0
awk -v x="$(per_pass second_never)" 'BEGIN { exit !(x > 1.2 && x < 1.8) }' ||
  fail "tree 2, second child never right: $(per_pass second_never) tokens per pass, expected about 1.5"
run chain --tokens 60 --tree 1,1,1,1 --alpha 1
[ "$(per_pass chain)" = "5.00" ] || fail "a chain of 4 always right: $(per_pass chain) tokens per pass, expected 5.00"
grep -q "no prediction for trees" "$tmp/chain" || fail "the report does not say Thm. 3.8 is for chains"

run batch --batch 2 --tree 2,2,1,1
grep -q "greedy identity: the speculative output equals the plain output token for token (2 sequences)" "$tmp/batch" ||
  fail "no greedy identity line for two sequences"

run planned_first --tokens 64 --tree 3,2,1 --gamma auto --measure-profile "$tmp/pair.profile"
run planned_second --tokens 64 --tree 3,2,1 --gamma auto --profile "$tmp/pair.profile"
first_plan="$(grep '^steps by depth' "$tmp/planned_first")" || fail "no plan line in the first planned run"
second_plan="$(grep '^steps by depth' "$tmp/planned_second")" || fail "no plan line in the second planned run"
[ "$first_plan" = "$second_plan" ] || fail "the same profile planned differently: '$first_plan' vs '$second_plan'"

if "$program" --tokens 8 --siblings 0.5 > "$tmp/bad" 2>&1; then fail "--siblings without --tree accepted"; fi
grep -q "add --tree" "$tmp/bad" || fail "no message for --siblings without --tree"
if "$program" --tokens 8 --tree 2,0 > "$tmp/bad" 2>&1; then fail "--tree 2,0 accepted"; fi
grep -q "outside 1..8" "$tmp/bad" || fail "no message for a zero branching"
echo "PASS: 2.00 and $(per_pass second_never) tokens per pass by sibling rank, 5.00 for the sure chain; two sequences; the same plan ($first_plan)"
