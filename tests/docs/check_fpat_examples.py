#!/usr/bin/env python3
"""Compiles the ```fpat examples of Markdown files with fpat-tblgen, so that the docs cannot
drift from the language: the blocks of one section (a ## or ### heading) are one file, after
the prelude and the built-in activations; a section with `#ifdef NAME` is compiled with and
without -D NAME. Warnings count as errors.

    check_fpat_examples.py FPAT_TBLGEN PATTERNS_DIR WORK_DIR FILE.md...
"""
import os
import re
import subprocess
import sys

tblgen, patterns, work = sys.argv[1:4]
os.makedirs(work, exist_ok=True)
failures = 0
checked = 0
for doc in sys.argv[4:]:
    sections = []  # (heading, first line, [block text])
    heading, fence = "(top)", None
    for number, line in enumerate(open(doc, encoding="utf-8"), 1):
        if fence is None and re.match(r"#{2,3} ", line):
            heading = line.strip("# \n")
        elif fence is None and line.startswith("```"):
            fence = line[3:].strip()
            block, start = [], number
        elif fence is not None and line.startswith("```"):
            if fence == "fpat":
                if not sections or sections[-1][0] != heading:
                    sections.append((heading, start, []))
                sections[-1][2].append("".join(block))
            fence = None
        elif fence is not None:
            block.append(line)
    for heading, start, blocks in sections:
        text = 'include "fpat.fpat"\ninclude "activations.fpat"\n' + "\n".join(blocks)
        path = os.path.join(work, "%s-%d.fpat" % (os.path.basename(doc), start))
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        names = sorted(set(re.findall(r"^#ifn?def (\w+)", text, re.M)))
        for defines in [[]] + [["-D", n] for n in names]:
            checked += 1
            r = subprocess.run([tblgen, "-I", patterns, "--check", "--Werror"] + defines + [path],
                               capture_output=True, text=True)
            if r.returncode != 0:
                failures += 1
                print("%s:%d: the fpat examples of '%s' do not compile%s (as %s):\n%s"
                      % (doc, start, heading, " with " + " ".join(defines) if defines else "",
                         path, r.stdout + r.stderr))
print("%d fpat example section(s) checked, %d failed" % (checked, failures))
sys.exit(1 if failures or checked == 0 else 0)
