#!/usr/bin/env bash
# The sanitizer builds, as scripts/test.sh runs them before the release suite:
#  1. asan preset (AddressSanitizer + UndefinedBehaviorSanitizer, no recovery: the first report
#     fails the test): the unit tests (every instruction-set path), the fault-injection tests,
#     the forged-file tests and a reduced distribution suite (SPECDEC_DISTRIBUTION_SAMPLES
#     sequences per case, same false-alarm rate, without the negative controls, which need the
#     full sample for their power).
#     Also the tree tests (every path), the multi-sequence batch loop and the conformance kit.
#     The unit tests run on every instruction-set path; the statistical cases on this machine's
#     best path only. The sanitizer presets link the tests, all but the core's own unit tests,
#     with specdec::compiled (the same kernels, compiled once): the instrumented build takes
#     30-50% less time per translation unit. Both presets keep line tables only (-g1: reports
#     still name file and line), which cuts the instrumented build by about 40%.
#  2. tsan preset (ThreadSanitizer): the batch API's tests and the batch loop's, which run steps
#     on several threads.
#  3. Each libFuzzer harness of tests/fuzz/ over its seed corpus (scripts/fuzz.sh --smoke), when
#     clang++-14 is installed (`bash scripts/install_deps.sh --fuzz`; CI installs it).
# The asan and tsan builds use clang++-14 when it is installed (CI installs it), the default C++
# compiler otherwise; SPECDEC_SANITIZE_CXX names another. Clang builds the instrumented tests in
# about a third less time than g++, and runs them faster, and the suite is then compiled by both
# compilers (the release build uses the default one).
# Usage: bash scripts/sanitize.sh [asan] [tsan] [fuzz]   (default: all three)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${SPECDEC_MODELS_DIR:-}" ] && [ -d ../shared/models ]; then
  SPECDEC_MODELS_DIR="$(cd ../shared/models && pwd)"
fi
export SPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR:-}"
# sanitized_run EXECUTABLE ARGS...: runs a test executable in the background, two at a time (the
# machine's two cores), its output in a log that is printed when it fails; sanitized_wait waits
# for the rest and fails the stage when any failed. (A path this CPU lacks exits with 77: skipped.)
logs="$(mktemp -d)"
trap 'rm -rf "$logs"' EXIT
job_count=0
sanitized_run() {
  while [ "$(jobs -rp | wc -l)" -ge "${SPECDEC_SANITIZE_JOBS:-2}" ]; do wait -n || true; done
  job_count=$((job_count + 1))
  local log="$logs/$job_count.log"
  (
    start=$SECONDS rc=0
    "$@" >"$log" 2>&1 || rc=$?
    if [ "$rc" -eq 0 ]; then
      echo "ok ($((SECONDS - start)) s): ${*#build/*/tests/}: $(grep -E '^(All tests passed|test cases:)' "$log" | tail -n 1)"
    elif [ "$rc" -eq 77 ]; then
      echo "skipped: ${*#build/*/tests/}: $(tail -n 1 "$log")"
    else
      echo "FAILED (exit status $rc, $((SECONDS - start)) s): $*"
      cat "$log"
      touch "$log.failed"
    fi
  ) &
}
sanitized_wait() {
  wait
  local failed
  failed=$(find "$logs" -name '*.failed' | wc -l)
  if [ "$failed" -ne 0 ]; then
    echo "sanitize: $failed of $job_count runs failed"
    exit 1
  fi
  echo "sanitize: $job_count runs passed"
}
# configure PRESET: configures the preset's build folder with the sanitizer compiler (a folder
# configured with another compiler is started afresh).
sanitize_cxx="${SPECDEC_SANITIZE_CXX:-}"
if [ -z "$sanitize_cxx" ] && command -v clang++-14 >/dev/null 2>&1; then sanitize_cxx=clang++-14; fi
configure() {
  local preset=$1 compiler=()
  if [ -n "$sanitize_cxx" ]; then
    compiler=(-DCMAKE_CXX_COMPILER="$(command -v "$sanitize_cxx")")
    local cache="build/$preset/CMakeCache.txt"
    if [ -f "$cache" ] && ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=${compiler[0]#-DCMAKE_CXX_COMPILER=}" "$cache"; then
      rm -rf "build/$preset"
    fi
  fi
  echo "(compiler: ${sanitize_cxx:-the default C++ compiler})"
  cmake --preset "$preset" -DSPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR}" "${compiler[@]}" >/dev/null
}
stages=("$@")
[ ${#stages[@]} -gt 0 ] || stages=(asan tsan fuzz)

for stage in "${stages[@]}"; do
  case "$stage" in
    asan)
      echo "== sanitize: address + undefined behaviour =="
      configure asan
      cmake --build --preset asan --target specdec_tests specdec_kernel_tests specdec_distribution_tests specdec_fault_tests \
        llama2_files_test specdec_tree_tests specdec_batch_decode_tests specdec_conformance_tests
      export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
      t=build/asan/tests
      not_negative=("~*egative control*" "~*as many tokens as recursive rejection sampling*")
      # (The longest runs first, so that the two at a time end together.)
      # The conformance kit on every adapter but the llama2 engine (whose files and faults the
      # cases below cover).
      sanitized_run "$t/specdec_conformance_tests" "~the kit passes on the llama2 engine*"
      # This machine's best path: the [statistical] cases and a reduced distribution suite
      # (SPECDEC_DISTRIBUTION_SAMPLES sequences per case, same false-alarm rate). Left to the
      # release suite: the negative controls, which need the full sample for their power; the
      # enumeration of tree verification's accepted lengths over 48 model pairs, arithmetic on
      # small tables that takes minutes under the sanitizers; and the [statistical] cases on the
      # other paths (the portable path's long rows run 40 times slower instrumented, and the
      # unit tests below already take every path through the same kernels).
      SPECDEC_DISTRIBUTION_SAMPLES=10000 sanitized_run "$t/specdec_distribution_tests" "${not_negative[@]}"
      sanitized_run "$t/specdec_tests" "[statistical]" "${not_negative[@]}"
      sanitized_run "$t/specdec_tree_tests" "[statistical]" "${not_negative[@]}"
      sanitized_run "$t/specdec_kernel_tests" "[statistical]" "${not_negative[@]}"
      # Faults thrown from every kind of adapter.
      sanitized_run "$t/specdec_fault_tests"
      # Every instruction-set path: the unit tests (the [statistical] cases left out).
      for isa in portable avx2 avx512; do
        sanitized_run "$t/specdec_kernel_tests" "--specdec-isa=$isa" "~[statistical]" "${not_negative[@]}"
        sanitized_run "$t/specdec_tests" "--specdec-isa=$isa" "~[statistical]" "${not_negative[@]}"
        sanitized_run "$t/specdec_tree_tests" "--specdec-isa=$isa" "~[statistical]" "${not_negative[@]}"
      done
      # Forged files and the batch loop.
      sanitized_run "$t/llama2_files_test"
      sanitized_run "$t/specdec_batch_decode_tests"
      sanitized_wait
      ;;
    tsan)
      echo "== sanitize: threads =="
      configure tsan
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
