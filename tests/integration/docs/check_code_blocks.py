#!/usr/bin/env python3
"""Every C++ block of the documentation compiles.

Extracts the ```cpp blocks of README.md and docs/*.md and compiles them against include/ with
the project's C++20 flags and warnings as errors, one translation unit per Markdown file:

  * a block with `int main(` is a complete program: a translation unit of its own, as is;
  * any other block is a fragment. It goes into a namespace of its own (which sees the
    declarations of tests/integration/docs/prelude.hpp and of the file's earlier blocks), split in two: its
    declarations at namespace scope (struct, class, template, enum, namespace, using, function
    definitions, TEST_CASE), its statements into the body of an (uncalled) inline function.
    `#include` lines move to the top of the translation unit.

`#line` directives map every diagnostic to the Markdown file and line. The templates a block
uses are instantiated, so a call that no longer matches the API fails.

A block that must not be compiled is marked on the line before its fence, with a reason:
    <!-- not compiled: the reason -->

Modes:
  (default)        compile the blocks of the given files (default: README.md and docs/*.md)
  --self-test      the negative control: a good block must compile; a call of the removed API,
                   a type error in a later block, a warning, and a not-compiled mark without a
                   reason must each fail, with the Markdown file and line in the message
  --removed-names  no name of the removed API appears outside a "Migrating" section

Exit status: 0 when all is as expected, 1 otherwise, 2 for bad arguments.
"""

import argparse
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
import time

CPP_FENCE = re.compile(r"^(\s*)(```|~~~)\s*(cpp|c\+\+|cxx)\s*$", re.IGNORECASE)
ANY_FENCE = re.compile(r"^(\s*)(```|~~~)")
NOT_COMPILED = re.compile(r"^\s*<!--\s*not compiled\s*:(.*?)-->\s*$", re.IGNORECASE)

# Names of the earlier API, removed (see the README's migration section).
REMOVED_NAMES = [
    "speculative_decode_tree",
    "tree_decode_options",
    "tree_step_event",
    "batch_decode_options",
    "sequence_options",
    "speculative_decode_batch",
    "speculative_step_batch",
    "tree_decode.hpp",
    "batch_decode.hpp",
    "draft_stop_below",
    "tree_scheme",
]

# Warnings that documentation fragments may trip without being wrong: a fragment shows a
# result it does not go on to use.
FRAGMENT_ALLOWANCES = [
    "-Wno-unused-variable",
    "-Wno-unused-but-set-variable",
    "-Wno-unused-local-typedefs",
    "-Wno-unused-function",
]

TOPLEVEL_START = re.compile(r"^(struct|class|union|enum|template|namespace|using|typedef|extern)\b")
CONTROL_START = re.compile(r"^(if|for|while|switch|do|else|try|catch|return|\{)\b|^\{")
MACRO_DEF_START = re.compile(r"^[A-Z_][A-Z0-9_]*\s*\(")


class Block:
    def __init__(self, path, line, lines, skip_reason):
        self.path = path            # path as shown in messages
        self.line = line            # Markdown line of the first code line (1-based)
        self.lines = lines          # dedented code lines
        self.skip_reason = skip_reason  # None, or the reason given in the not-compiled mark

    @property
    def is_program(self):
        return any(re.search(r"\bint\s+main\s*\(", l) for l in self.lines)


def extract_blocks(text, shown_path):
    """The ```cpp blocks of a Markdown text, and errors (malformed marks)."""
    blocks, errors = [], []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = ANY_FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = m.group(1), m.group(2)
        is_cpp = CPP_FENCE.match(lines[i]) is not None
        start = i
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence) and lines[j].strip().strip(fence[0]) == ""):
            j += 1
        if j >= len(lines):
            errors.append(f"{shown_path}:{start + 1}: unterminated code fence")
            break
        if is_cpp:
            k = start - 1
            while k >= 0 and lines[k].strip() == "":
                k -= 1
            skip = None
            if k >= 0 and "not compiled" in lines[k].lower():
                mark = NOT_COMPILED.match(lines[k])
                reason = mark.group(1).strip() if mark else ""
                if not reason:
                    errors.append(f"{shown_path}:{k + 1}: a not-compiled mark needs a reason: "
                                  "<!-- not compiled: the reason -->")
                    skip = "(no reason)"
                else:
                    skip = reason
            body = lines[start + 1:j]
            cut = len(indent)
            body = [l[cut:] if l[:cut].strip() == "" else l.lstrip() for l in body]
            blocks.append(Block(shown_path, start + 2, body, skip))
        i = j + 1
    return blocks, errors


