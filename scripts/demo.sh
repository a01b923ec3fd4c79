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
  if [ -n "${SPECDEC_MODELS_DIR:-}" ]; then
    echo "No stories260K.bin in SPECDEC_MODELS_DIR=${SPECDEC_MODELS_DIR}."
  else
    echo "No model files: SPECDEC_MODELS_DIR is not set (and there is no ../shared/models beside the checkout)."
  fi
  echo "This demo is meant for the real llama2.c pair (stories260K target, llama2xs 279K draft, about 2 MB"
  echo "in all). To get it, on a machine with network access:"
  echo "    bash scripts/download_models.sh DIR     # downloads the three files, checks their SHA-256 sums"
  echo "    export SPECDEC_MODELS_DIR=DIR"
  echo "    bash scripts/demo.sh"
  echo "Meanwhile, the quickstart with its two built-in character models (a 4-gram target, a bigram draft):"
  echo
  ./build/release/examples/specdec_quickstart
fi
