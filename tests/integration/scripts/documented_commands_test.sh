#!/usr/bin/env bash
# Runs every command that README.md and docs/*.md show for the project's programs, as written (at
# its default length), on the real pair in SPECDEC_MODELS_DIR: each must exit with status 0.
#
# Commands are taken from ```sh blocks (every line, continuation lines joined, comments dropped)
# and from inline code spans that name a program with at least one argument (a bare program name
# in prose is a mention, not a command). A command counts when it runs one of the programs below,
# by its name or a build path ending in it, or scripts/demo.sh:
#   specdec-generate specdec-conformance compare-schemes compare-trees measure-alpha
#   specdec-random-pair specdec_quickstart
# Each is mapped to this build's binary; a DIR placeholder becomes the models folder and a FILE
# placeholder a file in a scratch folder, where every command runs (so whatever it writes lands
# there); scripts/demo.sh runs with SPECDEC_DEMO_NO_BUILD=1 on this build. Identical commands run
# once. One change to a command as written: its repetition count (--runs, and --power-runs for
# specdec-conformance --power and --power-draft) is capped at SPECDEC_DOCS_MAX_RUNS (2 unless set, the least that gives a standard error): a repetition
# repeats the same path, and the count only sets the precision of the figures a page quotes,
# while each run's length (--tokens, the defaults) stays as written, so the test takes about 2
# minutes instead of 11. A failing command is named with its source (file:line) and its last
# output lines. The test fails when it finds no command at all (the extraction would be broken).
# Exit status 77 (skipped) without the model files.
#
#   tests/integration/scripts/documented_commands_test.sh SOURCE_DIR BINARY...   (the binaries by full path)
#   SPECDEC_LIST_ONLY=1 ...: list the commands found, run none
set -uo pipefail
root="${1:?usage: documented_commands_test.sh SOURCE_DIR BINARY...}"
shift
root="$(cd "$root" && pwd)"
# shellcheck source=require_models.sh
source "$(dirname "${BASH_SOURCE[0]}")/require_models.sh"
if ! command -v python3 >/dev/null; then
  echo "FAIL: python3 is needed to read the Markdown files"
  exit 1
fi

# The commands, one per line: "SOURCE<TAB>ARGV" with ARGV shell-quoted, already mapped.
python3 - "$root" "$models" "$tmp" "$@" >"$tmp/commands" <<'PY' || exit 1
import glob, os, re, shlex, sys

root, models, tmp = sys.argv[1:4]
binaries = {os.path.basename(b): os.path.abspath(b) for b in sys.argv[4:]}
programs = ["specdec-generate", "specdec-conformance", "compare-schemes", "compare-trees",
            "measure-alpha", "specdec-random-pair", "specdec_quickstart"]
missing = [p for p in programs if p not in binaries]
if missing:
    sys.exit("FAIL: no binary given for " + ", ".join(missing))
# The build folder, for scripts/demo.sh: specdec_quickstart is <build>/examples/specdec_quickstart.
build = os.path.dirname(os.path.dirname(binaries["specdec_quickstart"]))

def commands(path):
    """(line number, text) of each candidate command of a Markdown file."""
    lines = open(path, encoding="utf-8").read().split("\n")
    prose, i = [], 0
    while i < len(lines):
        fence = re.match(r"^\s*```+\s*(\w*)", lines[i])
        if not fence:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        lang, i = fence.group(1), i + 1
        pending, start = "", 0
        while i < len(lines) and not re.match(r"^\s*```", lines[i]):
            if lang in ("sh", "bash", "shell", "console"):
                text = lines[i]
                if not pending:
                    start = i + 1
                if text.rstrip().endswith("\\"):
                    pending += text.rstrip()[:-1] + " "
                else:
                    yield start, pending + text
                    pending = ""
            i += 1
        i += 1
    # Inline code spans of the prose (a span may wrap across lines).
    text = "\n".join(t for _, t in prose)
    offsets = [0]
    for _, t in prose:
        offsets.append(offsets[-1] + len(t) + 1)
    for m in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        span = " ".join(m.group(1).split())
        line = prose[max(k for k in range(len(prose)) if offsets[k] <= m.start())][0]
        if len(span.split()) > 1:
            yield line, span

