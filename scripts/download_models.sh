#!/usr/bin/env bash
# Downloads the model files used by the real-model tests, the demo and the benchmarks, from
# their public homes, for machines with network access.
#
#   scripts/download_models.sh DIR [--large]
#
# Always: the tok512 pair (stories260K.bin target, llama2xs_tok512_279K.bin draft, tok512.bin),
# checked against known SHA-256 sums. With --large: llama2.c's stories15M, stories42M and
# stories110M checkpoints and their 32000-token tokenizer.bin.
# Then: export SPECDEC_MODELS_DIR=DIR
set -euo pipefail
dir="${1:?usage: scripts/download_models.sh DIR [--large]}"
large="${2:-}"
mkdir -p "$dir"
fetch() {  # url file
  if [ -s "$dir/$2" ]; then echo "have $2"; return; fi
  echo "downloading $2"
  if command -v curl >/dev/null; then curl -fL --retry 3 -o "$dir/$2.part" "$1"
  else wget -O "$dir/$2.part" "$1"; fi
  mv "$dir/$2.part" "$dir/$2"
}
hf=https://huggingface.co/karpathy/tinyllamas/resolve/main
fetch "$hf/stories260K/stories260K.bin" stories260K.bin
fetch "$hf/stories260K/tok512.bin" tok512.bin
fetch https://raw.githubusercontent.com/saltyduckegg/llama2xs.c/main/out/model.bin llama2xs_tok512_279K.bin
(
  cd "$dir"
  sha256sum -c - <<'SUMS'
b1e0376c2456e18f294ffe062a2b44e5cb2e207c8aa53538209d2689122ea641  llama2xs_tok512_279K.bin
b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696  stories260K.bin
037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312  tok512.bin
SUMS
)
if [ "$large" = "--large" ]; then
  for m in stories15M stories42M stories110M; do fetch "$hf/$m.bin" "$m.bin"; done
  fetch https://raw.githubusercontent.com/karpathy/llama2.c/master/tokenizer.bin tokenizer.bin
fi
echo "done: export SPECDEC_MODELS_DIR=$(cd "$dir" && pwd)"
