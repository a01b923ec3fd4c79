#!/usr/bin/env python3
"""Checks the include graph of the library's headers (include/specdec).

Reads every file under include/specdec, takes its #include "..." directives (and <specdec/...>
ones), and fails (exit 1, naming the files) when

  - the headers include each other in a cycle;
  - a file in detail/ includes a file outside detail/ (the dependency goes public -> detail
    only; detail/ is the library's internals, the public headers are built on it);
  - an include cannot be resolved to a file of the library;
  - a file is named against what it is: a header (*.hpp) must be guarded (#pragma once), and a
    file included several times per translation unit (a fragment of the per-instruction-set
    core, no include guard) must be named *.inc, live in detail/, and be included only from
    detail/.

An include whose file name is a macro (#include SPECDEC_DETAIL_INSTANCE) is resolved through
the #define NAME "file" lines of the tree: the file that defines the name is taken to include
the file it names. Includes in comments are ignored; includes under #if are all counted.

Also reported, as a warning that fails only with --strict (a heuristic): a public header whose
every declaration is in a namespace detail (internals that belong in detail/).

  scripts/check_includes.py [--strict] [INCLUDE_DIR]   # INCLUDE_DIR: default <repo>/include
  scripts/check_includes.py --self-test                # the checker on small trees, broken and clean

Exit status: 0 clean, 1 problems found (or a failed self-test), 2 bad usage.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile

LIBRARY = "specdec"
DETAIL = "detail"

INCLUDE_QUOTED = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
INCLUDE_ANGLED = re.compile(r"^\s*#\s*include\s*<([^>]+)>")
INCLUDE_MACRO = re.compile(r"^\s*#\s*include\s+([A-Za-z_]\w*)\s*$")
DEFINE_PATH = re.compile(r'^\s*#\s*define\s+([A-Za-z_]\w*)\s+"([^"]+)"\s*$')
PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\b")
IFNDEF = re.compile(r"^\s*#\s*ifndef\s+([A-Za-z_]\w*)\s*$")
DEFINE = re.compile(r"^\s*#\s*define\s+([A-Za-z_]\w*)\b")


def strip_comments(text):
    """The text with // and /* */ comments blanked (newlines kept), string literals kept."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "/" and i + 1 < n and text[i + 1] == "/":
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
        elif c == '"' or (c == "'" and not (i > 0 and text[i - 1].isalnum())):  # not a digit separator
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def is_guarded(lines):
    """#pragma once, or a classic guard (#ifndef X then #define X) as the first directives."""
    directives = [line for line in lines if line.strip().startswith("#")]
    if not directives:
        return False
    if PRAGMA_ONCE.match(directives[0]):
        return True
    if len(directives) >= 2:
        m, d = IFNDEF.match(directives[0]), DEFINE.match(directives[1])
        return bool(m and d and m.group(1) == d.group(1))
    return False


