"""Result codes have one table, the library's (wsync_result_name): the package takes each
exception's printed name from it, and has a class for every code it knows, named after it."""

from __future__ import annotations

import ctypes as C

import wsync
from wsync import _native, errors


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def test_every_result_code_has_its_class_and_name():
    lib = _native.shim()
    codes = {}
    code = 1
    while (name := lib.result_name(code)) is not None:
        codes[code] = name.decode()
        code += 1
    assert codes[8] == "STALE_GENERATION" and len(codes) >= 19, codes
    for code, name in codes.items():
        cls = getattr(errors, _camel(name), None)
        assert cls is not None and cls.code == code, f"no exception class {_camel(name)} for code {code}"
        assert errors.error_for(code, "f", "m").__class__ is cls
        assert str(cls(code, "f", "msg")) == f"{name}: msg (in f)"
    assert errors.error_for(999, "", "m").__class__ is errors.WsyncError
    assert "code 999" in str(errors.error_for(999, "", "m"))


def test_close_raises_busy_while_an_engine_maps_the_buffer():
    """Producer.close's documented Busy: an engine that has not released its mapping."""
    import models
    import pytest
    from conftest import plugin_for

    model = models.tiny_model("dense")
    sd = models.step(model, 0)
    params = models.zeros_like_layout(models.engine_layout(sd, "sglang", 0, 1))
    w = wsync.EngineWorker(params, engine="sglang", config=model.config, plugin=plugin_for("cpu"))
    prod = wsync.Producer("sglang", bucket_bytes=1 << 20, plugin=plugin_for("cpu"))
    prod.sync(sd, lambda m: [w.handle(m)])
    with pytest.raises(errors.Busy) as e:
        prod.close()
    assert "still mapped" in str(e.value)
    w.release()
    prod.close()
    w.close()


def test_the_failing_op_comes_with_the_error():
    """wsync_error_t.op (0.1.8): a failure of one op carries its index to the exception, read from
    the struct the library filled, not from the message."""
    import pytest
    from wsync import _abi

    err = _abi.Error.new()
    assert err.struct_size == C.sizeof(_abi.Error)
    err.message, err.op, err.op_valid = b"op 7: out of bounds", 7, 1
    with pytest.raises(errors.OutOfBounds) as e:
        _native.check(7, err)
    assert e.value.op == 7
    err.op_valid = 0
    with pytest.raises(errors.OutOfBounds) as e:
        _native.check(7, err)
    assert e.value.op is None
