#!/usr/bin/env python3
"""Conformance ratchet: every case id listed in conformance/passing.txt must still pass.

Runs ../shared/conformance/run --verbose against target/release/promptforge, prints its output,
and exits 1 when a listed case does not PASS. Cases passing but not yet listed are reported so
they can be added to the list.
"""
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNNER = ROOT.parent / "shared" / "conformance" / "run"
LIST = ROOT / "conformance" / "passing.txt"
BINARY = ROOT / "target" / "release" / "promptforge"


def main():
    if not RUNNER.is_file():
        print(f"ratchet: conformance runner not found at {RUNNER}", file=sys.stderr)
        return 1
    listed = [
        line.strip()
        for line in LIST.read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    proc = subprocess.run(
        [sys.executable, str(RUNNER), "--bin", str(BINARY), "--verbose"],
        capture_output=True, text=True, cwd=ROOT,
    )
    print(proc.stdout, end="")
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        print("ratchet: the conformance runner itself failed", file=sys.stderr)
        return 1
    passed = set(re.findall(r"^PASS (\S+)$", proc.stdout, re.M))
    regressed = [case for case in listed if case not in passed]
    new = sorted(passed - set(listed))
    if new:
        print(f"ratchet: {len(new)} passing case(s) not yet in conformance/passing.txt:")
        for case in new:
            print(f"  {case}")
    if regressed:
        print(f"ratchet: {len(regressed)} listed case(s) no longer pass:", file=sys.stderr)
        for case in regressed:
            print(f"  {case}", file=sys.stderr)
        return 1
    print(f"ratchet: all {len(listed)} listed cases pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
