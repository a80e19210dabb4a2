"""Loading the C libraries: ``libwsync_shim.so`` (the engine shims, bucket planning, the plugin
loader) and, through it, a plugin. One table of ``(name, restype, argtypes)`` built once, as
vLLM's pynccl wrapper does.

Where the libraries are found: ``$WSYNC_PLUGIN_DIR`` when set, else the ``lib/`` folder inside
this package (the wheel ships the CMake-built ``.so`` files there). ``WSYNC_PLUGIN`` names the
plugin file and overrides the default choice (the CUDA plugin when it finds a device, else the
CPU plugin), exactly as for C engines.
"""

from __future__ import annotations

import ctypes as C
import importlib.util
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from . import _abi
from .errors import PluginUnavailable, error_for

PACKAGE_LIB = Path(__file__).resolve().parent / "lib"

_P = C.c_void_p
_E = C.POINTER(_abi.Error)
_FUNCTIONS = [
    ("wsync_shim_api_version", C.c_uint32, []),
    ("wsync_shim_result_name", C.c_char_p, [C.c_int]),
    ("wsync_shim_worker_open", C.c_int, [C.POINTER(_abi.WorkerConfig), C.POINTER(_P), _E]),
    ("wsync_shim_worker_close", None, [_P]),
    ("wsync_shim_worker_backend", _P, [_P, C.POINTER(C.c_int)]),
    ("wsync_shim_worker_serve", _P, [_P, C.c_char_p, C.c_size_t, C.POINTER(C.c_int), _E]),
    ("wsync_shim_worker_drain", C.c_int, [_P, _E]),
    ("wsync_shim_worker_opens", C.c_uint64, [_P]),
    ("wsync_shim_worker_shadows", C.c_int,
     [_P, C.POINTER(C.c_void_p), C.POINTER(C.c_void_p), C.POINTER(C.c_uint64), C.c_size_t, _E]),
    ("wsync_shim_worker_release", C.c_int, [_P, _E]),
    (
        "wsync_shim_encode_bucket",
        _P,
        [C.c_char_p, C.POINTER(C.c_char_p), C.c_size_t, C.c_int, C.c_int, C.c_char_p, C.c_int,
         C.c_int, C.c_int, _E],
    ),
    (
        "wsync_shim_encode_bucket_lines",
        _P,
        [C.c_char_p, C.POINTER(C.c_char_p), C.c_size_t, C.c_int, C.c_int, C.c_char_p, C.c_int,
         C.c_int, C.c_int, _E],
    ),
    (
        "wsync_shim_encode_lora",
        _P,
        [C.c_char_p, C.c_char_p, C.c_uint32, C.c_char_p, C.POINTER(C.c_char_p), C.c_size_t,
         C.c_char_p, C.c_int, _E],
    ),
    (
        "wsync_shim_plan",
        C.c_int,
        [C.c_char_p, C.POINTER(C.c_char_p), C.POINTER(C.c_uint64), C.c_size_t, C.c_uint64, C.c_uint,
         C.POINTER(C.c_size_t), C.POINTER(C.c_size_t), C.POINTER(C.c_size_t), _E],
    ),
    (
        "wsync_shim_plugin_open",
        C.c_int,
        [C.c_char_p, C.POINTER(C.POINTER(_abi.Plugin)), C.c_char_p, C.c_size_t, _E],
    ),
    (
        "wsync_shim_ep_owners",
        C.c_int,
        [C.c_char_p, C.POINTER(C.c_char_p), C.c_size_t, C.POINTER(C.c_int64), C.c_uint32,
         C.POINTER(C.c_int32), _E],
    ),
    ("wsync_shim_encode_begin", _P, [C.c_uint64, C.c_int64, C.POINTER(C.c_char_p), C.c_size_t, C.c_uint64, _E]),
    ("wsync_shim_encode_commit", _P, [C.c_uint64, _E]),
    ("wsync_shim_encode_abort", _P, [C.c_char_p, _E]),
    ("wsync_shim_encode_state", _P, [_E]),
    (
        "wsync_shim_encode_check",
        _P,
        [C.POINTER(C.c_char_p), C.POINTER(C.c_char_p), C.POINTER(C.c_uint32), C.POINTER(C.c_int64), C.c_size_t,
         _E],
    ),
    (
        "wsync_shim_encode_torch_manifest",
        _P,
        [C.c_char_p, C.c_uint32, C.c_uint64, C.c_uint64, C.c_int64, C.c_char_p, C.c_uint64, C.c_int,
         C.POINTER(C.c_char_p), C.POINTER(C.c_char_p), C.POINTER(C.c_uint32), C.POINTER(C.c_int64),
         C.POINTER(C.c_uint64), C.c_size_t, _E],
    ),
    ("wsync_shim_plan_forms", C.c_int,
     [C.c_char_p, C.c_size_t, C.c_char_p, C.POINTER(C.c_void_p), C.POINTER(C.c_void_p), _E]),
    ("wsync_shim_model_tensors", _P, [C.c_char_p, C.c_size_t, _E]),
    ("wsync_shim_checkpoint_plan", _P, [C.c_char_p, C.c_char_p, _E]),
    ("wsync_shim_api_free", None, [_P]),
]

