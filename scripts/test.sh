#!/usr/bin/env bash
# Builds and runs the whole test suite (release preset: optimized, warnings as errors, the
# compiler's baseline instruction set). The hot core dispatches at run time, so this one build
# holds every path: ctest runs the unit and distribution tests once per path ("portable: ",
# "avx2: ", "avx512: " before each name) and reports a path this CPU cannot run as skipped.
# Model-based tests use the folder in SPECDEC_MODELS_DIR, or ../shared/models beside the
# checkout when it exists; without one they skip with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
if [ -z "${SPECDEC_MODELS_DIR:-}" ] && [ -d ../shared/models ]; then
  SPECDEC_MODELS_DIR="$(cd ../shared/models && pwd)"
fi
export SPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR:-}"

cmake --preset release -DSPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR}"
cmake --build --preset release
ctest --preset release
