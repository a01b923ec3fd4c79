#!/usr/bin/env bash
# Builds and runs the whole test suite.
#  1. The sanitizer builds (scripts/sanitize.sh): unit, fault-injection and forged-file tests
#     and a reduced distribution suite under AddressSanitizer + UndefinedBehaviorSanitizer, the
#     batch tests under ThreadSanitizer, the fuzz harnesses over their seed corpora (when
#     clang++-14 is installed). Skip them with SPECDEC_SKIP_SANITIZERS=1.
#  2. The release preset (optimized, warnings as errors, the compiler's baseline instruction
#     set), last, so that its summary ends the output. The hot core dispatches at run time, so
#     this one build holds every path: ctest runs the unit tests once per path ("portable: ",
#     "avx2: ", "avx512: " before each name) and reports a path this CPU cannot run as skipped;
#     the distribution suites run on the portable path and on this CPU's best ("best: ").
# Model-based tests use the folder in SPECDEC_MODELS_DIR, or ../shared/models beside the
# checkout when it exists; without one they skip with a message.
#
# `bash scripts/test.sh --quick`: the quick tier for contributors: the release build of the unit
# test executables only, run on this machine's own instruction-set path, and the chain, tree and
# batch distribution suites on a small sample (10,000 sequences per case, same false-alarm
# rate, without the negative controls, which need the full sample for their power); no
# sanitizers, no models, no packaging. The full command (no argument) is the one CI runs.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --quick ]; then
  bash scripts/install_deps.sh
  start=$(date +%s)
  cmake --preset release -DSPECDEC_MODELS_DIR= >/dev/null
  quick=(specdec_tests specdec_kernel_tests specdec_tree_tests specdec_batch_tests specdec_batch_decode_tests specdec_batch_allocation_tests
         specdec_fault_tests specdec_allocation_tests)
  statistical=(specdec_distribution_tests specdec_tree_distribution_tests specdec_batch_distribution_tests)
  cmake --build --preset release --target "${quick[@]}" "${statistical[@]}"
  failed=0 passed=0
  for t in "${quick[@]}"; do
    if "build/release/tests/$t"; then passed=$((passed + 1)); else failed=$((failed + 1)); fi
  done
  for t in "${statistical[@]}"; do
    if SPECDEC_DISTRIBUTION_SAMPLES=10000 "build/release/tests/$t" "~*egative control*"; then
      passed=$((passed + 1)); else failed=$((failed + 1)); fi
  done
  echo "quick tier: $(( $(date +%s) - start )) s"
  echo "quick: ${passed} passed, ${failed} failed"
  [ "$failed" -eq 0 ]
  exit
fi
if [ "${SPECDEC_FUZZ_DEPS:-0}" = 1 ]; then bash scripts/install_deps.sh --fuzz; else bash scripts/install_deps.sh; fi
if [ -z "${SPECDEC_MODELS_DIR:-}" ] && [ -d ../shared/models ]; then
  SPECDEC_MODELS_DIR="$(cd ../shared/models && pwd)"
fi
export SPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR:-}"

# Each stage's wall time is printed after it, and all of them before the release summary.
stage_times=()
timed() {
  local name=$1 start=$SECONDS
  shift
  "$@"
  stage_times+=("$name: $((SECONDS - start)) s")
  echo "== $name: $((SECONDS - start)) s =="
}
if [ "${SPECDEC_SKIP_SANITIZERS:-0}" != 1 ]; then
  timed "sanitizers: address + undefined behaviour" bash scripts/sanitize.sh asan
  timed "sanitizers: threads" bash scripts/sanitize.sh tsan
  timed "sanitizers: fuzz harnesses" bash scripts/sanitize.sh fuzz
fi

echo "== release build: the whole suite =="
cmake --preset release -DSPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR}"
timed "release build" cmake --build --preset release
echo "== stage times: ${stage_times[*]/%/;} =="
ctest --preset release
