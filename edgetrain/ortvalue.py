"""``OrtValue``: a numpy array that also answers onnxruntime's ``OrtValue`` methods.

ORT's training API hands tensors back as ``OrtValue``s (``get_contiguous_parameters`` among them), and scripts
written for it call ``.numpy()``, ``.shape()`` or ``.data_type()`` on them. Returning an ndarray subclass keeps
both kinds of caller working: numpy code sees an array, ORT code finds its methods. ``shape`` is the one name
the two disagree on (an attribute in numpy, a method in ORT), so it is a tuple that can also be called.
"""
from __future__ import annotations

import numpy as np

# numpy dtype -> the element name in ONNX's type strings ("tensor(float)"), as ORT's data_type() prints them
_ELEMENT_NAMES = {
    np.dtype(np.float32): "float", np.dtype(np.float64): "double", np.dtype(np.float16): "float16",
    np.dtype(np.int8): "int8", np.dtype(np.int16): "int16", np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64", np.dtype(np.uint8): "uint8", np.dtype(np.uint16): "uint16",
    np.dtype(np.uint32): "uint32", np.dtype(np.uint64): "uint64", np.dtype(np.bool_): "bool",
}


class Shape(tuple):
    """A shape tuple that ORT-style code may also call: ``v.shape()`` gives the list ORT returns."""

    def __call__(self) -> list[int]:
        return list(self)


class OrtValue(np.ndarray):
    """An ndarray with ORT's ``OrtValue`` methods. Results of arithmetic are plain arrays."""

    @property
    def shape(self) -> Shape:
        return Shape(np.ndarray.shape.__get__(self))

    @shape.setter
    def shape(self, value) -> None:
        np.ndarray.shape.__set__(self, value)

    def __array_wrap__(self, array, context=None, return_scalar=False):
        # ufunc results are new values, not parameters: hand them back as plain arrays (or scalars)
        plain = np.asarray(array).view(np.ndarray)
        return plain[()] if return_scalar else plain

    @staticmethod
    def ortvalue_from_numpy(array, device_type: str = "cpu", device_id: int = 0) -> OrtValue:
        if device_type.lower() != "cpu":
            raise ValueError(f"edgetrain runs on the cpu only, not on {device_type!r}")
        return np.array(array, copy=True).view(OrtValue)

    def numpy(self) -> np.ndarray:
        """The values as a plain ndarray sharing this value's memory, as ORT's ``numpy()`` does on the cpu."""
        return self.view(np.ndarray)

    def data_type(self) -> str:
        return f"tensor({_ELEMENT_NAMES.get(self.dtype, self.dtype.name)})"

    def element_type(self) -> type:
        return self.dtype.type

    def device_name(self) -> str:
        return "Cpu"        # ORT's spelling

    def has_value(self) -> bool:
        return True

    def is_tensor(self) -> bool:
        return True

    def is_sparse_tensor(self) -> bool:
        return False

    def update_inplace(self, array) -> None:
        """Copy ``array`` (same number of elements) into this value."""
        np.copyto(self.numpy(), np.asarray(array).reshape(self.numpy().shape))


def as_array(value) -> np.ndarray:
    """A plain ndarray from a numpy array, one of these values or anything else with ``.numpy()`` (ORT's
    ``OrtValue``), without copying where none is needed."""
    if isinstance(value, np.ndarray):
        return value.view(np.ndarray) if type(value) is not np.ndarray else value
    numpy = getattr(value, "numpy", None)
    return np.asarray(numpy() if callable(numpy) else value)