def code_part(line, state):
    """The code of a line without comments and literals; state carries an open /* comment."""
    out = []
    i, n = 0, len(line)
    while i < n:
        if state["comment"]:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out)
            state["comment"] = False
            i = end + 2
            continue
        c = line[i]
        if line.startswith("//", i):
            break
        if line.startswith("/*", i):
            state["comment"] = True
            i += 2
            continue
        if c in "\"'":
            # Skip the literal (a digit separator such as 1'000 is rare in docs; treat ' after a
            # digit as part of the number).
            if c == "'" and i > 0 and line[i - 1].isalnum():
                i += 1
                continue
            j = i + 1
            while j < n and line[j] != c:
                j += 2 if line[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        out.append(c)
        i += 1
    return "".join(out)


def split_fragment(block):
    """(includes, toplevel chunks, body chunks); chunks are (markdown line, [lines])."""
    includes, toplevel, body = [], [], []
    state = {"comment": False}
    depth = 0
    chunk, chunk_line, first_code = [], None, ""

    def close():
        nonlocal chunk, chunk_line, first_code
        if not chunk:
            return
        code_lines = [l for l in chunk if l.strip()]
        last = ""
        st = {"comment": False}
        for l in chunk:
            c = code_part(l, st).strip()
            if c:
                last = c
        head = first_code
        if head == "" or (last == "" and head == ""):
            body.append((chunk_line, chunk))
        elif TOPLEVEL_START.match(head):
            toplevel.append((chunk_line, chunk))
        elif last.endswith("}") and not last.endswith("};") and not CONTROL_START.match(head):
            # a function definition, or a macro that opens one (TEST_CASE)
            toplevel.append((chunk_line, chunk))
        else:
            body.append((chunk_line, chunk))
        del code_lines
        chunk, chunk_line, first_code = [], None, ""

    for offset, line in enumerate(block.lines):
        md_line = block.line + offset
        stripped = line.strip()
        if depth == 0 and not state["comment"] and stripped.startswith("#"):
            close()
            if re.match(r"#\s*include\b", stripped):
                includes.append((md_line, line))
            else:
                toplevel.append((md_line, [line]))
            continue
        if not chunk:
            chunk_line = md_line
        chunk.append(line)
        code = code_part(line, state).strip()
        if code and not first_code:
            first_code = code
        for c in code:
            if c in "({[":
                depth += 1
            elif c in ")}]":
                depth -= 1
        if depth < 0:
            depth = 0
        if depth == 0 and code and (code.endswith(";") or code.endswith("}")):
            close()
    close()
    return includes, toplevel, body


def quote(path):
    return '"' + path.replace("\\", "\\\\").replace('"', '\\"') + '"'


def fragment_unit(blocks, unit_name, prelude):
    """The source of one translation unit holding the fragments `blocks`."""
    out = []

    def generated(lines):
        out.append(f"#line {len(out) + 2} {quote(unit_name)}")
        out.extend(lines)

    includes, parts = [], []
    for b in blocks:
        inc, top, body = split_fragment(b)
        includes.extend((b.path, l, s) for l, s in inc)
        parts.append((b, top, body))
    generated([f"#include {quote(prelude)}"])
    for path, line, text in includes:
        out.append(f"#line {line} {quote(path)}")
        out.append(text)
    previous = "docs_prelude"
    for n, (b, top, body) in enumerate(parts):
        ns = f"docs_block_{n + 1}_line_{b.line}"
        generated([f"namespace {ns} {{", f"using namespace {previous};"])
        for line, lines in top:
            out.append(f"#line {line} {quote(b.path)}")
            out.extend(lines)
        generated(["inline void body() {"])
        for line, lines in body:
            out.append(f"#line {line} {quote(b.path)}")
            out.extend(lines)
        generated(["}", f"}}  // namespace {ns}"])
        previous = ns
    return "\n".join(out) + "\n"


def compile_unit(args, source, name, work_dir, fragment):
    os.makedirs(work_dir, exist_ok=True)
    src = os.path.join(work_dir, name + ".cpp")
    with open(src, "w", encoding="utf-8") as f:
        f.write(source)
    cmd = [args.compiler, "-std=c++20", "-O2"]
    for d in args.include:
        cmd += ["-I", d]
    for d in args.isystem:
        if d:
            cmd += ["-isystem", d]
    cmd += [f for f in args.flag if f]
    cmd += ["-Wall", "-Wextra", "-Werror"]
    if fragment:
        cmd += FRAGMENT_ALLOWANCES
    cmd += ["-c", src, "-o", os.path.join(work_dir, name + ".o")]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr, time.monotonic() - t0, cmd


def plan_file(path, shown, work_dir, prelude):
    """Translation units for one Markdown file: [(name, source, is_fragment)], stats, errors."""
    with open(path, encoding="utf-8") as f:
        blocks, errors = extract_blocks(f.read(), shown)
    stem = re.sub(r"[^A-Za-z0-9]+", "_", shown).strip("_")
    fragments = [b for b in blocks if b.skip_reason is None and not b.is_program]
    programs = [b for b in blocks if b.skip_reason is None and b.is_program]
    skipped = [b for b in blocks if b.skip_reason is not None]
    units = []
    if fragments:
        units.append((stem, fragment_unit(fragments, os.path.join(work_dir, stem + ".cpp"), prelude), True))
    for b in programs:
        name = f"{stem}_program_line_{b.line}"
        src = f"#line {b.line} {quote(b.path)}\n" + "\n".join(b.lines) + "\n"
        units.append((name, src, False))
    stats = {"fragments": len(fragments), "programs": len(programs), "skipped": skipped}
    return units, stats, errors


def run_files(args, files, work_dir, quiet=False):
    """Compiles the blocks of `files`. Returns (ok, report lines, compiled block count, outputs)."""
    prelude = os.path.abspath(args.prelude)
    jobs, report, outputs, failed, count = [], [], {}, False, 0
    for path in files:
        shown = os.path.relpath(path, args.root) if args.root else path
        units, stats, errors = plan_file(path, shown, work_dir, prelude)
        count += stats["fragments"] + stats["programs"]
        for e in errors:
            report.append("error: " + e)
            failed = True
        line = f"{shown}: {stats['fragments']} fragment(s), {stats['programs']} program(s)"
        if stats["skipped"]:
            line += ", not compiled: " + "; ".join(f"line {b.line} ({b.skip_reason})" for b in stats["skipped"])
        report.append(line)
        for name, src, fragment in units:
            jobs.append((shown, name, src, fragment))
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(compile_unit, args, src, name, work_dir, fragment): (shown, name)
                   for shown, name, src, fragment in jobs}
        for fut in concurrent.futures.as_completed(futures):
            shown, name = futures[fut]
            rc, output, seconds, cmd = fut.result()
            outputs[name] = (rc, output)
            if rc == 0:
                report.append(f"  ok      {name} ({seconds:.1f} s)")
            else:
                failed = True
                report.append(f"  FAILED  {name} ({seconds:.1f} s): {' '.join(cmd)}")
                if not quiet:
                    report.append(output.rstrip())
    return not failed, report, count, outputs


