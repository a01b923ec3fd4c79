#!/usr/bin/env bash
# Builds and runs the whole test suite: first portably (release preset: optimized, warnings as
# errors, the compiler's baseline instruction set), then for each vectorized path this machine
# can run: with AVX2 and FMA (avx2 preset) when it also has AVX-512, and for its own instruction
# set (native preset) when that has AVX2 or AVX-512. The native build silences
# -Wmaybe-uninitialized and -Wuninitialized, which GCC 12 raises falsely inside its own AVX-512
# intrinsic headers.
# Model-based tests use the folder in SPECDEC_MODELS_DIR, or ../shared/models beside the
# checkout when it exists; without one they skip with a message.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
if [ -z "${SPECDEC_MODELS_DIR:-}" ] && [ -d ../shared/models ]; then
  SPECDEC_MODELS_DIR="$(cd ../shared/models && pwd)"
fi
export SPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR:-}"

run_preset() {
  cmake --preset "$1" -DSPECDEC_MODELS_DIR="${SPECDEC_MODELS_DIR}"
  cmake --build --preset "$1"
  ctest --preset "$1"
}

run_preset release

# The vector extensions -march=native turns on here.
native="$(${CXX:-c++} -march=native -dM -E -x c++ /dev/null 2>/dev/null \
  | grep -oE '__AVX2__|__FMA__|__AVX512F__' | sort -u | tr '\n' ' ' || true)"
if [[ "${native}" == *__AVX512F__* && "${native}" == *__AVX2__* && "${native}" == *__FMA__* ]]; then
  echo "== again with AVX2 and FMA (the path of machines without AVX-512)"
  run_preset avx2
fi
if [[ "${native}" == *__AVX2__* || "${native}" == *__AVX512F__* ]]; then
  echo "== again for this machine's instruction set (-march=native: ${native% })"
  run_preset native
else
  echo "== -march=native adds no AVX2 or AVX-512 here: the portable build above is the only one"
fi