class Tree:
    def __init__(self, include_dir):
        self.include_dir = os.path.abspath(include_dir)
        self.root = os.path.join(self.include_dir, LIBRARY)
        self.files = {}  # relative path (to include_dir, '/'-separated) -> text without comments
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                with open(path, encoding="utf-8") as f:
                    self.files[self.rel(path)] = strip_comments(f.read())
        self.edges = {f: [] for f in self.files}  # file -> [(target, how)]
        self.problems = []
        self.warnings = []

    def rel(self, path):
        return os.path.relpath(os.path.abspath(path), self.include_dir).replace(os.sep, "/")

    def in_detail(self, rel):
        return rel.startswith(f"{LIBRARY}/{DETAIL}/")

    def resolve(self, name, from_dir):
        """The library file an #include "name" in from_dir names (as the preprocessor looks: the
        includer's folder, then the include folder), or None."""
        for base in (from_dir, self.include_dir):
            candidate = os.path.normpath(os.path.join(base, name))
            if os.path.isfile(candidate):
                rel = self.rel(candidate)
                if rel in self.files:
                    return rel
        return None

    def parse(self):
        defines = []  # (definer, macro, path)
        macro_includes = []  # (includer, macro)
        for f, text in self.files.items():
            here = os.path.dirname(os.path.join(self.include_dir, f))
            for number, line in enumerate(text.split("\n"), 1):
                m = INCLUDE_QUOTED.match(line)
                if m:
                    target = self.resolve(m.group(1), here)
                    if target is None:
                        self.problems.append(f'{f}:{number}: #include "{m.group(1)}" names no file of the library')
                    else:
                        self.edges[f].append((target, number))
                    continue
                m = INCLUDE_ANGLED.match(line)
                if m and m.group(1).startswith(f"{LIBRARY}/"):
                    target = self.resolve(m.group(1), self.include_dir)
                    if target is None:
                        self.problems.append(f"{f}:{number}: #include <{m.group(1)}> names no file of the library")
                    else:
                        self.edges[f].append((target, number))
                    continue
                m = INCLUDE_MACRO.match(line)
                if m:
                    macro_includes.append((f, m.group(1)))
                    continue
                m = DEFINE_PATH.match(line)
                if m:
                    defines.append((f, m.group(1), m.group(2), number))
        # #include MACRO: the file that defines MACRO as "path" includes that file (resolved from
        # the folder of a file that includes the macro, else from the definer's).
        used = {}
        for includer, macro in macro_includes:
            used.setdefault(macro, []).append(includer)
        for definer, macro, path, number in defines:
            if macro not in used:
                continue
            dirs = [os.path.dirname(os.path.join(self.include_dir, i)) for i in used[macro]]
            dirs.append(os.path.dirname(os.path.join(self.include_dir, definer)))
            target = next((t for t in (self.resolve(path, d) for d in dirs) if t), None)
            if target is None:
                self.problems.append(f'{definer}:{number}: #define {macro} "{path}" (included as #include {macro}) '
                                     "names no file of the library")
            else:
                self.edges[definer].append((target, number))

    def check_cycles(self):
        # Tarjan's strongly connected components, iteratively.
        index, low, on_stack, stack, sccs = {}, {}, set(), [], []
        counter = [0]
        for start in sorted(self.files):
            if start in index:
                continue
            work = [(start, 0)]
            while work:
                node, i = work.pop()
                if i == 0:
                    index[node] = low[node] = counter[0]
                    counter[0] += 1
                    stack.append(node)
                    on_stack.add(node)
                targets = sorted({t for t, _ in self.edges[node]})
                if i < len(targets):
                    work.append((node, i + 1))
                    t = targets[i]
                    if t not in index:
                        work.append((t, 0))
                    elif t in on_stack:
                        low[node] = min(low[node], index[t])
                    continue
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
                if low[node] == index[node]:
                    scc = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        scc.append(w)
                        if w == node:
                            break
                    self_loop = any(t == node for t, _ in self.edges[node])
                    if len(scc) > 1 or self_loop:
                        sccs.append(sorted(scc))
        for scc in sorted(sccs):
            members = set(scc)
            # One cycle through the component's first file, for the message.
            path, seen = [scc[0]], {scc[0]}
            while True:
                line = None
                for t, number in sorted(self.edges[path[-1]]):
                    if t in members and (t == scc[0] or t not in seen):
                        line = (t, number)
                        if t == scc[0]:
                            break
                if line is None:
                    break
                path.append(line[0])
                if line[0] == scc[0]:
                    break
                seen.add(line[0])
            shown = " -> ".join(path) if path[-1] == scc[0] and len(path) > 1 else ", ".join(scc)
            self.problems.append(f"include cycle among {len(scc)} file(s): {shown}")

    def check_layering(self):
        for f in sorted(self.files):
            if not self.in_detail(f):
                continue
            for t, number in self.edges[f]:
                if not self.in_detail(t):
                    self.problems.append(f"{f}:{number}: a detail/ file includes {t}, outside detail/ "
                                         "(the dependency goes public -> detail only)")

    def check_kinds(self):
        for f in sorted(self.files):
            guarded = is_guarded(self.files[f].split("\n"))
            if f.endswith(".hpp") and not guarded:
                self.problems.append(f"{f}: a header (*.hpp) without an include guard; a file included more "
                                     "than once per translation unit is a fragment, named *.inc")
            elif f.endswith(".inc"):
                if guarded:
                    self.problems.append(f"{f}: a fragment (*.inc) with an include guard; a guarded file is a "
                                         "header, named *.hpp")
                if not self.in_detail(f):
                    self.problems.append(f"{f}: a fragment (*.inc) outside detail/")
            elif not f.endswith((".hpp", ".inc")):
                self.problems.append(f"{f}: neither a header (*.hpp) nor a fragment (*.inc)")
        for f in sorted(self.files):
            if self.in_detail(f):
                continue
            for t, number in self.edges[f]:
                if t.endswith(".inc"):
                    self.problems.append(f"{f}:{number}: a public header includes the fragment {t} "
                                         "(fragments are included only within detail/)")

    def check_detail_only_public(self):
        """Heuristic: a public header that declares something, all of it in a namespace detail."""
        for f in sorted(self.files):
            if self.in_detail(f) or not f.endswith(".hpp"):
                continue
            detail_tokens, other_tokens = namespace_content(self.files[f])
            if detail_tokens and not other_tokens:
                self.warnings.append(f"{f}: a public header whose declarations are all in namespace detail "
                                     "(internals belong in detail/)")

    def run(self):
        self.parse()
        self.check_cycles()
        self.check_layering()
        self.check_kinds()
        self.check_detail_only_public()
        return self


