#!/usr/bin/env python3
"""The folders as layers (docs/DESIGN.md, "Layout"): every `#include "x.h"` of a C or CUDA file
names a header of its own folder or of a folder below it, and no two modules use each other (a
file of each including the header of the other).

Usage: layers_check.py ROOT. Prints each violation and exits 1, else one line and 0.
"""

import os
import re
import sys
from collections import defaultdict

# Lowest first. A folder may include from its own folder and from any folder of a lower rank;
# folders of the same rank (the two backends, the three shims) never include each other.
LAYERS = [
    ("abi",),
    ("plugin/common",),
    ("plugin/adapters",),
    ("plugin/cpu", "plugin/cuda"),
    ("plugin/cuda/nccl",),
    ("model",),
    ("engine-shims/common",),
    ("engine-shims/sglang", "engine-shims/vllm", "engine-shims/lmdeploy"),
    ("engine-shims/api",),
    ("tools",),
    ("testbed/engine",),
    ("testbed/demo",),
    ("bench", "bench/cuda"),
]
WORKSHOP_TOP = "tests"  # above everything; may include from anywhere
SOURCES = (".c", ".h", ".cu", ".cuh")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def rank_of(folder: str) -> int | None:
    if folder == WORKSHOP_TOP or folder.startswith(WORKSHOP_TOP + "/"):
        return len(LAYERS)
    for r, group in enumerate(LAYERS):
        if folder in group:
            return r
    return None


def main(root: str) -> int:
    files = {}  # relative path -> folder
    where = defaultdict(list)  # header basename -> folders holding it
    for layer in [f for g in LAYERS for f in g] + [WORKSHOP_TOP]:
        base = os.path.join(root, layer)
        for dirpath, dirs, names in os.walk(base):
            folder = os.path.relpath(dirpath, root)
            if folder != layer and rank_of(folder) is not None and not folder.startswith(WORKSHOP_TOP):
                dirs[:] = []  # a sub-folder that is a layer of its own is walked as such
                continue
            for n in names:
                if n.endswith(SOURCES):
                    files[os.path.join(folder, n)] = layer
                    if n.endswith((".h", ".cuh")):
                        where[n].append(layer)
    bad = []
    # A module is a .c (or .cu) and its header; module A uses B when a file of A includes B's
    # header. Two modules with code that use each other own each other: refused. (A header with no
    # .c of its name holds types or a module's private half and owns nothing.)
    includes = defaultdict(set)
    for path, layer in sorted(files.items()):
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as f:
            text = f.read()
        mine = rank_of(layer)
        stem = os.path.splitext(path)[0]
        for inc in INCLUDE.findall(text):
            name = os.path.basename(inc)
            homes = where.get(name)
            if not homes:
                continue  # a system or generated header
            if layer in homes:
                home = layer
            elif len(set(homes)) == 1:
                home = homes[0]
            else:
                bad.append(f"{path}: includes {inc}, which {sorted(set(homes))} each hold")
                continue
            theirs = rank_of(home)
            if home != layer and theirs >= mine:
                kind = "a folder above it" if theirs > mine else "a folder beside it"
                bad.append(f"{path}: includes {inc} from {home}/, {kind}")
            includes[stem].add(os.path.join(home, os.path.splitext(name)[0]))
    coded = {os.path.splitext(p)[0] for p in files if p.endswith((".c", ".cu"))}
    for a, targets in sorted(includes.items()):
        for b in sorted(targets):
            if b != a and a in includes.get(b, ()) and a < b and a in coded and b in coded:
                bad.append(f"{a} and {b} use each other (a file of each includes the other's header)")
    for line in bad:
        print("layers: " + line)
    if bad:
        print(f"layers: {len(bad)} violation(s)")
        return 1
    print(f"layers: {len(files)} files, every include runs down, no two modules use each other")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "."))
