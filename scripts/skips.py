#!/usr/bin/env python3
"""One line: the tests a ctest run skipped, counted by cause.

usage: skips.py CTEST_JUNIT_XML   (written by `ctest --output-junit FILE`)

A skip's reason is "<cause>: <details>" (tests/test_env.h gives the causes); the cause is the text
before the first ':' (or '('). Reasons come from each skipped test's output: gtest's "Skipped"
message, or the last line that says "skip" for a test skipped by exit code. Tests that pytest skipped inside
a ctest entry that passed ("SKIPPED [n] file:line: reason" with -rs) count too. Prints, e.g.,
"skipped 95: no CUDA device (90), kernel lacks it (5)".
"""
import collections
import re
import sys
import xml.etree.ElementTree as ET

PYTEST_SKIP = re.compile(r"^SKIPPED \[(\d+)\] [^:]+:\d+: (.*)$")


def cause_of(reason):
    reason = re.sub(r"^(skipped|SKIPPED)\s*:\s*", "", reason.strip())
    cause = re.split(r"[:(]", reason, maxsplit=1)[0].strip()
    return cause or "no reason given"


def gtest_reason(out):
    lines = out.splitlines()
    for i, line in enumerate(lines):
        if line.endswith(": Skipped") and i + 1 < len(lines) and lines[i + 1].strip():
            return lines[i + 1]
    said = [line for line in lines if "skip" in line.lower() and "[  SKIPPED ]" not in line]
    return said[-1] if said else ""


def main(path):
    counts = collections.Counter()
    tests = pytest_tests = 0
    for case in ET.parse(path).getroot().iter("testcase"):
        out = "".join(case.find("system-out").itertext()) if case.find("system-out") is not None else ""
        if case.find("skipped") is not None or case.get("status") in ("notrun", "disabled"):
            if case.get("status") == "disabled":
                continue
            tests += 1
            counts[cause_of(gtest_reason(out))] += 1
            continue
        for line in out.splitlines():
            m = PYTEST_SKIP.match(line.strip())
            if m:
                pytest_tests += int(m.group(1))
                counts[cause_of(m.group(2))] += int(m.group(1))
    if not counts:
        print("skipped 0")
        return
    by_cause = ", ".join(f"{cause} ({n})" for cause, n in counts.most_common())
    also = f" ({pytest_tests} of them inside python.pytest)" if pytest_tests else ""
    print(f"skipped {tests + pytest_tests}{also}: {by_cause}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__.split("\n\n")[1])
    main(sys.argv[1])