TOKEN = re.compile(r'[A-Za-z_]\w*|::|"(?:\\.|[^"\\])*"|\S')


def namespace_content(text):
    """(tokens in a namespace detail, tokens elsewhere) of a comment-free text, preprocessor lines
    left out. Namespace headers and their braces count as neither."""
    # (The continuation lines of a multi-line macro go with it.)
    lines, keep, continued = text.split("\n"), [], False
    for line in lines:
        directive = line.lstrip().startswith("#")
        if not (directive or continued):
            keep.append(line)
        continued = (directive or continued) and line.rstrip().endswith("\\")
    code = "\n".join(keep)
    tokens = TOKEN.findall(code)
    stack = []  # per open brace: the namespace names it opens, or None for another block
    detail_count = other_count = 0
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        if tok == "namespace" and not (i > 0 and tokens[i - 1] == "using"):
            j, names = i + 1, []
            while j < len(tokens) and tokens[j] not in ("{", "=", ";"):
                if tokens[j] not in ("::", "inline"):
                    names.append(tokens[j])
                j += 1
            if j < len(tokens) and tokens[j] == "{":
                stack.append(names)
                i = j + 1
                continue
        if tok == "{":
            stack.append(None)
        elif tok == "}":
            if stack and stack[-1] is not None:  # a namespace's closing brace
                stack.pop()
                i += 1
                continue
            if stack:
                stack.pop()
        path = []
        for names in stack:
            if names is None:
                break
            path.extend(names)
        if DETAIL in path:
            detail_count += 1
        else:
            other_count += 1
        i += 1
    return detail_count, other_count


def check(include_dir, strict, out=sys.stdout):
    if not os.path.isdir(os.path.join(include_dir, LIBRARY)):
        print(f"check_includes: no {LIBRARY}/ in {include_dir}", file=sys.stderr)
        return 2
    tree = Tree(include_dir).run()
    edges = sum(len(v) for v in tree.edges.values())
    for w in tree.warnings:
        print(f"{'error' if strict else 'warning'}: {w}", file=out)
    for p in tree.problems:
        print(f"error: {p}", file=out)
    failed = len(tree.problems) + (len(tree.warnings) if strict else 0)
    summary = f"{len(tree.files)} files, {edges} includes"
    if failed:
        print(f"check_includes: FAILED, {failed} problem(s) ({summary})", file=out)
        return 1
    print(f"check_includes: OK ({summary}{', ' + str(len(tree.warnings)) + ' warning(s)' if tree.warnings else ''})",
          file=out)
    return 0


def write_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, LIBRARY, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)


# A small tree shaped like the library's: a public header on a detail core that includes its
# fragment once per instruction set through a macro, with commented-out includes that must be
# ignored. It must pass.
CLEAN = {
    "api.hpp": '#pragma once\n#include "detail/core.hpp"\n#include "types.hpp"\nnamespace specdec {\n'
               "inline int api() { return detail::core(); }\n}\n",
    "types.hpp": '#pragma once\n#include "detail/vocabulary.hpp"  // re-exported\nnamespace specdec {\n'
                 "enum class stop_reason { a, b };\n}\n",
    "detail/vocabulary.hpp": "#pragma once\nnamespace specdec {\nusing token_id = int;\n}\n",
    "detail/core.hpp": '#pragma once\n#include "vocabulary.hpp"\n// #include "../api.hpp"\n'
                       '/* #include "../types.hpp"\n */\nnamespace specdec::detail {\n'
                       '#define SPECDEC_DETAIL_INSTANCE "instance.inc"\n#include "for_each.inc"\n'
                       "inline int core() { return 1; }\n}\n",
    "detail/for_each.inc": "#define SPECDEC_DETAIL_ISA 0\n#include SPECDEC_DETAIL_INSTANCE\n#undef SPECDEC_DETAIL_ISA\n",
    "detail/instance.inc": '#include "kernel.inc"\n',
    "detail/kernel.inc": "inline int kernel() { return 0; }\n",
}

