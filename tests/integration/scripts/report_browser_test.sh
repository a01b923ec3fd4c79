#!/usr/bin/env bash
# The trace report (scripts/trace_report.py) in a real browser: makes the report of TRACE, loads
# it in headless Chromium and checks that
#   - every chart image decoded: the page's load script sets data-charts-rendered (images complete
#     with a width) and data-charts-expected (chart images) on <body>; they must be equal and > 0;
#   - the page wrote nothing to the console (Chromium prints every console message, whatever its
#     level, and uncaught exceptions as "...:CONSOLE..." lines on stderr; the page is silent by
#     design, so any such line fails the test);
#   - the token text was escaped: the loaded page has exactly one <script> element (its own) and
#     no <img> other than the charts;
#   - the page loads nothing from outside (no src/href to http:, https: or //).
#
#   tests/integration/scripts/report_browser_test.sh TRACE.json     the report of TRACE must pass
#   tests/integration/scripts/report_browser_test.sh --self-test TRACE.json
#       the negative control: the report of TRACE must pass, and copies of it with one fault
#       each (a console.error call, an uncaught exception, a broken chart image, an unescaped
#       <script>, an external script) must fail, each for its reason.
#
# Exit status 77 (skipped) when Chromium ("chromium" or "chromium-browser"; SPECDEC_CHROMIUM
# names another) or a Python 3 with matplotlib (SPECDEC_PYTHON, python3, /usr/bin/python3) is
# missing. Debian: apt install chromium python3-matplotlib fonts-dejavu-core.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
report_script="$here/../../../scripts/trace_report.py"
mode=check
if [ "${1:-}" = "--self-test" ]; then mode=self-test; shift; fi
trace="${1:?usage: report_browser_test.sh [--self-test] TRACE.json}"

chromium_bin="${SPECDEC_CHROMIUM:-}"
if [ -z "$chromium_bin" ]; then
  chromium_bin="$(command -v chromium || command -v chromium-browser || true)"
fi
if [ -z "$chromium_bin" ] || [ ! -x "$(command -v "$chromium_bin" || echo /nonexistent)" ]; then
  echo "skipped: chromium not found (Debian: apt install chromium)"
  exit 77
fi
python=""
for candidate in "${SPECDEC_PYTHON:-}" python3 /usr/bin/python3; do
  [ -n "$candidate" ] || continue
  if "$candidate" -c "import matplotlib" >/dev/null 2>&1; then python="$candidate"; break; fi
done
if [ -z "$python" ]; then
  echo "skipped: no Python 3 with matplotlib found (Debian: apt install python3-matplotlib)"
  exit 77
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export MPLCONFIGDIR="$tmp/mpl"   # matplotlib's cache, kept out of the home folder

# check_page HTML: 0 when the page passes; otherwise prints each problem ("problem: ...") and
# returns 1. Leaves Chromium's output in HTML.dom and HTML.err.
check_page() {
  local page="$1" rc=0 problems=0
  # The browser's own profile folder, so that nothing of the user's is read or written.
  timeout 120 "$chromium_bin" --headless --no-sandbox --disable-gpu --enable-logging=stderr --v=0 \
    --no-first-run --user-data-dir="$tmp/profile" --virtual-time-budget=10000 \
    --dump-dom "file://$page" >"$page.dom" 2>"$page.err" || rc=$?
  if [ "$rc" != 0 ] || [ ! -s "$page.dom" ]; then
    echo "problem: chromium exit status $rc, $(wc -c <"$page.dom") bytes of DOM; its stderr ends:"
    tail -n 5 "$page.err"
    return 1
  fi
  local body expected rendered
  body="$(grep -o '<body[^>]*>' "$page.dom" | head -n 1)"
  expected="$(sed -n 's/.*data-charts-expected="\([0-9]*\)".*/\1/p' <<<"$body")"
  rendered="$(sed -n 's/.*data-charts-rendered="\([0-9]*\)".*/\1/p' <<<"$body")"
  if [ -z "$expected" ] || [ -z "$rendered" ]; then
    echo "problem: the page's load script did not run (<body> has no data-charts-*: $body)"
    problems=$((problems + 1))
  elif [ "$expected" -eq 0 ]; then
    echo "problem: the page has no chart image (data-charts-expected=0)"
    problems=$((problems + 1))
  elif [ "$rendered" != "$expected" ]; then
    echo "problem: $rendered of $expected chart images rendered"
    problems=$((problems + 1))
  fi
  # Chromium 1xx prints console messages as "[...:INFO:CONSOLE:LINE] "text", source: URL (LINE)";
  # older versions as "...:CONSOLE(LINE)] ...". Either form, any level, is a failure.
  if grep -E ':CONSOLE[:(]' "$page.err" >"$page.console"; then
    echo "problem: the page wrote to the console:"
    sed 's/^/    /' "$page.console"
    problems=$((problems + 1))
  fi
  local scripts imgs charts
  scripts="$(grep -o '<script' "$page.dom" | wc -l)"
  imgs="$(grep -o '<img' "$page.dom" | wc -l)"
  charts="$(grep -o '<img class="chart"' "$page.dom" | wc -l)"
  if [ "$scripts" != 1 ] || [ "$imgs" != "$charts" ]; then
    echo "problem: the loaded page has $scripts <script> element(s) (expected 1) and $imgs <img>" \
         "for $charts chart(s): unescaped text from the trace?"
    problems=$((problems + 1))
  fi
  if grep -Eiq '(src|href)[[:space:]]*=[[:space:]]*["'"'"']?[[:space:]]*(https?:|//)' "$page"; then
    echo "problem: the page refers to an outside resource:"
    grep -Eio '(src|href)[[:space:]]*=[[:space:]]*["'"'"']?[[:space:]]*(https?:|//)[^"'"'"' >]*' "$page" \
      | head -n 3 | sed 's/^/    /'
    problems=$((problems + 1))
  fi
  if [ "$problems" = 0 ]; then
    echo "ok: $rendered of $expected charts rendered, no console output, text escaped, self-contained"
    return 0
  fi
  return 1
}

