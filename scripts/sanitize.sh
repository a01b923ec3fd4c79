#!/usr/bin/env bash
# The sanitizer builds, as scripts/test.sh runs them before the release suite:
#  1. asan preset (AddressSanitizer + UndefinedBehaviorSanitizer, no recovery: the first report
#     fails the test): the unit tests (every instruction-set path), the fault-injection tests,
#     the forged-file tests and a reduced distribution suite (SPECDEC_DISTRIBUTION_SAMPLES
#     sequences per case, same false-alarm rate, without the negative controls, which need the
#     full sample for their power).
#     Also the tree tests (every path), the multi-sequence batch loop and the conformance kit.
#  2. tsan preset (ThreadSanitizer): the batch API's tests and the batch loop's, which run steps
#     on several threads.
#  3. Each libFuzzer harness of tests/fuzz/ over its seed corpus (scripts/fuzz.sh --smoke), when
#     clang++-14 is installed (`bash scripts/install_deps.sh --fuzz`; CI installs it).
# Usage: bash scripts/sanitize.sh [asan] [tsan] [fuzz]   (default: all three)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SPECDEC_MODELS_DIR:-}" ] && [ -d ../shared/models ]; then
  SPECDEC_MODELS_DIR="$(cd ../shared/models && pwd)"
fi
export SPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR:-}"
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(asan tsan fuzz)

for stage in "${stages[@]}"; do
  case "$stage" in
    asan)
      echo "== sanitize: address + undefined behaviour =="
      cmake --preset asan -DSPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR}" >/dev/null
      cmake --build --preset asan --target specdec_tests specdec_distribution_tests specdec_fault_tests \
        llama2_files_test specdec_tree_tests specdec_batch_decode_tests specdec_conformance_tests
      export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
      # (Left to the release suite: the negative controls, which need the full sample for their
      # power, and the enumeration of tree verification's accepted lengths over 48 model pairs,
      # which is arithmetic on small tables and takes minutes per path under the sanitizers.)
      SPECDEC_DISTRIBUTION_SAMPLES=10000 \
        ctest --preset asan -R "^(portable|avx2|avx512):|fault|files" \
        -E "Negative control|negative control|as many tokens as recursive rejection sampling|_NOT_BUILT" --no-tests=error
      # The multi-sequence batch loop, and the conformance kit on every adapter but the llama2
      # engine (whose files and faults the cases above cover), each executable as a whole.
      build/asan/tests/specdec_batch_decode_tests
      build/asan/tests/specdec_conformance_tests "~the kit passes on the llama2 engine*"
      ;;
    tsan)
      echo "== sanitize: threads =="
      cmake --preset tsan -DSPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR}" >/dev/null
      cmake --build --preset tsan --target specdec_batch_tests specdec_batch_decode_tests
      export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1
      # (Only these two executables are built here: the placeholders ctest keeps for the others,
      # and the compile-fail tests, are left out.)
      ctest --preset tsan -R "batch|Batch" -E "_NOT_BUILT|compile_fail" --no-tests=error
      # The batch loop on the built-in pool and on callers' executors.
      build/tsan/tests/specdec_batch_decode_tests
      ;;
    fuzz)
      if command -v "${CXX_FUZZ:-clang++-14}" >/dev/null 2>&1; then
        echo "== sanitize: fuzz harnesses over their seed corpora =="
        SPECDEC_FUZZ_CXX="${CXX_FUZZ:-clang++-14}" bash scripts/fuzz.sh --smoke
      else
        echo "== sanitize: fuzz harnesses skipped: clang++-14 not installed (bash scripts/install_deps.sh --fuzz) =="
      fi
      ;;
    *) echo "sanitize.sh: unknown stage '$stage' (asan, tsan, fuzz)" >&2; exit 2 ;;
  esac
done