# The same tree broken in every way the checker names: each entry of EXPECTED must appear in its
# output, and it must exit 1 (with --strict, the heuristic too).
BROKEN = dict(CLEAN)
BROKEN.update({
    "a.hpp": '#pragma once\n#include "b.hpp"\n',                  # a -> b -> a
    "b.hpp": '#pragma once\n#include "a.hpp"\n',
    "detail/core.hpp": CLEAN["detail/core.hpp"].replace(
        '#include "vocabulary.hpp"\n', '#include "vocabulary.hpp"\n#include "../types.hpp"\n'),  # detail -> public
    "detail/unguarded.hpp": "inline int twice() { return 2; }\n",  # a fragment named .hpp
    "detail/guarded.inc": "#pragma once\n",                       # a header named .inc
    "uses_fragment.hpp": '#pragma once\n#include "detail/kernel.inc"\n',
    "missing.hpp": '#pragma once\n#include "detail/nowhere.hpp"\n',
    "internals.hpp": "#pragma once\nnamespace specdec::detail {\ninline int x() { return 0; }\n}\n",
})
EXPECTED = [
    "include cycle among 2 file(s): specdec/a.hpp -> specdec/b.hpp -> specdec/a.hpp",
    "specdec/detail/core.hpp:3: a detail/ file includes specdec/types.hpp",
    "specdec/detail/unguarded.hpp: a header (*.hpp) without an include guard",
    "specdec/detail/guarded.inc: a fragment (*.inc) with an include guard",
    "specdec/uses_fragment.hpp:2: a public header includes the fragment specdec/detail/kernel.inc",
    'specdec/missing.hpp:2: #include "detail/nowhere.hpp" names no file of the library',
    "warning: specdec/internals.hpp: a public header whose declarations are all in namespace detail",
]


def self_test():
    me = os.path.abspath(__file__)
    failures = []

    def run(tree, *args):
        p = subprocess.run([sys.executable, me, *args, tree], capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr

    with tempfile.TemporaryDirectory() as tmp:
        clean, broken = os.path.join(tmp, "clean"), os.path.join(tmp, "broken")
        write_tree(clean, CLEAN)
        write_tree(broken, BROKEN)
        rc, out = run(clean, "--strict")
        print(f"--- clean tree (must pass, strict):\n{out}", end="")
        if rc != 0 or "warning" in out or "error" in out:
            failures.append(f"the clean tree failed (exit {rc})")
        rc, out = run(broken)
        print(f"--- broken tree (must fail):\n{out}", end="")
        if rc != 1:
            failures.append(f"the broken tree exited {rc}, not 1")
        for needle in EXPECTED:
            if needle not in out:
                failures.append(f"the broken tree's output lacks: {needle}")
        # Only the heuristic's warning, alone, fails only under --strict.
        only_warning = os.path.join(tmp, "only_warning")
        write_tree(only_warning, {**CLEAN, "internals.hpp": BROKEN["internals.hpp"]})
        rc, out = run(only_warning)
        rc_strict, out_strict = run(only_warning, "--strict")
        print(f"--- a detail-only public header (passes, fails with --strict):\n{out}{out_strict}", end="")
        if rc != 0 or rc_strict != 1:
            failures.append(f"a detail-only public header: exit {rc} (want 0), with --strict {rc_strict} (want 1)")
    for f in failures:
        print(f"SELF-TEST FAILED: {f}")
    if not failures:
        print("check_includes self-test: OK (the clean tree passes; the broken one fails, every problem named)")
    return 1 if failures else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("include_dir", nargs="?",
                        default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "include"),
                        help="the folder that holds specdec/ (default: the checkout's include/)")
    parser.add_argument("--strict", action="store_true", help="the heuristic's warnings fail too")
    parser.add_argument("--self-test", action="store_true", help="run the checker on small trees, broken and clean")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    return check(os.path.normpath(args.include_dir), args.strict)


if __name__ == "__main__":
    sys.exit(main())
