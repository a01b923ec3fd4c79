#!/usr/bin/env bash
# specdec-generate's draft-side options on the real pair in SPECDEC_MODELS_DIR, at the default
# length: --draft-temperature (draft-side sampling) and --draft-stop, with chains and with trees
# (fixed and planned), must run to the end and say what they did; at temperature 0 they must give
# the greedy text of plain target steps (--gamma 0) token for token, as --lenience must (a token
# the target gives no mass is never accepted); --lenience is refused without --scheme token and
# its run says that the output is not the target's distribution. Exit status 77 (skipped)
# without the model files.
#
#   tests/integration/scripts/generate_draft_options_test.sh path/to/specdec-generate
set -uo pipefail
generate="${1:?usage: generate_draft_options_test.sh path/to/specdec-generate}"
# shellcheck source=require_models.sh
source "$(dirname "${BASH_SOURCE[0]}")/require_models.sh"
failures=0

# run NAME STATUS PATTERN ARGS...: exits with STATUS and prints a line matching PATTERN.
run() {
  local name="$1" status="$2" pattern="$3" rc=0
  shift 3
  "$generate" --models "$models" --no-color "$@" >"$tmp/out" 2>&1 || rc=$?
  if [ "$rc" != "$status" ]; then
    echo "FAIL: $name: exit status $rc (expected $status):"
    tail -n 5 "$tmp/out" | sed 's/^/    /'
    failures=$((failures + 1))
  elif ! grep -Eq -- "$pattern" "$tmp/out"; then
    echo "FAIL: $name: no line matches /$pattern/:"
    tail -n 5 "$tmp/out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: $name"
  fi
}
# text ARGS...: the generated text (everything before the summary's "drafter ..." line).
text() {
  "$generate" --models "$models" --no-color "$@" 2>&1 | sed '/^drafter /,$d'
}

run "draft-side sampling and stop, chains" 0 "^draft-side sampling at temperature 1.2 \(exact\)" \
  --draft-temperature 1.2 --draft-stop 0.05
run "draft-side sampling and stop, trees" 0 "^draft-side stop below q = 0.05 \(exact\)" \
  --tree 2,2,1 --draft-temperature 1.2 --draft-stop 0.05
run "draft-side sampling and stop, planned trees" 0 "^steps by depth" \
  --tree 2,2,1 --gamma auto --draft-temperature 0.8 --draft-stop 0.05
run "lenience says the distribution changes" 0 "^lenience 0.5: NOT the target's distribution" \
  --scheme token --lenience 0.5
run "lenience needs token verification" 2 "--lenience L needs chains with --scheme token" --lenience 0.5
run "lenience needs chains" 2 "--lenience L needs chains with --scheme token" --tree 2,2 --scheme token --lenience 0.5

greedy="$(text --temperature 0 --gamma 0)"
if [ "$(printf '%s' "$greedy" | wc -w)" -lt 20 ]; then
  echo "FAIL: the greedy run produced almost no text:"
  printf '%s\n' "$greedy" | sed 's/^/    /'
  failures=$((failures + 1))
fi
for args in "--draft-temperature 1.5 --draft-stop 0.1" "--tree 3,2,1 --draft-temperature 1.5 --draft-stop 0.1" \
            "--scheme token --lenience 0.3"; do
  # shellcheck disable=SC2086  # (the arguments are split on purpose)
  if [ "$(text --temperature 0 $args)" = "$greedy" ]; then
    echo "ok: temperature 0 with $args gives the greedy text"
  else
    echo "FAIL: temperature 0 with $args differs from the greedy text"
    failures=$((failures + 1))
  fi
done
if [ "$failures" -ne 0 ]; then echo "$failures check(s) failed"; exit 1; fi
echo "all checks passed"
