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
    assert f" {v} " in f" {info} ", info  # "cpu 0.1.8 (...)": the plugin's own version string
    latest = max(re.findall(r"(?:Appended in |^ \*\s+)(0\.1\.[0-9]+)", _read("abi/wsync_abi_v1.h"), re.M),
                 key=lambda s: tuple(map(int, s.split("."))))
    assert latest == v, f"the ABI header's history ends at {latest}, the project says {v}"


def test_console_script_runs_the_cli_and_tells_the_version():
    """`pip install .` puts a `wsync` script on the environment's PATH; it runs the CLI the wheel
    ships, whose `info` prints the plugin's version: the same one."""
    import subprocess
    import sys

    script = os.path.join(os.path.dirname(sys.executable), "wsync")
    assert os.path.exists(script), f"no console script at {script}: pyproject.toml [project.scripts]"
    plugin = os.path.join(str(wsync._native.lib_dir()), "libwsync_cpu.so")
    out = subprocess.run([script, "info", plugin], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert f" {wsync.__version__}" in out.stdout, out.stdout
    demo = subprocess.run([script, "demo", "--help"], capture_output=True, text=True, timeout=60)
    assert demo.returncode == 0 and "--layout" in demo.stdout + demo.stderr, demo.stderr
