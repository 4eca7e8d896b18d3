"""Checks of the arguments that public entry points take, made at the call.

A wrong argument must fail where it was passed, with a message that names the
call, the parameter, what was expected and what was given, not later as a raw
``AttributeError`` from deep inside an offload (or not at all). The protocol
packages (:mod:`refimpl.store`, :mod:`refimpl.comm`, :mod:`refimpl.worker`) call
these at construction and attach time only, never per tensor per cycle.

    expect(runtime, Runtime, "OffloadStore(rt, ...)", "rt", "a Runtime (TorchRuntime(device) or SimRuntime)",
           hint="did you mean store.attach_module(model)?")
    -> ArgumentTypeError: OffloadStore(rt, ...): rt must be a Runtime (TorchRuntime(device) or SimRuntime),
       got Linear; did you mean store.attach_module(model)?
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Iterable
from typing import Any


class ArgumentTypeError(TypeError):
    """An argument of a public call has the wrong type; the message says what was expected and what was given."""


class ArgumentValueError(ValueError):
    """An argument of a public call has the right type but a value the call cannot use."""


def describe(value: Any) -> str:
    """How a message names a given value: its type, with the value itself for short scalars and strings."""
    name = type(value).__name__
    if value is None or isinstance(value, (bool, numbers.Number)) or (isinstance(value, str) and len(value) <= 40):
        return f"{value!r} ({name})" if value is not None else "None"
    return name


def _fail(call: str, param: str, expected: str, value: Any, hint: str) -> ArgumentTypeError:
    tail = f"; {hint}" if hint else ""
    return ArgumentTypeError(f"{call}: {param} must be {expected}, got {describe(value)}{tail}")


def expect(value: Any, types: type | tuple[type, ...], call: str, param: str, expected: str, *,
           hint: str = "", optional: bool = False) -> Any:
    """Return ``value`` if it is an instance of ``types`` (or None with ``optional``); else raise
    :class:`ArgumentTypeError` naming ``call``, ``param``, ``expected`` and what was given (``hint``: what
    to do instead)."""
    if (optional and value is None) or isinstance(value, types):
        return value
    raise _fail(call, param, expected, value, hint)


def expect_bool(value: Any, call: str, param: str) -> bool:
    """``value`` if it is a bool (``0``, ``"false"`` and None are refused: they read as a different answer)."""
    return expect(value, bool, call, param, "True or False")


def expect_int(value: Any, call: str, param: str, *, minimum: int | None = None, optional: bool = False) -> Any:
    """``value`` if it is an int (not a bool) at least ``minimum``; None too with ``optional``."""
    if optional and value is None:
        return value
    expected = "an int" + (f" >= {minimum}" if minimum is not None else "") + (" or None" if optional else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise _fail(call, param, expected, value, "")
    if minimum is not None and value < minimum:
        raise ArgumentValueError(f"{call}: {param} must be {expected}, got {value}")
    return value


def expect_seconds(value: Any, call: str, param: str, *, positive: bool = True, optional: bool = False) -> Any:
    """``value`` if it is a finite real number of seconds (> 0, or >= 0 without ``positive``); None too with
    ``optional``."""
    if optional and value is None:
        return value
    bound = "> 0" if positive else ">= 0"
    expected = f"a finite number of seconds {bound}" + (" or None" if optional else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise _fail(call, param, expected, value, "")
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ArgumentValueError(f"{call}: {param} must be {expected}, got {value}")
    return value


def expect_name(value: Any, call: str, param: str, *, optional: bool = False) -> Any:
    """``value`` if it is a non-empty str (None too with ``optional``)."""
    if optional and value is None:
        return value
    expect(value, str, call, param, "a non-empty str" + (" or None" if optional else ""))
    if not value:
        raise ArgumentValueError(f"{call}: {param} must be a non-empty str, got ''")
    return value


def expect_names(value: Any, call: str, param: str, *, optional: bool = False) -> Any:
    """``value`` if it is an iterable of str and not a str itself (``"dp"`` would read as ``["d", "p"]``);
    returned as a tuple (None passes with ``optional``)."""
    if optional and value is None:
        return value
    expected = "a collection of names (str)" + (" or None" if optional else "")
    if isinstance(value, (str, bytes)):
        raise _fail(call, param, expected, value, f"wrap a single name in a list: [{value!r}]")
    if not isinstance(value, Iterable):
        raise _fail(call, param, expected, value, "")
    out = tuple(value)
    for v in out:
        if not isinstance(v, str):
            raise _fail(call, f"every element of {param}", "a str", v, "")
    return out


__all__ = [
    "ArgumentTypeError",
    "ArgumentValueError",
    "describe",
    "expect",
    "expect_bool",
    "expect_int",
    "expect_name",
    "expect_names",
    "expect_seconds",
]
