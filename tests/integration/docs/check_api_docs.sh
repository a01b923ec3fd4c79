#!/usr/bin/env bash
# The API reference's coverage (ctest docs.api_coverage): runs Doxygen with the reference's
# configuration (docs/Doxyfile.in, configured by CMake into <build>/docs/Doxyfile) and fails when
# its warning log holds a warning about a header: a public declaration without a doc comment
# ("... is not documented"), a documentation error, ... Each is printed as file:line: text (the
# first 20 of them). Warnings about the Markdown pages (README.md and docs/*.md, which the
# reference shows as pages) are counted and printed apart and do not fail the check: their links
# to GitHub's heading anchors have no target in Doxygen before 1.10.
#
# --self-test (ctest docs.api_coverage_self_test) is the negative control: Doxygen, with the same
# configuration, on a small header with an undocumented public function and member must make the
# check fail naming both at their lines (and neither the documented declarations nor those in a
# namespace detail); the same header fully documented must pass.
#
#   check_api_docs.sh [--self-test] DOXYFILE WORK_DIR [DOXYGEN]
#
# DOXYGEN: the doxygen executable (default: the one on PATH). Exit status: 0 clean, 1 warnings
# found (or a failed self-test), 2 bad usage, 77 skipped (no doxygen; Debian's package doxygen).
set -uo pipefail

self_test=0
if [ "${1:-}" = --self-test ]; then
  self_test=1
  shift
fi
if [ $# -lt 2 ] || [ $# -gt 3 ]; then
  echo "usage: check_api_docs.sh [--self-test] DOXYFILE WORK_DIR [DOXYGEN]" >&2
  exit 2
fi
doxyfile="$1"
work="$2"
doxygen="${3:-}"
case "$doxygen" in *-NOTFOUND) doxygen="" ;; esac  # (CMake's value when it found none)
[ -n "$doxygen" ] || doxygen="$(command -v doxygen || true)"
if [ -z "$doxygen" ] || [ ! -x "$doxygen" ]; then
  echo "skipped: doxygen not found (Debian package doxygen; scripts/install_deps.sh installs it)"
  exit 77
fi
if [ ! -f "$doxyfile" ]; then
  echo "check_api_docs: no configuration '$doxyfile'" >&2
  exit 2
fi

# run_doxygen OUT_DIR [SETTING...]: Doxygen with the configuration, its output and warning log
# moved into OUT_DIR, and the given settings ("NAME = value") after it (the last one wins).
run_doxygen() {
  local out="$1"
  shift
  rm -rf "$out"
  mkdir -p "$out"
  {
    cat "$doxyfile"
    echo "OUTPUT_DIRECTORY = \"$out\""
    echo "WARN_LOGFILE = \"$out/warnings.log\""
    local setting
    for setting in "$@"; do echo "$setting"; done
  } | "$doxygen" - >"$out/doxygen.out" 2>&1
  local status=$?
  if [ $status -ne 0 ] || [ ! -f "$out/warnings.log" ]; then
    echo "check_api_docs: doxygen failed (status $status):"
    cat "$out/doxygen.out"
    return 1
  fi
}

# check_log LOG ROOT: prints the log's warnings (paths relative to ROOT, each once) and returns 1
# when one of them is not about a Markdown page. A warning is a line "file:line: warning: ..." or
# "...: error: ...", with its continuation lines (indented) joined to it.
check_log() {
  local log="$1" root="$2"
  local entries
  entries="$(awk '
    function flush() { if (entry != "" && !seen[entry]++) print entry; entry = "" }
    /(warning|error): / && !/^[ \t]/ { flush(); entry = $0; next }
    entry != "" { entry = entry " " $0 }
    END { flush() }' "$log" | sed "s|$root/||g")"
  local api markdown
  api="$(printf '%s\n' "$entries" | grep -v '^[^:]*\.md:' | grep -v '^$' || true)"
  markdown="$(printf '%s\n' "$entries" | grep '^[^:]*\.md:' || true)"
  local n_api n_markdown
  n_api=$(printf '%s' "$api" | grep -c '' || true)
  n_markdown=$(printf '%s' "$markdown" | grep -c '' || true)
  if [ "$n_markdown" -gt 0 ]; then
    echo "note: $n_markdown warnings about the Markdown pages (links to heading anchors), not counted:"
    printf '%s\n' "$markdown" | head -n 5 | sed 's/^/  /'
  fi
  if [ "$n_api" -gt 0 ]; then
    echo "FAILED: $n_api Doxygen warnings about the public headers (the first 20 below; all in $log)."
    echo "Document each declaration with a /// comment (or, if it is internal, move it into a"
    echo "namespace detail):"
    printf '%s\n' "$api" | head -n 20 | sed 's/^/  /'
    return 1
  fi
  echo "ok: no Doxygen warning about the public headers"
}

