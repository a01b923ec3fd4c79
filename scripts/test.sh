#!/usr/bin/env bash
# Builds and runs the whole test suite.
#  1. The sanitizer builds (scripts/sanitize.sh): unit, fault-injection and forged-file tests
#     and a reduced distribution suite under AddressSanitizer + UndefinedBehaviorSanitizer, the
#     batch tests under ThreadSanitizer, the fuzz harnesses over their seed corpora (when
#     clang++-14 is installed). Skip them with SPECDEC_SKIP_SANITIZERS=1.
#  2. The release preset (optimized, warnings as errors, the compiler's baseline instruction
#     set), last, so that its summary ends the output. The hot core dispatches at run time, so
#     this one build holds every path: ctest runs the unit and distribution tests once per path
#     ("portable: ", "avx2: ", "avx512: " before each name) and reports a path this CPU cannot
#     run as skipped.
# Model-based tests use the folder in SPECDEC_MODELS_DIR, or ../shared/models beside the
# checkout when it exists; without one they skip with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${SPECDEC_FUZZ_DEPS:-0}" = 1 ]; then bash scripts/install_deps.sh --fuzz; else bash scripts/install_deps.sh; fi
if [ -z "${SPECDEC_MODELS_DIR:-}" ] && [ -d ../shared/models ]; then
  SPECDEC_MODELS_DIR="$(cd ../shared/models && pwd)"
fi
export SPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR:-}"

if [ "${SPECDEC_SKIP_SANITIZERS:-0}" != 1 ]; then
  bash scripts/sanitize.sh
fi

echo "== release build: the whole suite =="
cmake --preset release -DSPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR}"
cmake --build --preset release
ctest --preset release
