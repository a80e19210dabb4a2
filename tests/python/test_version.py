"""One version, told the same way by the package, the wheel's metadata, the CMake project (and so
every plugin's soname and its version string) and the ABI header's history."""

from __future__ import annotations

import os
import re
from importlib import metadata

import wsync

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def _read(path: str) -> str:
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def test_one_version_everywhere():
    v = wsync.__version__
    assert metadata.version("wsync") == v
    assert re.search(r"project\(wsync VERSION ([0-9.]+)", _read("CMakeLists.txt")).group(1) == v
    assert re.search(r'^version = "([0-9.]+)"', _read("pyproject.toml"), re.M).group(1) == v
    info = wsync.plugin_info()
    assert f" {v} " in f" {info} ", info  # "cpu 0.1.7 (...)": the plugin's own version string
    latest = max(re.findall(r"(?:Appended in|^ \*\s+)(0\.1\.[0-9]+)", _read("abi/wsync_abi_v1.h"), re.M),
                 key=lambda s: tuple(map(int, s.split("."))))
    assert latest == v, f"the ABI header's history ends at {latest}, the project says {v}"
