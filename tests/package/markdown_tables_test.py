#!/usr/bin/env python3
"""Every row of every Markdown table in the files given has as many cells as its header row, cut
as GitHub's renderer cuts them: at each `|` not escaped as `\\|`, code spans included (a bare `|`
inside `code` ends the cell there and breaks the row).

Usage: markdown_tables_test.py FILE.md...
"""
import re
import sys

DELIMITER = re.compile(r"^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def cells(line: str) -> int:
    s = line.strip()
    if s.startswith("|"):
        s = s[1:]
    if s.endswith("|") and not s.endswith("\\|"):
        s = s[:-1]
    return len(re.split(r"(?<!\\)\|", s))


def check(path: str) -> list:
    bad = []
    lines = open(path, encoding="utf-8").read().splitlines()
    fenced = False
    want = None
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            want = None
            continue
        if fenced or "|" not in line:
            want = None
            continue
        if want is None:
            if i + 1 < len(lines) and DELIMITER.match(lines[i + 1]) and "-" in lines[i + 1]:
                want = cells(line)
            continue
        if DELIMITER.match(line):
            continue
        got = cells(line)
        if got != want:
            bad.append(f"{path}:{i + 1}: {got} cells, the header has {want} "
                       f"(a `|` in a code span must be written \\|)")
    return bad


def main() -> int:
    bad = [b for p in sys.argv[1:] for b in check(p)]
    print(*bad, sep="\n") if bad else print(f"tables in {len(sys.argv) - 1} file(s): every row fits its header")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