def program_of(word):
    base = os.path.basename(word)
    return base if base in programs and (word == base or "/" in word) else None

seen, found = set(), 0
files = [os.path.join(root, "README.md")] + sorted(glob.glob(os.path.join(root, "docs", "*.md")))
for path in files:
    for line, text in commands(path):
        try:
            words = shlex.split(text, comments=True)
        except ValueError:
            continue
        env = []
        while words and re.match(r"^[A-Za-z_]\w*=", words[0]):
            env.append(words.pop(0))
        if not words:
            continue
        if words[:2] == ["bash", "scripts/demo.sh"]:
            argv = ["env", "SPECDEC_DEMO_NO_BUILD=1", "SPECDEC_DEMO_BUILD_DIR=" + build,
                    "bash", os.path.join(root, "scripts", "demo.sh")] + words[2:]
        elif program_of(words[0]):
            argv = [binaries[program_of(words[0])]] + words[1:]
        else:
            continue
        found += 1
        key = tuple(env + argv)
        if key in seen:
            continue
        seen.add(key)
        n = len(seen)
        cap = int(os.environ.get("SPECDEC_DOCS_MAX_RUNS", "2"))
        before = list(argv)
        for k in range(1, len(argv)):
            if argv[k - 1] in ("--runs", "--power-runs") and argv[k].isdigit() and int(argv[k]) > cap:
                argv[k] = str(cap)
        if ("--power" in argv or "--power-draft" in argv) and "--power-runs" not in argv:
            argv += ["--power-runs", str(cap)]
        mapped = []
        for w in argv:
            if w == "DIR":
                w = models
            elif w == "FILE":
                w = os.path.join(tmp, "file%d" % n)
            mapped.append(w)
        env = [e.replace("=DIR", "=" + models) for e in env]
        if env:
            mapped = ["env"] + env + mapped
        source = "%s:%d: %s" % (os.path.relpath(path, root), line, " ".join(text.split()))
        if argv != before:
            source += "   (repetitions capped at %d)" % cap
        print(source.replace("\t", " ") + "\t" + shlex.join(mapped))
print("%d" % found, file=open(os.path.join(tmp, "found"), "w"))
PY

found="$(cat "$tmp/found")"
distinct="$(wc -l <"$tmp/commands")"
if [ "$distinct" -eq 0 ]; then
  echo "FAIL: found no command for the project's programs in README.md and docs/*.md (the extraction is broken)"
  exit 1
fi
echo "found $found documented commands ($distinct distinct); running each"
if [ "${SPECDEC_LIST_ONLY:-0}" = 1 ]; then  # (checking the extraction by hand)
  cut -f 1 "$tmp/commands"
  exit 0
fi
mkdir -p "$tmp/work"
failures=0 ran=0 n=0
start_all=$SECONDS
while IFS=$'\t' read -r source quoted; do
  n=$((n + 1))
  eval "argv=($quoted)"
  start=$SECONDS
  rc=0
  (cd "$tmp/work" && "${argv[@]}") </dev/null >"$tmp/out.$n" 2>&1 || rc=$?
  ran=$((ran + 1))
  if [ "$rc" != 0 ]; then
    echo "FAIL ($((SECONDS - start)) s): $source: exit status $rc (expected 0); its last lines:"
    tail -n 15 "$tmp/out.$n" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok ($((SECONDS - start)) s): $source"
  fi
done <"$tmp/commands"
echo "ran $ran of $distinct distinct commands in $((SECONDS - start_all)) s: $((ran - failures)) passed, $failures failed"
if [ "$failures" -ne 0 ]; then exit 1; fi
