#!/usr/bin/env bash
# Builds the examples and runs the demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
cmake --preset release
cmake --build --preset release --target specdec_quickstart
./build/release/examples/specdec_quickstart "$@"
