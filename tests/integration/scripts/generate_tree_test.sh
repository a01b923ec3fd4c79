#!/usr/bin/env bash
# specdec-generate --tree on the real pair in SPECDEC_MODELS_DIR, at its default length (256
# tokens), must end with exit status 0: the README's and the demo's tree commands once stopped
# with exit status 1 at token 248, where the tree's 10 nodes above its deepest level no longer fit
# the draft's 256-token window. Also wider trees, other seeds, and runs to the end of the target's
# 512-token window with an early-exit drafter (whose window is the target's). Some runs must have
# reached the end of each window (a stop token can end a run earlier), or the test would prove
# nothing. Trees from a children list (--tree-children) too, fixed and planned, and a list that is
# not a tree refused by name. Exit status 77 (skipped) without the model files.
#
#   tests/integration/scripts/generate_tree_test.sh path/to/specdec-generate
set -uo pipefail
generate="${1:?usage: generate_tree_test.sh path/to/specdec-generate}"
# shellcheck source=require_models.sh
source "$(dirname "${BASH_SOURCE[0]}")/require_models.sh"
failures=0 tokens=0 draft_end=0 target_end=0

# run NAME ARGS...: specdec-generate must exit with status 0; sets `tokens` to those it generated.
run() {
  local name="$1" rc=0
  shift
  tokens=0
  "$generate" --models "$models" --no-color "$@" >"$tmp/out" 2>&1 || rc=$?
  local n
  n="$(sed -n 's/^tokens \([0-9]*\),.*/\1/p' "$tmp/out")"
  if [ "$rc" != 0 ] || [ -z "$n" ]; then
    echo "FAIL: $name: exit status $rc (expected 0):"
    tail -n 5 "$tmp/out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    tokens="$n"
    echo "ok: $name ($tokens tokens)"
  fi
}

# The draft's window: from a context of 247 tokens on (the prompt's 5 and 242 generated), the 10
# nodes above a 2,2,1,1 tree's deepest level no longer fit its 256.
for args in "--tree 2,2,1,1 --compare" "--tree 3,2,1,1" "--tree 4,4" "--tree 2,2,1,1 --seed 1" \
            "--tree 2,2,1,1 --seed 2" "--tree 2,2,1,1 --temperature 0" "--tree-children 3,2,1,0,1,1" \
            "--tree-children 2,2,1,1,0,1 --gamma auto --seed 1"; do
  # shellcheck disable=SC2086  # (the arguments are split on purpose)
  run "$args" $args
  if [ "$tokens" -ge 250 ]; then draft_end=$((draft_end + 1)); fi
done
# The target's window: 505 tokens after the prompt's 5; from a context of 499 on, a 2,2,1,1 tree's
# 14 nodes no longer fit its 512.
for seed in 4 10; do
  run "--drafter early-exit:3 --tree 2,2,1,1 --max-tokens 505 --seed $seed" \
    --drafter early-exit:3 --tree 2,2,1,1 --max-tokens 505 --seed "$seed"
  if [ "$tokens" -ge 500 ]; then target_end=$((target_end + 1)); fi
done
# A tree from a children list (tree_shape::from_children) to the end of the target's window.
run "--drafter early-exit:3 --tree-children 3,2,1,0,1,1 --max-tokens 505 --seed 4" \
  --drafter early-exit:3 --tree-children 3,2,1,0,1,1 --max-tokens 505 --seed 4
if [ "$tokens" -ge 500 ]; then target_end=$((target_end + 1)); fi
# A children list that is not a tree is refused by name.
rc=0
"$generate" --models "$models" --no-color --tree-children 1,0,2 >"$tmp/out" 2>&1 || rc=$?
if [ "$rc" != 2 ] || ! grep -q -- "--tree-children: .*a node that no earlier entry made" "$tmp/out"; then
  echo "FAIL: --tree-children 1,0,2: exit status $rc (expected 2 and the problem named):"
  tail -n 3 "$tmp/out" | sed 's/^/    /'
  failures=$((failures + 1))
else
  echo "ok: --tree-children 1,0,2 is refused by name"
fi

if [ "$draft_end" -eq 0 ] || [ "$target_end" -eq 0 ]; then
  echo "FAIL: runs that reached the end of the draft's window: $draft_end, of the target's: $target_end;"
  echo "      stop tokens ended the others early, so a window's end was not tested"
  failures=$((failures + 1))
fi
if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
