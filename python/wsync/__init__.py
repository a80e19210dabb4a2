"""wsync: weight sync from an RL trainer into a colocated inference engine's memory, over the
wsync C plugins (CUDA IPC on GPUs, shared memory on the CPU backend).

Trainer side: :class:`Producer`. Engine side: :class:`EngineWorker`, and the engine integrations
in :mod:`wsync.integrations`. Errors: :class:`WsyncError` and its subclasses (:mod:`wsync.errors`).
"""

from __future__ import annotations

__version__ = "0.1.10"

from ._native import load_plugin
from .engine import EngineWorker, dims_from_config
from .errors import WsyncError
from .producer import Producer, check_replies

__all__ = [
    "EngineWorker",
    "Producer",
    "WsyncError",
    "check_replies",
    "dims_from_config",
    "load_plugin",
    "plugin_info",
    "__version__",
]


def plugin_info(path: str | None = None) -> str:
    """"NAME VERSION (PATH)" of the plugin this process loads (``path``, ``WSYNC_PLUGIN`` or the
    default)."""
    p = load_plugin(path)
    return f"{p.name} {p.version} ({p.path})"
