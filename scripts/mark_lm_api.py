#!/usr/bin/env python3
"""mark_lm_api.py — puts LM_API in front of every public function declaration.

libloom is compiled with -fvisibility=hidden, so a function is exported from
libloom.so only when its declaration in include/loom/*.h starts with LM_API (defined
in loom/base.h). This script finds the file-scope declarations of lm_ functions in
those headers (statements whose code, comments removed, has a call-like "lm_name("
and that are not typedefs, static inline definitions, macros or struct bodies) and
prefixes the first line of each with "LM_API ", indenting its continuation lines to
match. It is idempotent: run it again after adding declarations. --check changes
nothing and exits 1, listing them, when a declaration lacks LM_API.

    python3 scripts/mark_lm_api.py [--check] [headers...]   (default: include/loom/*.h)
"""
import glob
import os
import re
import sys

DECL_NAME = re.compile(r"\blm_[A-Za-z0-9_]*\s*\(")
NOT_DECL = ("typedef", "static", "struct", "enum", "union")


def code_of(line, in_comment):
    """The line without comments, and whether a block comment is still open after it."""
    out, i = [], 0
    while i < len(line):
        if in_comment:
            end = line.find("*/", i)
            if end < 0:
                return "".join(out), True
            i, in_comment = end + 2, False
        elif line.startswith("/*", i):
            in_comment, i = True, i + 2
        elif line.startswith("//", i):
            break
        else:
            out.append(line[i])
            i += 1
    return "".join(out), in_comment


def statements(lines):
    """Yields (first line, last line, code) for each file-scope statement."""
    in_comment, continued, depth = False, False, 0
    start, code = None, []
    for idx, line in enumerate(lines):
        text, in_comment = code_of(line, in_comment)
        stripped = text.strip()
        if continued or (start is None and stripped.startswith("#")):
            continued = text.rstrip().endswith("\\")
            continue
        if start is None:
            if not stripped or stripped == "}" or stripped.startswith('extern "C"'):
                continue  # blank, comment only, or the C++ linkage block's braces
            start, code = idx, []
        code.append(stripped)
        depth += text.count("{") - text.count("}")
        whole = " ".join(code)
        ends_decl = stripped.endswith(";")
        ends_body = stripped.endswith("}") and not whole.startswith(("typedef", "struct", "enum", "union"))
        if depth == 0 and (ends_decl or ends_body):
            yield start, idx, whole
            start, code = None, []


def declarations(lines):
    """(first, last) line indices of the lm_ function declarations (with or without LM_API)."""
    for first, last, code in statements(lines):
        if code.startswith(NOT_DECL) or "{" in code or not DECL_NAME.search(code):
            continue
        yield first, last


def main(argv):
    check = "--check" in argv
    paths = [a for a in argv if a != "--check"]
    if not paths:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        paths = sorted(glob.glob(os.path.join(root, "include", "loom", "*.h")))
    missing, marked = [], 0
    for path in paths:
        with open(path) as f:
            lines = f.read().split("\n")
        changed = False
        for first, last in declarations(lines):
            if lines[first].startswith("LM_API "):
                continue
            missing.append(f"{path}:{first + 1}: {lines[first].strip()}")
            if not check:
                lines[first] = "LM_API " + lines[first]
                # continuation lines stay aligned with the opening parenthesis
                for i in range(first + 1, last + 1):
                    if lines[i][:1].isspace():
                        lines[i] = " " * len("LM_API ") + lines[i]
                changed = True
                marked += 1
        if changed:
            with open(path, "w") as f:
                f.write("\n".join(lines))
    if check:
        for m in missing:
            print(m)
        return 1 if missing else 0
    print(f"mark_lm_api: {marked} declaration(s) marked in {len(paths)} header(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
