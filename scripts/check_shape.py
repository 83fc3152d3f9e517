#!/usr/bin/env python3
"""The code's shape, checked: file and function sizes, and no benchmark figures in comments.

  scripts/check_shape.py            # exit 1 naming each violation
  scripts/check_shape.py --list     # also every file and function over the aims, with sizes

Aims (docs/architecture.md, "Code shape"): a source file of include/ base/ io/ runtime/ cuda/
bindings/ tools/ python/src/ holds at most 400 lines, a function at most 60. A function may be
longer where a comment in the 3 lines above it says why, starting "// Longer than 60 lines:".
Those that were longer before the aims and are not split yet are listed in
scripts/shape_exceptions.txt with their size then: the check fails when one of them grows, when
a new one appears, or when a listed one is gone (so the list only shrinks).

Comments state contracts; figures measured on some machine belong in bench/README.md. A comment
line fails the check when it narrates a measurement ("measured: ...", "Measured on ...") or an
issue ("issue 16"), or quotes a throughput (1.5 GB/s) outside a quoted example of output.
"""
import argparse
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ["include", "base", "io", "runtime", "cuda", "bindings", "tools", "python/src"]
EXTENSIONS = (".h", ".cc", ".cu")
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
EXCEPTIONS = os.path.join(ROOT, "scripts", "shape_exceptions.txt")
LONGER_MARK = "// Longer than 60 lines:"

FIGURE_PATTERNS = [
    re.compile(r"\b[Mm]easured(:| on\b| at\b| here\b| ~| \d)"),
    re.compile(r"\b[Ii]ssue #?\d+"),
    re.compile(r"\d(\.\d+)? ?(GB|MB|GiB|MiB|TB)/s"),
]


def sources():
    for folder in FOLDERS:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, folder)):
            dirnames.sort()
            for name in sorted(filenames):
                if name.endswith(EXTENSIONS):
                    path = os.path.join(dirpath, name)
                    yield os.path.relpath(path, ROOT)


def strip_code(line, in_block):
    """(code without strings and comments, comment text, still in a /* */ block)."""
    code, comment, i = [], [], 0
    while i < len(line):
        if in_block:
            end = line.find("*/", i)
            if end < 0:
                comment.append(line[i:])
                return "".join(code), "".join(comment), True
            comment.append(line[i:end])
            i, in_block = end + 2, False
        elif line.startswith("//", i):
            comment.append(line[i + 2:])
            break
        elif line.startswith("/*", i):
            in_block, i = True, i + 2
        elif line[i] in "\"'":
            quote, j = line[i], i + 1
            if quote == "'" and i > 0 and (line[i - 1].isalnum()):  # 1'000 digit separators
                i += 1
                continue
            while j < len(line) and line[j] != quote:
                j += 2 if line[j] == "\\" else 1
            code.append(quote + quote)
            i = j + 1
        else:
            code.append(line[i])
            i += 1
    return "".join(code), "".join(comment), in_block


HEADER_KEYWORDS = re.compile(r"\b(namespace|class|struct|union|enum|extern)\b")


def functions(lines):
    """(name, first line, line count) of each function body in a C++ file, by brace matching:
    a `{` that opens at namespace or class level after a `)` (a signature) starts one."""
    found = []
    stack = []  # per open brace: "scope" (namespace/class/...), "function", or "block"
    pending = ""  # code since the last `;`, `{` or `}` at scope level
    in_block = False
    raw_string = False
    for number, line in enumerate(lines, 1):
        if raw_string:
            if ')"' in line:
                raw_string = False
            continue
        if 'R"(' in line and ')"' not in line.split('R"(', 1)[1]:
            raw_string = True
            continue
        code, _, in_block = strip_code(line, in_block)
        if code.lstrip().startswith("#"):
            continue
        for ch in code:
            at_scope = all(kind == "scope" for kind in stack)
            if ch == "{":
                if not at_scope:
                    stack.append("block")
                    continue
                head = pending.strip()
                if ")" in head and not HEADER_KEYWORDS.match(head) and not head.endswith("="):
                    name = re.findall(r"([~\w:]+(?:operator\S*)?)\s*\(", head)
                    stack.append(("function", name[0] if name else "?", number))
                elif HEADER_KEYWORDS.search(head) and "(" not in head.split("{")[0]:
                    stack.append("scope")
                else:
                    stack.append("block")
                pending = ""
            elif ch == "}":
                if not stack:
                    continue
                kind = stack.pop()
                if isinstance(kind, tuple):
                    found.append((kind[1], kind[2], number - kind[2] + 1))
                if all(k == "scope" for k in stack):
                    pending = ""
            elif ch == ";" and at_scope:
                pending = ""
            elif at_scope:
                pending += ch
        if all(k == "scope" for k in stack):
            pending += " "
    return found


def longer_marked(lines, first):
    return any(LONGER_MARK in lines[i] for i in range(max(0, first - 4), first - 1))


def check(list_all):
    exceptions = {}
    if os.path.exists(EXCEPTIONS):
        for row in open(EXCEPTIONS, encoding="utf-8"):
            row = row.split("#", 1)[0].strip()
            if row:
                key, size = row.rsplit(" ", 1)
                exceptions[key] = int(size)
    over, problems = {}, []
    for path in sources():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            lines = f.read().split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        if len(lines) > MAX_FILE_LINES:
            over[path] = len(lines)
        for name, first, count in functions(lines):
            if count > MAX_FUNCTION_LINES and not longer_marked(lines, first):
                over[f"{path}:{name}"] = count
        in_block = False
        for number, line in enumerate(lines, 1):
            _, comment, in_block = strip_code(line, in_block)
            text = re.sub(r'"[^"]*"', '""', comment)  # quoted examples of output may hold figures
            for pattern in FIGURE_PATTERNS:
                if pattern.search(text):
                    problems.append(f"{path}:{number}: a figure or story in a comment (state the "
                                    f"contract; figures go to bench/README.md): {line.strip()}")
                    break
    for key, size in sorted(over.items()):
        limit = MAX_FILE_LINES if ":" not in key else MAX_FUNCTION_LINES
        if key not in exceptions:
            problems.append(f"{key}: {size} lines, over the aim of {limit} (split it, or say why "
                            f"above it: '{LONGER_MARK} ...')")
        elif size > exceptions[key]:
            problems.append(f"{key}: {size} lines, grew past its listed {exceptions[key]} "
                            f"(scripts/shape_exceptions.txt); split it")
    for key in sorted(set(exceptions) - set(over)):
        problems.append(f"{key}: within the aims now (or gone); remove it from "
                        f"scripts/shape_exceptions.txt")
    if list_all:
        for key, size in sorted(over.items(), key=lambda kv: -kv[1]):
            print(f"over: {key} {size}")
    for problem in problems:
        print(problem)
    listed = sum(1 for key in over if key in exceptions)
    print(f"check_shape: {len(problems)} problem(s); {listed} listed exception(s) still over "
          f"the aims")
    return 1 if problems else 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--list", action="store_true", help="print everything over the aims")
    sys.exit(check(parser.parse_args().list))
