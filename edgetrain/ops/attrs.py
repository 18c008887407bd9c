"""Attribute schemas: what each op accepts, with the spec's defaults, declared once beside the op.

Every attribute a node carries is checked against its op's schema when a model is loaded and again when a graph
is planned, and replaced by a canonical Python value: a finite ``float``, an ``int`` within its range or choices,
a ``str`` from the allowed values, a tuple of those, or a numpy array. Anything else -- a string where a number
belongs, NaN, an unknown attribute name -- is refused with an error naming the node and the attribute. Code
generated from a graph (``edgetrain.codegen``) formats only these validated numbers, so nothing read from a
file ever becomes code.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import AttributeValueError
from ..record import Frozen

REQUIRED = object()          # the attribute has no default: a node must carry it
INT64 = (-(1 << 63), (1 << 63) - 1)
MAX_LIST = 1 << 16           # entries of an ints/floats attribute (pads, perm, axes, shapes are tiny)


class Attr(Frozen):
    """One attribute: ``kind`` (int, float, string, ints, floats, strings, tensor), its default (``REQUIRED``,
    or None for an optional attribute without one), allowed values (``choices``, empty: any), an inclusive
    range for ints (``low``/``high``) and the characters a free-form string may hold (``alphabet``)."""
    kind: str
    default: Any
    choices: tuple
    low: int
    high: int
    alphabet: str                # free-form strings (an Einsum equation): the characters allowed, empty: any

    def __init__(self, kind: str, default: Any = None, choices: tuple = (), low: int = INT64[0],
                 high: int = INT64[1], alphabet: str = ""):
        self._set(kind=kind, default=default, choices=choices, low=low, high=high, alphabet=alphabet)


def Int(default=None, choices=(), low: int = INT64[0], high: int = INT64[1]) -> Attr:  # noqa: N802
    return Attr("int", default, tuple(choices), low, high)


def Flag(default: int = 0) -> Attr:  # noqa: N802
    """A 0/1 switch."""
    return Attr("int", default, (0, 1))


def Float(default=None) -> Attr:  # noqa: N802
    return Attr("float", default)


def String(default, choices) -> Attr:  # noqa: N802
    return Attr("string", default, tuple(choices))


def Ints(default=None, low: int = INT64[0], high: int = INT64[1]) -> Attr:  # noqa: N802
    return Attr("ints", default, (), low, high)


def Floats(default=None) -> Attr:  # noqa: N802
    return Attr("floats", default)


def Tensor() -> Attr:  # noqa: N802
    return Attr("tensor")


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _is_number(v) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)


def _check_int(v, spec: Attr, where: str) -> int:
    if isinstance(v, bool):
        v = int(v)
    if not _is_int(v):
        raise AttributeValueError(f"{where} must be an integer, got {type(v).__name__} {_show(v)}")
    v = int(v)
    if not spec.low <= v <= spec.high:
        raise AttributeValueError(f"{where} is {v}, outside [{spec.low}, {spec.high}]")
    if spec.choices and v not in spec.choices:
        raise AttributeValueError(f"{where} is {v}; allowed: {', '.join(map(str, spec.choices))}")
    return v


def _check_float(v, where: str) -> float:
    if not _is_number(v):
        raise AttributeValueError(f"{where} must be a number, got {type(v).__name__} {_show(v)}")
    v = float(v)
    if not math.isfinite(v):
        raise AttributeValueError(f"{where} must be finite, got {v}")
    return v


def _check_string(v, spec: Attr, where: str) -> str:
    if isinstance(v, (bytes, bytearray)):
        try:
            v = bytes(v).decode("utf-8")
        except UnicodeDecodeError:
            raise AttributeValueError(f"{where} is not valid UTF-8 text") from None
    if not isinstance(v, str):
        raise AttributeValueError(f"{where} must be a string, got {type(v).__name__} {_show(v)}")
    if spec.choices and v not in spec.choices:
        raise AttributeValueError(f"{where} is {_show(v)}; allowed: {', '.join(spec.choices)}")
    if spec.alphabet and not set(v) <= set(spec.alphabet):
        raise AttributeValueError(f"{where} is {_show(v)}; allowed characters: {spec.alphabet}")
    return v


def _check_list(v, where: str) -> tuple:
    if isinstance(v, np.ndarray) and v.ndim == 1:
        v = v.tolist()
    if not isinstance(v, (list, tuple)):
        raise AttributeValueError(f"{where} must be a list, got {type(v).__name__} {_show(v)}")
    if len(v) > MAX_LIST:
        raise AttributeValueError(f"{where} has {len(v)} entries, more than {MAX_LIST}")
    return tuple(v)


def _check_tensor(v, where: str) -> np.ndarray:
    from ..ir.dtypes import ORT_TYPE_NAME
    if not isinstance(v, np.ndarray) or v.dtype not in ORT_TYPE_NAME:
        got = f"{v.dtype} array" if isinstance(v, np.ndarray) else f"{type(v).__name__} {_show(v)}"
        raise AttributeValueError(f"{where} must be a numeric tensor, got {got}")
    return v


def check_value(value, spec: Attr, where: str):
    """``value`` in its canonical form for ``spec``, or an AttributeValueError naming ``where``."""
    if spec.kind == "int":
        return _check_int(value, spec, where)
    if spec.kind == "float":
        return _check_float(value, where)
    if spec.kind == "string":
        return _check_string(value, spec, where)
    if spec.kind == "ints":
        return tuple(_check_int(x, spec, f"{where}[{k}]") for k, x in enumerate(_check_list(value, where)))
    if spec.kind == "floats":
        return tuple(_check_float(x, f"{where}[{k}]") for k, x in enumerate(_check_list(value, where)))
    if spec.kind == "tensor":
        return _check_tensor(value, where)
    if spec.kind == "strings":
        return tuple(_check_string(x, spec, f"{where}[{k}]") for k, x in enumerate(_check_list(value, where)))
    raise AssertionError(f"unknown attribute kind {spec.kind}")


def check_attrs(node, schema: dict[str, Attr]) -> dict:
    """The node's attributes checked against ``schema`` and made canonical; every problem names the node."""
    checked = {}
    for name, value in node.attrs.items():
        spec = schema.get(name)
        if spec is None:
            known = ", ".join(sorted(schema)) or "none"
            raise AttributeValueError(f"{node}: attribute {_show(name)} is not one {node.op_type} accepts "
                                      f"(accepted: {known})")
        checked[name] = check_value(value, spec, f"{node}: attribute '{name}'")
    for name, spec in schema.items():
        if spec.default is REQUIRED and name not in checked:
            raise AttributeValueError(f"{node}: required attribute '{name}' is missing")
    return checked


def _show(v) -> str:
    """A short, printable rendering of a value from a file (it may be hostile or huge)."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def Strings(default=None) -> Attr:  # noqa: N802
    """A list of strings (RNN activations); the op's shape rule checks the values."""
    return Attr("strings", default)


def Text(default, alphabet: str) -> Attr:  # noqa: N802
    """A free-form string of the characters in ``alphabet``."""
    return Attr("string", default, alphabet=alphabet)