def default_files(root):
    files = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
    return [f for f in files if os.path.exists(f)]


def main_compile(args):
    files = args.files or default_files(args.root)
    ok, report, count, _ = run_files(args, files, args.work_dir)
    print("\n".join(report))
    if count == 0:
        print("error: no C++ block found to compile: the extraction is broken or the files are wrong")
        return 1
    print(f"{count} block(s) from {len(files)} file(s): {'all compile' if ok else 'FAILED'}")
    return 0 if ok else 1


SELF_TEST_CASES = {
    # name: (markdown, expect_ok, [patterns the output must contain])
    "good": ("""# A good page

```cpp
struct my_drafter_note { int x = 1; };   // a declaration: namespace scope
auto out = specdec::speculative_decode(draft, target, prompt,
    {.step = specdec::chain{.gamma = 4}, .budget = {.max_new_tokens = 16}}, rng);
```

A later block sees the earlier block's declarations:

```cpp
my_drafter_note note;
specdec::decode_options o{.step = specdec::tree{.shape = {.branching = {2, 1}}}};
```

<!-- not compiled: pseudo-code, to show that a marked block is skipped -->
```cpp
this is not C++ at all
```
""", True, []),
    "removed_api": ("""# The earlier API

```cpp
auto out = specdec::speculative_decode(draft, target, prompt,
    {.gamma = 4, .max_new_tokens = 64}, rng);
```
""", False, [r"removed_api\.md:[45]"]),
    "later_block": ("""# A type error in the second block

```cpp
specdec::decode_options fine{};
```

Text.

```cpp
specdec::decode_result r = specdec::decode_options{};
```
""", False, [r"later_block\.md:10"]),
    "warning": ("""# A warning is an error

```cpp
std::size_t n = prompt.size();
if (n < 0) n = 1;
```
""", False, [r"warning\.md:5", r"type-limits"]),
    "no_reason": ("""# A mark without a reason

<!-- not compiled: -->
```cpp
int fine = 1;
```
""", False, [r"no_reason\.md:3: a not-compiled mark needs a reason"]),
}


