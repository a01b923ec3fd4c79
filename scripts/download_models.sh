#!/usr/bin/env bash
# Downloads the model files used by the real-model tests, the demo and the benchmarks, from
# their public homes, for machines with network access.
#
#   scripts/download_models.sh DIR [--large] [--mirror URL] [--sha256sums FILE]
#
# Always: the tok512 pair (stories260K.bin target, llama2xs_tok512_279K.bin draft, tok512.bin),
# each checked against its known SHA-256 sum before it is put in DIR. With --large: llama2.c's
# stories15M, stories42M and stories110M checkpoints and their 32000-token tokenizer.bin
# (no published sums: not checked unless --sha256sums lists them).
#   --mirror URL        fetch every file from URL/<file name> instead (an http:// or https://
#                       URL: a local copy, a cache, an internal server)
#   --sha256sums FILE   check against the sums in FILE (sha256sum's "HASH  NAME" lines) instead
#                       of the built-in ones
# A file already in DIR is kept when its sum matches and downloaded again when it does not.
# Exit status: 0 done, 1 a download or a checksum failed, 2 bad arguments.
# Then: export SPECDEC_MODELS_DIR=DIR
set -euo pipefail

usage() {
  echo "download_models: $1" >&2
  echo "usage: scripts/download_models.sh DIR [--large] [--mirror URL] [--sha256sums FILE]" >&2
  exit 2
}

dir="" large=0 mirror="" sums_file=""
while [ $# -gt 0 ]; do
  case "$1" in
    --large) large=1 ;;
    --mirror) [ $# -ge 2 ] || usage "--mirror needs a URL"; mirror="$2"; shift ;;
    --sha256sums) [ $# -ge 2 ] || usage "--sha256sums needs a file"; sums_file="$2"; shift ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    -*) usage "unknown option '$1'" ;;
    *) [ -z "$dir" ] || usage "more than one DIR given ('$dir', '$1')"; dir="$1" ;;
  esac
  shift
done
[ -n "$dir" ] || usage "no DIR given"

# A mirror must be scheme://host[:port][/path], with no spaces; a trailing slash is dropped.
if [ -n "$mirror" ]; then
  if ! [[ "$mirror" =~ ^https?://[A-Za-z0-9._~-]+(:[0-9]{1,5})?(/[^[:space:]]*)?$ ]]; then
    usage "--mirror '$mirror' is not an http:// or https:// URL (scheme://host[:port][/path])"
  fi
  mirror="${mirror%/}"
fi

if [ -n "$sums_file" ]; then
  [ -r "$sums_file" ] || usage "--sha256sums: cannot read '$sums_file'"
  sums="$(cat "$sums_file")"
else
  sums='b1e0376c2456e18f294ffe062a2b44e5cb2e207c8aa53538209d2689122ea641  llama2xs_tok512_279K.bin
b0a507e7ad0f626624f17112325e66691f9076d622e1d3274d103d00299f2696  stories260K.bin
037cb335abb25d1fa9e8ecae30ed2a3a8ace9302862ebcdc05d51a6bbb10c312  tok512.bin'
fi

if command -v curl >/dev/null; then downloader=curl
elif command -v wget >/dev/null; then downloader=wget
else echo "download_models: needs curl or wget" >&2; exit 1
fi

expected_sum() {  # file name -> its sum, or nothing
  awk -v name="$1" '$2 == name || $2 == "*" name { print $1; exit }' <<<"$sums"
}

# Checks FILE against the sum for NAME: 0 when it matches or no sum is known, 1 otherwise.
check_sum() {  # file name
  local want have
  want="$(expected_sum "$2")"
  [ -n "$want" ] || return 0
  have="$(sha256sum "$1" | cut -d' ' -f1)"
  [ "$have" = "$want" ] && return 0
  echo "download_models: $2: SHA-256 $have does not match the expected $want" >&2
  return 1
}

fetch() {  # url name
  local url="$1" name="$2" target="$dir/$2"
  [ -z "$mirror" ] || url="$mirror/$name"
  if [ -s "$target" ]; then
    if check_sum "$target" "$name"; then echo "have $name"; return; fi
    echo "download_models: downloading $name again"
  fi
  [ -n "$(expected_sum "$name")" ] || echo "download_models: no known SHA-256 for $name: not checked"
  echo "downloading $name from $url"
  local ok=1
  if [ "$downloader" = curl ]; then
    curl -fsSL --retry 3 --proto '=http,https' -o "$target.part" "$url" || ok=0
  else
    wget -q -O "$target.part" "$url" || ok=0
  fi
  if [ "$ok" = 0 ]; then
    rm -f "$target.part"
    echo "download_models: failed to download $name from $url" >&2
    exit 1
  fi
  if ! check_sum "$target.part" "$name"; then
    rm -f "$target.part"
    echo "download_models: discarded the download of $name (corrupt or changed at $url)" >&2
    exit 1
  fi
  mv "$target.part" "$target"
}

mkdir -p "$dir"
hf=https://huggingface.co/karpathy/tinyllamas/resolve/main
fetch "$hf/stories260K/stories260K.bin" stories260K.bin
fetch "$hf/stories260K/tok512.bin" tok512.bin
fetch https://raw.githubusercontent.com/saltyduckegg/llama2xs.c/main/out/model.bin llama2xs_tok512_279K.bin
if [ "$large" = 1 ]; then
  for m in stories15M stories42M stories110M; do fetch "$hf/$m.bin" "$m.bin"; done
  fetch https://raw.githubusercontent.com/karpathy/llama2.c/master/tokenizer.bin tokenizer.bin
fi
echo "done: export SPECDEC_MODELS_DIR=$(cd "$dir" && pwd)"