if [ $self_test = 0 ]; then
  root="$(cd "$(dirname "$0")/../../.." && pwd)"
  start=$(date +%s.%N)
  run_doxygen "$work" || exit 1
  end=$(date +%s.%N)
  echo "doxygen $("$doxygen" --version): $(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.1f", b - a }') s; the reference: $work/html/index.html"
  check_log "$work/warnings.log" "$root" || exit 1
  exit 0
fi

# --self-test
failures=0
fail() { echo "SELF-TEST FAILED: $*"; failures=$((failures + 1)); }
rm -rf "$work"
mkdir -p "$work/src"
header="$work/src/widget.hpp"
write_header() {  # write_header DOC: DOC is the comment of the two declarations under test
  cat >"$header" <<EOF
#pragma once
/// \\file
/// A header for the check's self-test.

namespace sample {

/// A documented function.
int documented(int x);

$1
int undocumented_function(int x);

/// A documented struct.
struct widget {
    $1
    int undocumented_member = 0;
    /// A documented member.
    int documented_member = 0;
};

namespace detail {
int internal_helper(int x);
}  // namespace detail

}  // namespace sample
EOF
}
cat >"$work/src/page.md" <<'EOF'
# A page

A link to [a heading](#a-heading), an anchor that Doxygen cannot resolve.
EOF
inputs="INPUT = \"$header\" \"$work/src/page.md\""

write_header ""
if run_doxygen "$work/undocumented" "$inputs" "USE_MDFILE_AS_MAINPAGE =" "EXCLUDE ="; then
  output="$(check_log "$work/undocumented/warnings.log" "$work/src")"
  status=$?
  printf '%s\n' "$output" | sed 's/^/  | /'
  [ $status -eq 1 ] || fail "an undocumented function and member passed the check (status $status)"
  grep -q '^  widget\.hpp:11: .*undocumented_function' <<<"$output" ||
    fail "the undocumented function was not reported as widget.hpp:11"
  grep -q '^  widget\.hpp:16: .*undocumented_member' <<<"$output" ||
    fail "the undocumented member was not reported as widget.hpp:16"
  ! grep -qE '\bdocumented(\(|_member)|internal_helper' <<<"$output" ||
    fail "a documented declaration, or one in a namespace detail, was reported"
  grep -q '^note: 1 warnings about the Markdown pages' <<<"$output" ||
    fail "the Markdown page's warning was not set apart"
else
  fail "doxygen failed on the undocumented header"
fi

write_header "/// Now documented."
if run_doxygen "$work/documented" "$inputs" "USE_MDFILE_AS_MAINPAGE =" "EXCLUDE ="; then
  output="$(check_log "$work/documented/warnings.log" "$work/src")"
  status=$?
  printf '%s\n' "$output" | sed 's/^/  | /'
  [ $status -eq 0 ] || fail "the fully documented header failed the check (status $status)"
else
  fail "doxygen failed on the documented header"
fi

if [ $failures -gt 0 ]; then
  echo "self-test: $failures failures"
  exit 1
fi
echo "self-test: ok (an undocumented function and member fail the check, named at their lines; documented ones and namespace detail do not)"
