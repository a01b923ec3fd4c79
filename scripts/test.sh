#!/usr/bin/env bash
# Builds and runs the whole test suite: first portably (release preset: optimized, warnings as
# errors, the compiler's baseline instruction set), then, when this machine has AVX2 or AVX-512,
# once more for its own instruction set (native preset), so that the vectorized paths it would
# run are tested too. The native build silences -Wmaybe-uninitialized and -Wuninitialized, which
# GCC 12 raises falsely inside its own AVX-512 intrinsic headers.
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

# What -march=native adds here (nothing to test again when it adds no vector extension).
native_simd="$(${CXX:-c++} -march=native -dM -E -x c++ /dev/null 2>/dev/null | grep -oE '__AVX2__|__AVX512F__' | sort -u | tr '\n' ' ' || true)"
if [ -n "${native_simd}" ]; then
  echo "== again for this machine's instruction set (-march=native: ${native_simd% })"
  cmake --preset native -DSPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR}"
  cmake --build --preset native
  ctest --preset native
else
  echo "== -march=native adds no AVX2 or AVX-512 here: the portable build above is the only one"
fi