page="$tmp/report.html"
if ! "$python" "$report_script" "$trace" -o "$page"; then
  echo "FAIL: trace_report.py could not make the report of $trace"
  exit 1
fi

if [ "$mode" = check ]; then
  if check_page "$page"; then exit 0; fi
  echo "FAIL: the report of $trace"
  exit 1
fi

# --- self-test: each faulty copy of the page must fail, for its reason ------------------------
failures=0
echo "== the report itself (must pass)"
check_page "$page" || { echo "FAIL: the unmodified report must pass"; failures=$((failures + 1)); }

# mutate NAME PYTHON-EXPRESSION: a copy of the report with html = EXPRESSION(html).
mutate() {
  "$python" - "$page" "$tmp/$1.html" "$2" <<'EOF'
import re, sys
src, dst, expr = sys.argv[1], sys.argv[2], sys.argv[3]
html = open(src, encoding="utf-8").read()
out = eval(expr, {"re": re, "html": html})
assert out != html, "the mutation changed nothing"
open(dst, "w", encoding="utf-8").write(out)
EOF
}

# expect_fail NAME REASON: the copy NAME must fail, with one problem, which mentions REASON.
expect_fail() {
  local name="$1" reason="$2" out
  echo "== $name (must fail: $reason)"
  out="$(check_page "$tmp/$name.html")" && {
    echo "$out"; echo "FAIL: $name passed"; failures=$((failures + 1)); return; }
  echo "$out"
  if ! grep -q -- "$reason" <<<"$out" || [ "$(grep -c '^problem:' <<<"$out")" != 1 ]; then
    echo "FAIL: $name failed, but not (only) for '$reason'"
    failures=$((failures + 1))
  fi
}

# (The faults go into the page's own script, so that the element count is unchanged.)
mutate console_error 'html.replace("window.addEventListener(\"load\"", "console.error(\"injected error\");\nwindow.addEventListener(\"load\"", 1)'
expect_fail console_error "wrote to the console"
mutate uncaught_exception 'html.replace("</script>\n</body>", "null.x = 1;\n</script>\n</body>", 1)'
expect_fail uncaught_exception "wrote to the console"
mutate broken_image 're.sub(r"data:image/png;base64,[A-Za-z0-9+/=]{8}", "data:image/png;base64,AAAA", html, count=1)'
expect_fail broken_image "chart images rendered"
mutate unescaped_text 'html.replace("<div class=\"gen\">", "<div class=\"gen\"><b>x</b><script>var injected = 1;</script>", 1)'
expect_fail unescaped_text "<script> element(s)"
mutate external_style 'html.replace("</head>", "<link rel=\"stylesheet\" href=\"https://example.invalid/x.css\"></head>", 1)'
expect_fail external_style "outside resource"
mutate no_charts 're.sub(r"<img class=\"chart\"[^>]*>", "", html)'
expect_fail no_charts "no chart image"

if [ "$failures" = 0 ]; then
  echo "self-test: every fault was caught"
  exit 0
fi
echo "self-test: $failures FAILED"
exit 1
