#!/usr/bin/env bash
# Builds and runs the whole test suite (release preset: optimized, warnings as errors).
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