def main_self_test(args):
    failures = []
    with tempfile.TemporaryDirectory(prefix="specdec_docs_self_test_") as tmp:
        for name, (text, expect_ok, patterns) in SELF_TEST_CASES.items():
            md = os.path.join(tmp, name + ".md")
            with open(md, "w", encoding="utf-8") as f:
                f.write(text)
            sub = argparse.Namespace(**vars(args))
            sub.root = tmp
            ok, report, count, outputs = run_files(sub, [md], os.path.join(tmp, "work_" + name), quiet=True)
            text_out = "\n".join(report) + "\n" + "\n".join(o for _, o in outputs.values())
            verdict = "compiles" if ok else "fails"
            expected = "compiles" if expect_ok else "fails"
            missing = [p for p in patterns if not re.search(p, text_out)]
            if ok != expect_ok or missing:
                failures.append(name)
                print(f"FAILED  {name}: {verdict}, expected: {expected}" +
                      (f"; output lacks {missing}" if missing else ""))
                print(text_out[-4000:])
            else:
                print(f"ok      {name}: {verdict}, as expected" +
                      (f" (output names {', '.join(patterns)})" if patterns else ""))
            if name == "good" and count != 2:
                failures.append(name + " (block count)")
                print(f"FAILED  good: {count} blocks compiled, expected 2 (the marked one skipped)")
    print("negative control: " + ("all as expected" if not failures else "FAILED: " + ", ".join(failures)))
    return 0 if not failures else 1


def removed_name_hits(text, shown):
    hits = []
    in_migration, migration_level = False, 0
    for n, line in enumerate(text.split("\n"), 1):
        m = re.match(r"^(#+)\s+(.*)", line)
        if m:
            level = len(m.group(1))
            if in_migration and level <= migration_level:
                in_migration = False
            if re.search(r"migrat", m.group(2), re.IGNORECASE):
                in_migration, migration_level = True, level
            continue
        if in_migration:
            continue
        for name in REMOVED_NAMES:
            if re.search(r"(?<![\w.])" + re.escape(name) + r"\b", line):
                hits.append(f"{shown}:{n}: {name}")
    return hits


def main_removed_names(args):
    files = args.files or default_files(args.root)
    hits = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            hits += removed_name_hits(f.read(), os.path.relpath(path, args.root))
    # The check must be able to fail: a line naming a removed function outside a migration
    # section is found, and the same line inside one is not.
    control = removed_name_hits("# Intro\nuse speculative_decode_tree\n## Migrating\nspeculative_decode_tree\n", "control")
    if control != ["control:2: speculative_decode_tree"]:
        print(f"error: the removed-name check does not work on its control text: {control}")
        return 1
    for h in hits:
        print("removed name outside the migration section: " + h)
    print(f"{len(files)} file(s): " + ("no removed name outside the migration section" if not hits else
                                      f"{len(hits)} removed name(s) found"))
    return 0 if not hits else 1


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(os.path.dirname(here)))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="*", help="Markdown files (default: README.md and docs/*.md)")
    p.add_argument("--compiler", default=os.environ.get("CXX", "c++"))
    p.add_argument("--root", default=root, help="repository root (default: two levels above this script)")
    p.add_argument("--include", action="append", default=None, help="include directory (repeatable)")
    p.add_argument("--isystem", action="append", default=[], help="system include directory, e.g. Eigen's")
    p.add_argument("--flag", action="append", default=[], help="extra compiler flag, as --flag=-Wshadow")
    p.add_argument("--prelude", default=os.path.join(here, "prelude.hpp"))
    p.add_argument("--work-dir", default=None, help="where the translation units are written")
    p.add_argument("--jobs", type=int, default=int(os.environ.get("SPECDEC_DOCS_JOBS", "1")))
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--self-test", action="store_true", help="the negative control (see above)")
    mode.add_argument("--removed-names", action="store_true", help="no removed API name outside a migration section")
    args = p.parse_args()
    if args.include is None:
        args.include = [os.path.join(args.root, "include"), os.path.join(args.root, "examples")]
    if not args.isystem:
        args.isystem = ["/usr/include/eigen3"]
    if args.work_dir is None:
        args.work_dir = os.path.join(tempfile.gettempdir(), "specdec_docs_code_blocks")
    if args.removed_names:
        return main_removed_names(args)
    if args.self_test:
        return main_self_test(args)
    return main_compile(args)


if __name__ == "__main__":
    sys.exit(main())
