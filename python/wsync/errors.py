"""Exceptions: every wsync failure raises a :class:`WsyncError` subclass carrying the result code
of ``wsync_result_t``, ``where`` (the C function that failed) and the plugin's message."""

from __future__ import annotations


class WsyncError(RuntimeError):
    """A wsync call failed. ``code`` is the ``wsync_result_t`` value, ``where`` the failing C
    function (may be empty), ``message`` the text naming the offending value."""

    code: int = -1

    def __init__(self, code: int, where: str, message: str) -> None:
        self.code = code
        self.where = where
        self.message = message
        name = RESULT_NAMES.get(code, f"code {code}")
        super().__init__(f"{name}: {message}" + (f" (in {where})" if where else ""))


RESULT_NAMES = {
    1: "INVALID_ARGUMENT",
    2: "INCOMPATIBLE",
    3: "NO_DEVICE",
    4: "NOT_SUPPORTED",
    5: "OUT_OF_MEMORY",
    6: "BAD_MANIFEST",
    7: "OUT_OF_BOUNDS",
    8: "STALE_GENERATION",
    9: "TIMEOUT",
    10: "DIGEST_MISMATCH",
    11: "SYSTEM",
    12: "BUSY",
    13: "LAYOUT_MISMATCH",
    14: "NOT_FOUND",
    15: "PEER_GONE",
    16: "INTERNAL",
    17: "PERMISSION",
    18: "BAD_REQUEST",
    19: "BAD_ADAPTER",
}


class InvalidArgument(WsyncError):
    code = 1


class Incompatible(WsyncError):
    code = 2


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


class LayoutMismatch(WsyncError):
    code = 13


class NotFound(WsyncError):
    code = 14


class PeerGone(WsyncError):
    code = 15


class BadRequest(WsyncError):
    """An engine request the shim cannot read: not JSON, no method, a field missing or
    mistyped (a bad manifest inside a good request is :class:`BadManifest`)."""

    code = 18


class BadAdapter(WsyncError):
    """A LoRA adapter's files or tensors are malformed (adapter_config.json, safetensors)."""

    code = 19


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
        BadManifest,
        OutOfBounds,
        StaleGeneration,
        Timeout,
        DigestMismatch,
        LayoutMismatch,
        NotFound,
        PeerGone,
        BadRequest,
        BadAdapter,
    )
}


def error_for(code: int, where: str, message: str) -> WsyncError:
    """The exception for a ``wsync_result_t`` code."""
    return _BY_CODE.get(code, WsyncError)(code, where, message)


def check_reply(text: str | bytes) -> dict:
    """Parse one engine reply; raise its WsyncError when it says ``"ok": false``."""
    import json

    r = json.loads(text)
    if not r.get("ok"):
        raise error_for(int(r.get("code", 16)), "engine:" + str(r.get("method")), str(r.get("message")))
    return r
