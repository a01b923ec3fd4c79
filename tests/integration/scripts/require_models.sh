# Sourced by the scripts that run specdec-generate on the real pair: exits with status 77
# (skipped, with a message) unless SPECDEC_MODELS_DIR holds the pair and its tokenizer; sets
# `models` to that folder and `tmp` to a scratch folder removed on exit.
models="${SPECDEC_MODELS_DIR:-}"
for f in stories260K.bin llama2xs_tok512_279K.bin tok512.bin; do
  if [ -z "$models" ] || [ ! -f "$models/$f" ]; then
    echo "skipped: ${models:-SPECDEC_MODELS_DIR (unset)}/$f not found (scripts/download_models.sh DIR fetches the pair)"
    exit 77
  fi
done
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
