#!/usr/bin/env bash
# Builds the examples and runs the demo: speculative decoding on the real llama2.c pair
# (stories260K target, llama2xs 279K draft), streamed and colored, with the autoregressive
# baseline for comparison, with the draft length chosen per step from measured costs (--gamma auto).
# Extra arguments go to specdec-generate (see --help); a later --gamma N fixes γ instead.
# The model folder is SPECDEC_MODELS_DIR, or ../shared/models beside the checkout; without
# one, it says how to download the files and runs the built-in quickstart instead.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
if [ -z "${SPECDEC_MODELS_DIR:-}" ] && [ -d ../shared/models ]; then
  SPECDEC_MODELS_DIR="$(cd ../shared/models && pwd)"
fi
cmake --preset release
cmake --build --preset release --target specdec-generate specdec_quickstart
if [ -n "${SPECDEC_MODELS_DIR:-}" ] && [ -f "${SPECDEC_MODELS_DIR}/stories260K.bin" ]; then
  ./build/release/examples/llama2/specdec-generate --models "${SPECDEC_MODELS_DIR}" --compare --gamma auto "$@"
else
  echo "No model files found: run scripts/download_models.sh DIR and set SPECDEC_MODELS_DIR=DIR."
  echo "Running the quickstart with its built-in character models instead."
  ./build/release/examples/specdec_quickstart
fi
