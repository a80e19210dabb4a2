"""The ``wsync`` console script: runs the C command-line tool the wheel ships in ``wsync/bin``
(``wsync info``, ``inspect``; ``demo``, ``plan``, ``bench`` are the programs ``wsync-<command>``
beside it)."""

import os
import sys
from pathlib import Path


def main() -> None:
    exe = Path(__file__).resolve().parent / "bin" / "wsync"
    if not os.access(exe, os.X_OK):
        sys.exit(f"wsync: the command-line tool is not installed at {exe}; build the package with pip install .")
    os.execv(str(exe), [str(exe), *sys.argv[1:]])
