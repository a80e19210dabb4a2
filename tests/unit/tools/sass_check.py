#!/usr/bin/env python3
"""The CUDA plugin's machine code: list every cubin (ELF) and PTX in the .so's fat binaries and
check there is machine code for each architecture asked for and PTX for the last.

Usage: sass_check.py LIB.so ARCH... (e.g. 80 90 100 120). Reads the fat binary headers itself
(magic 0xBA55ED50; each entry: kind 1 PTX / 2 ELF, its header size, padded payload size, and the
sm version at byte 28), so it needs no CUDA tool; with cuobjdump on PATH, its --list-elf is
printed too.
"""

import shutil
import struct
import subprocess
import sys
from collections import Counter

FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)


def entries(data: bytes) -> Counter:
    found: Counter = Counter()
    i = 0
    while (i := data.find(FATBIN_MAGIC, i)) >= 0:
        _version, header, size = struct.unpack_from("<HHQ", data, i + 4)
        j, end = i + header, i + header + size
        while j < end:
            kind, _v, h, padded = struct.unpack_from("<HHII", data, j)
            sm = struct.unpack_from("<I", data, j + 28)[0]
            found[({1: "ptx", 2: "sass"}.get(kind, f"kind{kind}"), sm)] += 1
            if h == 0:
                break
            j += h + padded
        i = max(end, i + 4)
    return found


def main(lib: str, archs: list[int]) -> int:
    with open(lib, "rb") as f:
        found = entries(f.read())
    for (kind, sm), n in sorted(found.items()):
        print(f"sass_check: {lib}: {kind} sm_{sm} ({n} kernel files)")
    if shutil.which("cuobjdump"):
        print(subprocess.run(["cuobjdump", "--list-elf", lib], capture_output=True, text=True).stdout, end="")
    missing = [f"sass sm_{a}" for a in archs if ("sass", a) not in found]
    if archs and ("ptx", archs[-1]) not in found:
        missing.append(f"ptx sm_{archs[-1]}")
    if missing:
        print(f"sass_check: FAIL: {lib} lacks " + ", ".join(missing))
        return 1
    print(f"sass_check: machine code for sm_{', sm_'.join(map(str, archs))}, PTX of sm_{archs[-1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], [int(a) for a in sys.argv[2:]]))