SHIM_API_VERSION = 1


def lib_dir() -> Path:
    """The folder the C libraries are loaded from."""
    env = os.environ.get("WSYNC_PLUGIN_DIR")
    return Path(env) if env else PACKAGE_LIB


class ShimLibrary:
    """``libwsync_shim.so`` with its function table."""

    def __init__(self, path: Path) -> None:
        try:
            self.lib = C.CDLL(str(path), mode=os.RTLD_LOCAL)
        except OSError as e:
            raise PluginUnavailable(
                4, "dlopen", f"cannot load {path}: {e}; build the package (pip install .) or "
                "set WSYNC_PLUGIN_DIR to the folder holding libwsync_shim.so"
            ) from None
        for name, restype, argtypes in _FUNCTIONS:
            f = getattr(self.lib, name)
            f.restype = restype
            f.argtypes = argtypes
            setattr(self, name.removeprefix("wsync_shim_"), f)
        got = self.api_version()
        if got != SHIM_API_VERSION:
            raise PluginUnavailable(
                2, "wsync_shim_api_version",
                f"{path} speaks shim API {got}, this package {SHIM_API_VERSION}",
            )
        self.path = path

    def take_string(self, p: Optional[int]) -> Optional[str]:
        """The text of a malloc'd C string, freed."""
        if not p:
            return None
        try:
            return C.string_at(p).decode()
        finally:
            self.api_free(p)


_lock = threading.Lock()
_shim: Optional[ShimLibrary] = None


def shim() -> ShimLibrary:
    """The shim library, loaded once per process."""
    global _shim
    with _lock:
        if _shim is None:
            d = lib_dir()
            # The C loader searches $WSYNC_PLUGIN_DIR first: point it at the same folder.
            os.environ.setdefault("WSYNC_PLUGIN_DIR", str(d))
            find_nixl()  # before any plugin opens a nixl buffer
            _shim = ShimLibrary(d / "libwsync_shim.so")
        return _shim


def check(rc: int, err: _abi.Error) -> None:
    """Raise the WsyncError subclass for a failed call."""
    if rc != 0:
        raise error_for(rc, err.where.decode(errors="replace"), err.message.decode(errors="replace"),
                        int(err.op) if err.op_valid else None)


@dataclass(frozen=True)
class LoadedPlugin:
    """A loaded plugin: its tables and the file they came from."""

    table: C._Pointer[_abi.Plugin]
    path: str

    @property
    def name(self) -> str:
        return self.table.contents.name.decode()

    @property
    def version(self) -> str:
        return self.table.contents.version.decode()

    @property
    def producer(self) -> _abi.ProducerOps:
        return self.table.contents.producer.contents

    @property
    def consumer(self) -> _abi.ConsumerOps:
        return self.table.contents.consumer.contents


_plugins: dict = {}


# The NIXL wheels, newest CUDA first; each carries NIXL's C API beside its Python module.
_NIXL_PACKAGES = ("nixl_cu13", "nixl_cu12")


def find_nixl() -> Optional[str]:
    """NIXL's C API (libnixl_capi.so) of an installed NIXL wheel, which the plugins open on the
    first nixl buffer: ``WSYNC_NIXL_LIB`` when set, else the wheel's copy, which then becomes
    ``WSYNC_NIXL_LIB``. None when no wheel is installed (a nixl buffer then fails naming it)."""
    if os.environ.get("WSYNC_NIXL_LIB"):
        return os.environ["WSYNC_NIXL_LIB"]
    for name in _NIXL_PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            continue
        site = Path(list(spec.submodule_search_locations)[0]).parent
        lib = site / f".{name}.mesonpy.libs" / "libnixl_capi.so"
        if lib.is_file():
            os.environ["WSYNC_NIXL_LIB"] = str(lib)
            return str(lib)
    return None


def load_plugin(path: Optional[str] = None) -> LoadedPlugin:
    """Load a plugin through the C loader (``path``, else ``WSYNC_PLUGIN``, else the default)."""
    s = shim()
    key = path or os.environ.get("WSYNC_PLUGIN") or ""
    with _lock:
        if key in _plugins:
            return _plugins[key]
        out = C.POINTER(_abi.Plugin)()
        buf = C.create_string_buffer(4096)
        err = _abi.Error.new()
        rc = s.plugin_open(path.encode() if path else None, C.byref(out), buf, len(buf), C.byref(err))
        if rc != 0:
            raise PluginUnavailable(rc, err.where.decode(), err.message.decode())
        lp = LoadedPlugin(out, buf.value.decode())
        _plugins[key] = lp
        return lp


def c_strings(items: Sequence[str]) -> C.Array[C.c_char_p]:
    """A C array of NUL-terminated strings (the caller keeps it alive for the call)."""
    arr = (C.c_char_p * max(len(items), 1))()
    for i, s in enumerate(items):
        arr[i] = s.encode()
    return arr
