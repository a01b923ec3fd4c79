#!/usr/bin/env bash
# specdec-random-pair --gamma auto with an engine profile: --measure-profile measures the batch
# engine's profile (specdec::measure_batch_profile) before the timed runs, saves it and plans from
# it; --profile FILE loads it, and the plan (steps by gamma) is then the same as the first run's,
# since nothing is timed during decoding (both at the default length, 200 tokens, two sequences);
# a profile without --gamma auto, and a malformed profile, are refused with a message. Both runs
# print the planner's account ("plan: ..."). --no-drain (each step planned for itself to the
# batch's end) runs from the same profile and says nothing of steps made plain (the two
# sequences here are drafted alike, so the drain rule seldom binds anyway: this checks the
# flag's wiring, the rule itself has its unit and distribution tests); without --gamma auto it is
# refused. Each run also checks the greedy identity itself.
#
#   tests/integration/scripts/random_pair_profile_test.sh path/to/specdec-random-pair
set -euo pipefail
program="${1:?usage: random_pair_profile_test.sh path/to/specdec-random-pair}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
"$program" --batch 2 --gamma auto --measure-profile "$tmp/pair.profile" > "$tmp/first" 2>&1 ||
  { tail -n 5 "$tmp/first"; fail "--measure-profile run exited with status $?"; }
[ -s "$tmp/pair.profile" ] || fail "no profile written"
grep -q "saved to $tmp/pair.profile" "$tmp/first" || fail "the report does not say the profile was measured"
"$program" --batch 2 --gamma auto --profile "$tmp/pair.profile" > "$tmp/second" 2>&1 ||
  { tail -n 5 "$tmp/second"; fail "--profile run exited with status $?"; }
first_plan="$(grep '^steps by gamma' "$tmp/first")" || fail "no plan line in the first run"
second_plan="$(grep '^steps by gamma' "$tmp/second")" || fail "no plan line in the second run"
[ "$first_plan" = "$second_plan" ] || fail "the same profile planned differently: '$first_plan' vs '$second_plan'"
grep -q '^plan: ' "$tmp/first" || fail "no account of the plan in the first run"
grep -q '^plan: ' "$tmp/second" || fail "no account of the plan in the second run"
"$program" --batch 2 --gamma auto --profile "$tmp/pair.profile" --no-drain > "$tmp/no_drain" 2>&1 ||
  { tail -n 5 "$tmp/no_drain"; fail "--no-drain run exited with status $?"; }
grep -q '^plan: ' "$tmp/no_drain" || fail "no account of the plan in the --no-drain run"
if grep -q 'made plain for a draining batch' "$tmp/no_drain"; then fail "--no-drain made steps plain"; fi
if "$program" --tokens 8 --no-drain > "$tmp/bad" 2>&1; then fail "--no-drain without --gamma auto accepted"; fi
grep -q "add --gamma auto" "$tmp/bad" || fail "no message for --no-drain without --gamma auto"
if "$program" --tokens 8 --profile "$tmp/pair.profile" > "$tmp/bad" 2>&1; then fail "--profile without --gamma auto accepted"; fi
grep -q "add --gamma auto" "$tmp/bad" || fail "no message for --profile without --gamma auto"
echo "target_pass 1 2 x" > "$tmp/broken.profile"
if "$program" --tokens 8 --gamma auto --profile "$tmp/broken.profile" > "$tmp/bad" 2>&1; then fail "a malformed profile accepted"; fi
grep -q -- "--profile $tmp/broken.profile" "$tmp/bad" || fail "the error does not name the profile file"
echo "PASS: measured, saved, loaded; the same plan ($first_plan)"
