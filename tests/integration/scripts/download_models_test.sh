#!/usr/bin/env bash
# Runs scripts/download_models.sh against a local HTTP file server on loopback (python3's
# http.server on 127.0.0.1, a port the system picks) that serves small fake model files made
# here, with their sums in a --sha256sums file: the mirror URL's parsing, the checksum check
# (a good and a corrupted file), and the error paths (404, bad URLs, bad arguments).
#
#   tests/integration/scripts/download_models_test.sh path/to/download_models.sh
set -euo pipefail
script="${1:?usage: download_models_test.sh path/to/download_models.sh}"
for tool in python3 curl sha256sum; do
  command -v "$tool" >/dev/null || { echo "FAIL: $tool is not installed (scripts/install_deps.sh installs it)"; exit 1; }
done
# Loopback only: no proxy may intercept the requests.
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY all_proxy ALL_PROXY
export no_proxy='*' NO_PROXY='*'

tmp="$(mktemp -d)"
server_pid=""
cleanup() {
  if [ -n "$server_pid" ]; then kill "$server_pid" 2>/dev/null || true; wait "$server_pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
pass() { echo "ok: $*"; }

# The served tree: root/ has the three files of the default set (and the --large ones);
# root/sub/ the same under a path; root/bad/ a stories260K.bin that does not match its sum.
mkdir -p "$tmp/root/sub" "$tmp/root/bad"
names=(stories260K.bin tok512.bin llama2xs_tok512_279K.bin)
large=(stories15M.bin stories42M.bin stories110M.bin tokenizer.bin)
for f in "${names[@]}" "${large[@]}"; do
  head -c $((1000 + RANDOM)) /dev/urandom >"$tmp/root/$f"
  cp "$tmp/root/$f" "$tmp/root/sub/$f"
  cp "$tmp/root/$f" "$tmp/root/bad/$f"
done
printf 'X' | dd of="$tmp/root/bad/stories260K.bin" bs=1 seek=10 conv=notrunc status=none
(cd "$tmp/root" && sha256sum "${names[@]}") >"$tmp/sums"

python3 -u -m http.server --bind 127.0.0.1 --directory "$tmp/root" 0 >"$tmp/server.log" 2>&1 &
server_pid=$!
port=""
for _ in $(seq 100); do
  port="$(sed -n 's/.* port \([0-9][0-9]*\).*/\1/p' "$tmp/server.log" | head -n 1)"
  [ -n "$port" ] && break
  kill -0 "$server_pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$port" ] || { echo "FAIL: the local file server did not start:"; cat "$tmp/server.log"; exit 1; }
base="http://127.0.0.1:$port"
echo "file server at $base"

# run NAME EXPECTED_STATUS ARGS...: runs the script, output in $tmp/NAME.out; checks the status.
run() {
  local name="$1" want="$2" rc=0
  shift 2
  bash "$script" "$@" >"$tmp/$name.out" 2>&1 || rc=$?
  if [ "$rc" != "$want" ]; then
    fail "$name: exit status $rc, expected $want; output:"
    sed 's/^/    /' "$tmp/$name.out"
    return 1
  fi
}
# expect_output NAME TEXT: the run's output contains TEXT.
expect_output() {
  if grep -qF -- "$2" "$tmp/$1.out"; then pass "$1: says '$2'"; else
    fail "$1: output lacks '$2':"; sed 's/^/    /' "$tmp/$1.out"
  fi
}
same_files() {  # dir source label
  local f
  for f in "${names[@]}"; do
    cmp -s "$1/$f" "$2/$f" || { fail "$3: $f missing or different"; return; }
  done
  pass "$3: all files downloaded and identical"
}

# 1. Good files: downloaded, checked, identical; the final line says what to export.
if run good 0 "$tmp/models" --mirror "$base" --sha256sums "$tmp/sums"; then
  same_files "$tmp/models" "$tmp/root" good
  expect_output good "done: export SPECDEC_MODELS_DIR=$tmp/models"
  [ -z "$(find "$tmp/models" -name '*.part')" ] && pass "good: no partial files left" || fail "good: partial files left"
