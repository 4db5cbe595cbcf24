#!/usr/bin/env python3
"""The C++ block after the README's "<!-- examples/send_recv.cc -->" marker must equal that file.

Usage: readme_snippet_test.py README.md examples/send_recv.cc
"""
import difflib
import pathlib
import sys


def snippet(readme: str, name: str) -> str:
    marker = f"<!-- examples/{name} -->"
    if marker not in readme:
        sys.exit(f"README.md has no {marker} marker before the C++ block")
    rest = readme.split(marker, 1)[1]
    fence = rest.find("```cpp\n")
    end = rest.find("\n```", fence + 7)
    if fence < 0 or end < 0:
        sys.exit(f"no ```cpp block after {marker}")
    return rest[fence + 7:end + 1]


def main() -> int:
    readme_path, example_path = map(pathlib.Path, sys.argv[1:3])
    block = snippet(readme_path.read_text(), example_path.name)
    source = example_path.read_text()
    if block == source:
        print(f"README block == {example_path.name} ({len(source.splitlines())} lines)")
        return 0
    sys.stdout.writelines(difflib.unified_diff(source.splitlines(True), block.splitlines(True),
                                               str(example_path), "README.md block"))
    return 1


if __name__ == "__main__":
    sys.exit(main())
