"""Exceptions: every wsync failure raises a :class:`WsyncError` subclass carrying the result code
of ``wsync_result_t``, ``where`` (the C function that failed) and the plugin's message."""

from __future__ import annotations

from typing import Optional


class WsyncError(RuntimeError):
    """A wsync call failed. ``code`` is the ``wsync_result_t`` value, ``where`` the failing C
    function (may be empty), ``message`` the text naming the offending value, ``op`` the index of
    the failing op in the call's ops when the failure is one op's (else None)."""

    code: int = -1

    def __init__(self, code: int, where: str, message: str, op: Optional[int] = None) -> None:
        self.code = code
        self.where = where
        self.message = message
        self.op = op
        name = result_name(code)
        super().__init__(f"{name}: {message}" + (f" (in {where})" if where else ""))


def result_name(code: int) -> str:
    """The name of a ``wsync_result_t`` code ("STALE_GENERATION"), from the library's one table
    (``wsync_shim_result_name``); "code N" when it is unknown or the library cannot be loaded."""
    try:
        from . import _native

        name = _native.shim().result_name(int(code))
    except Exception:
        name = None
    return name.decode() if name else f"code {code}"


class InvalidArgument(WsyncError):
    code = 1


class Incompatible(WsyncError):
    code = 2


class OutOfMemory(WsyncError):
    code = 5


class NoDevice(WsyncError):
    code = 3


class NotSupported(WsyncError):
    code = 4


class BadManifest(WsyncError):
    code = 6


class OutOfBounds(WsyncError):
    code = 7


class StaleGeneration(WsyncError):
    code = 8


class Timeout(WsyncError):
    code = 9


class DigestMismatch(WsyncError):
    code = 10


class System(WsyncError):
    """A system call failed (its errno text is in the message)."""

    code = 11


class Busy(WsyncError):
    """The object is in use: a staging buffer an engine still maps, an update already open."""

    code = 12


class LayoutMismatch(WsyncError):
    code = 13


class NotFound(WsyncError):
    code = 14


class PeerGone(WsyncError):
    code = 15


class Internal(WsyncError):
    code = 16


class Permission(WsyncError):
    """Another user's segment or socket, or no ptrace access to a direct producer."""

    code = 17


class BadRequest(WsyncError):
    """An engine request the shim cannot read: not JSON, no method, a field missing or
    mistyped (a bad manifest inside a good request is :class:`BadManifest`)."""

    code = 18


class BadAdapter(WsyncError):
    """A LoRA adapter's files or tensors are malformed (adapter_config.json, safetensors)."""

    code = 19


class UnknownPlan(WsyncError):
    """A replayed plan id the engine holds no plan under (never recorded by it, dropped, or
    its segments changed): the bucket stays unconsumed; send it in full."""

    code = 20


class PluginUnavailable(WsyncError):
    """No usable plugin: missing, incompatible, or no device for it."""

    code = 4


_BY_CODE = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        Incompatible,
        NoDevice,
        NotSupported,
        OutOfMemory,
        BadManifest,
        OutOfBounds,
        StaleGeneration,
        Timeout,
        DigestMismatch,
        System,
        Busy,
        LayoutMismatch,
        NotFound,
        PeerGone,
        Internal,
        Permission,
        BadRequest,
        BadAdapter,
        UnknownPlan,
    )
}


def error_for(code: int, where: str, message: str, op: Optional[int] = None) -> WsyncError:
    """The exception for a ``wsync_result_t`` code."""
    return _BY_CODE.get(code, WsyncError)(code, where, message, op)


def check_reply(text: str | bytes) -> dict:
    """Parse one engine reply; raise its WsyncError when it says ``"ok": false``."""
    import json

    r = json.loads(text)
    if not r.get("ok"):
        raise error_for(int(r.get("code", 16)), "engine:" + str(r.get("method")), str(r.get("message")))
    return r
