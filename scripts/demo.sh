#!/usr/bin/env bash
# Builds the examples and runs the demo: speculative decoding on the real llama2.c pair
# (stories260K target, llama2xs 279K draft), streamed and colored, with the autoregressive
# baseline for comparison, with the draft length chosen per step from measured costs (--gamma auto).
# Extra arguments go to specdec-generate (see --help); a later --gamma N fixes γ instead.
# The model folder is SPECDEC_MODELS_DIR, or ../shared/models beside the checkout; without
# one, it says how to download the files and runs the built-in quickstart instead.
#
# Then a second act (about 15 s on two cores; no model files needed): specdec-random-pair times
# speculative against plain decoding at the stories110M/15M shapes, with random weights made by
# the example engine's generator and the acceptance rate controlled (not a real draft model), and
# reports the measured tokens/s ratio on this machine beside Leviathan et al.'s prediction.
#
# Each act records its run (--trace) and turns it into a page of charts (scripts/trace_report.py,
# when Python has matplotlib) in the build folder's demo/ folder: demo/real_pair.html and
# demo/random_pair.html (docs/traces.md).
#
# Environment: SPECDEC_DEMO_SECOND_ACT=0 skips the second act. SPECDEC_DEMO_NO_BUILD=1 skips
# installing packages and the CMake configure and build steps (the programs must be built
# already), and SPECDEC_DEMO_BUILD_DIR names the build folder (default build/release).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${SPECDEC_DEMO_BUILD_DIR:-build/release}"
case "$build_dir" in /*) ;; *) build_dir="./${build_dir}" ;; esac
second_act="${SPECDEC_DEMO_SECOND_ACT:-1}"
targets=(specdec-generate specdec_quickstart)
if [ "$second_act" != 0 ]; then targets+=(specdec-random-pair); fi
if [ "${SPECDEC_DEMO_NO_BUILD:-0}" != 1 ]; then
  bash scripts/install_deps.sh
fi
if [ -z "${SPECDEC_MODELS_DIR:-}" ] && [ -d ../shared/models ]; then
  SPECDEC_MODELS_DIR="$(cd ../shared/models && pwd)"
fi
if [ "${SPECDEC_DEMO_NO_BUILD:-0}" != 1 ]; then
  cmake --preset release
  cmake --build --preset release --target "${targets[@]}"
fi
out_dir="${build_dir}/demo"
mkdir -p "$out_dir"
# report TRACE: the trace's page of charts beside it, with the first Python that has matplotlib.
report() {
  local py
  for py in "${SPECDEC_PYTHON:-}" python3 /usr/bin/python3; do
    if [ -n "$py" ] && "$py" -c 'import matplotlib' >/dev/null 2>&1; then
      "$py" scripts/trace_report.py "$1" -o "${1%.json}.html" && return 0
      return 1
    fi
  done
  echo "(no report: Python's matplotlib is missing; scripts/install_deps.sh installs python3-matplotlib)"
}
if [ -n "${SPECDEC_MODELS_DIR:-}" ] && [ -f "${SPECDEC_MODELS_DIR}/stories260K.bin" ]; then
  "${build_dir}/examples/llama2/specdec-generate" --models "${SPECDEC_MODELS_DIR}" --compare --gamma auto \
    --trace "${out_dir}/real_pair.json" "$@"
  report "${out_dir}/real_pair.json"
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
  "${build_dir}/examples/specdec_quickstart"
fi
if [ "$second_act" != 0 ]; then
  echo
  echo "== Second act: random weights at the stories110M/15M shapes, acceptance controlled (not a real draft model) =="
  "${build_dir}/examples/llama2/specdec-random-pair" --trace "${out_dir}/random_pair.json"
  report "${out_dir}/random_pair.json"
fi