fi

# 2. A second run keeps the files whose sums match.
if run again 0 "$tmp/models" --mirror "$base/" --sha256sums "$tmp/sums"; then
  expect_output again "have stories260K.bin"
  grep -q '^downloading' "$tmp/again.out" && fail "again: downloaded a file it had" || pass "again: downloaded nothing"
fi

# 3. A local file that does not match its sum is downloaded again.
printf 'damaged' >"$tmp/models/tok512.bin"
if run repair 0 "$tmp/models" --mirror "$base" --sha256sums "$tmp/sums"; then
  expect_output repair "downloading tok512.bin again"
  same_files "$tmp/models" "$tmp/root" repair
fi

# 4. URL with a path, and a trailing slash: files come from base/sub/<name>.
if run subpath 0 "$tmp/sub_models" --mirror "$base/sub/" --sha256sums "$tmp/sums"; then
  expect_output subpath "from $base/sub/stories260K.bin"
  same_files "$tmp/sub_models" "$tmp/root" subpath
fi

# 5. A corrupted download: exit 1, the file named, nothing kept under its name.
if run corrupt 1 "$tmp/corrupt_models" --mirror "$base/bad" --sha256sums "$tmp/sums"; then
  expect_output corrupt "stories260K.bin: SHA-256"
  expect_output corrupt "does not match the expected $(awk '$2 == "stories260K.bin" {print $1}' "$tmp/sums")"
  [ ! -e "$tmp/corrupt_models/stories260K.bin" ] && [ ! -e "$tmp/corrupt_models/stories260K.bin.part" ] &&
    pass "corrupt: the bad file was not kept" || fail "corrupt: the bad file was kept"
fi

# 6. The built-in sums reject the fake files (they are not the real models).
if run builtin_sums 1 "$tmp/builtin_models" --mirror "$base"; then
  expect_output builtin_sums "does not match the expected"
fi

# 7. 404: exit 1, the file and the URL named, no partial file.
if run missing 1 "$tmp/missing_models" --mirror "$base/no/such/folder" --sha256sums "$tmp/sums"; then
  expect_output missing "failed to download stories260K.bin from $base/no/such/folder/stories260K.bin"
  [ -z "$(find "$tmp/missing_models" -type f)" ] && pass "missing: no file left" || fail "missing: files left"
fi

# 8. Nothing listening: the same error.
if run refused 1 "$tmp/refused_models" --mirror "http://127.0.0.1:1" --sha256sums "$tmp/sums"; then
  expect_output refused "failed to download stories260K.bin from http://127.0.0.1:1/stories260K.bin"
fi

# 9. Bad URLs are refused before anything is fetched (exit 2, the URL named).
for bad in "ftp://127.0.0.1/models" "127.0.0.1:$port" "http://" "http://host name/x" "http://127.0.0.1:port/x"; do
  if run bad_url 2 "$tmp/bad_url_models" --mirror "$bad" --sha256sums "$tmp/sums"; then
    expect_output bad_url "--mirror '$bad' is not an http:// or https:// URL"
  fi
done
[ ! -e "$tmp/bad_url_models" ] && pass "bad_url: no folder created" || fail "bad_url: a folder was created"

# 10. Bad arguments (exit 2, the problem named).
run no_dir 2 && expect_output no_dir "no DIR given"
run no_url 2 "$tmp/x" --mirror && expect_output no_url "--mirror needs a URL"
run unknown 2 "$tmp/x" --fast && expect_output unknown "unknown option '--fast'"
run no_sums 2 "$tmp/x" --sha256sums "$tmp/no_such_sums" && expect_output no_sums "cannot read '$tmp/no_such_sums'"

# 11. --large: the four extra files, unchecked when the sums do not list them (and said so).
if run large 0 "$tmp/models" --large --mirror "$base" --sha256sums "$tmp/sums"; then
  expect_output large "no known SHA-256 for stories15M.bin: not checked"
  for f in "${large[@]}"; do cmp -s "$tmp/models/$f" "$tmp/root/$f" || fail "large: $f missing or different"; done
fi

if [ "$failures" -ne 0 ]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
