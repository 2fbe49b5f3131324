#!/usr/bin/env python3
"""Every function in the C++ and CUDA sources is at most LIMIT lines (a function that does one
thing can be read at once). Usage: check_function_length.py LIMIT PATH... (a directory: its
.cpp, .h, .cu and .cuh files, recursively).

A function is a brace block that opens after a parameter list (and qualifiers) outside any
other function; lambdas and nested blocks count towards their function. Comments, string and
character literals and raw strings are blanked first, so braces inside them do not count."""
import os
import re
import sys

SOURCES = (".cpp", ".h", ".cu", ".cuh")

CONTROL = {"if", "for", "while", "switch", "catch", "return"}
# A parameter list's closing parenthesis, then qualifiers or a trailing return type.
SIGNATURE_END = re.compile(r"\)\s*(?:const|noexcept|override|final|mutable|->[\w:<>,\s*&]+|\s)*$")


def blank(text):
    """The text with every character but line breaks replaced by spaces."""
    return re.sub(r"[^\n]", " ", text)


def strip(src):
    """The source with comments and literals blanked, line numbers kept."""
    out, i, n = [], 0, len(src)
    while i < n:
        if src.startswith("//", i):
            j = src.find("\n", i)
            j = n if j < 0 else j
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            j = n if j < 0 else j + 2
        elif src.startswith('R"', i) and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")):
            m = re.match(r'R"([^(\s]*)\(', src[i:])
            end = ")" + (m.group(1) if m else "") + '"'
            j = src.find(end, i)
            j = n if j < 0 else j + len(end)
        elif src[i] in "\"'":
            j = i + 1
            while j < n and src[j] != src[i] and src[j] != "\n":
                j += 2 if src[j] == "\\" else 1
            j += 1
        else:
            out.append(src[i])
            i += 1
            continue
        out.append(blank(src[i:j]))
        i = j
    return "".join(out)


def function_name(before):
    """The name in front of the parameter list that `before` ends with, or None."""
    depth = 0
    for k in range(len(before) - 1, -1, -1):
        c = before[k]
        if c == ")":
            depth += 1
        elif c == "(":
            depth -= 1
            if depth == 0:
                m = re.search(r"([\w:~]+)\s*$", before[:k])
                return m.group(1) if m else None
    return None


def functions(path):
    """(length in lines, name, first line) of every outermost function in the file."""
    with open(path, encoding="utf-8") as f:
        s = strip(f.read())
    stack, found = [], []
    for m in re.finditer(r"[{}]", s):
        p = m.start()
        if s[p] == "{":
            before = s[max(0, p - 2000) : p]
            name = function_name(SIGNATURE_END.sub(")", before)) if SIGNATURE_END.search(before) else None
            is_function = name is not None and name not in CONTROL
            stack.append((is_function, s.count("\n", 0, p) + 1, name))
        elif stack:
            is_function, line, name = stack.pop()
            if is_function and not any(f for f, _, _ in stack):
                found.append((s.count("\n", 0, p) + 1 - line + 1, name, line))
    return found


def sources(paths):
    """The files named and the sources under the directories named, sorted."""
    for p in paths:
        if os.path.isdir(p):
            for root, _, files in sorted(os.walk(p)):
                yield from (os.path.join(root, f) for f in sorted(files) if f.endswith(SOURCES))
        else:
            yield p


def main():
    limit = int(sys.argv[1])
    bad = 0
    for path in sources(sys.argv[2:]):
        for length, name, line in functions(path):
            if length > limit:
                print(f"{path}:{line}: error: {name} is {length} lines (at most {limit})")
                bad += 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
