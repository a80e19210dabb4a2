#!/usr/bin/env python3
"""The environment variables a built plugin can read: every string of its read-only data
(.rodata, where the names getenv is handed live) that is a whole WSYNC_* name, checked against
the list its docs give (the CUDA plugin: plugin/cuda/wsync_cuda_tuning.h).

Usage: env_check.py LIB.so NAME... Prints the names found; exits 1 when one is not listed.
"""

import os
import re
import subprocess
import sys
import tempfile


def main(lib: str, allowed: list[str]) -> int:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "rodata")
        subprocess.run(["objcopy", "-O", "binary", "--only-section=.rodata", lib, out], check=True)
        with open(out, "rb") as f:
            data = f.read()
    names = sorted({m.decode() for m in re.findall(rb"(?<=\0)WSYNC_[A-Z0-9_]+(?=\0)", data)})
    print(f"env_check: {lib}: {' '.join(names) or 'no WSYNC_ name'}")
    extra = [n for n in names if n not in allowed]
    if extra:
        print(f"env_check: FAIL: {lib} names {', '.join(extra)}, not among {', '.join(allowed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2:]))
