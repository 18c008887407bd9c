"""ONNX TensorProto element types <-> numpy dtypes (the numbering ORT's checkpoint also uses)."""
import numpy as np

from ..errors import UnsupportedOpError

ONNX_TO_NUMPY = {
    1: np.dtype(np.float32),
    2: np.dtype(np.uint8),
    3: np.dtype(np.int8),
    4: np.dtype(np.uint16),
    5: np.dtype(np.int16),
    6: np.dtype(np.int32),
    7: np.dtype(np.int64),
    9: np.dtype(np.bool_),
    10: np.dtype(np.float16),
    11: np.dtype(np.float64),
    12: np.dtype(np.uint32),
    13: np.dtype(np.uint64),
}
NUMPY_TO_ONNX = {v: k for k, v in ONNX_TO_NUMPY.items()}

# onnxruntime's spelling of types in NodeArg.type and in reduced-build configs
ORT_TYPE_NAME = {
    np.dtype(np.float32): "float", np.dtype(np.float64): "double", np.dtype(np.float16): "float16",
    np.dtype(np.int8): "int8", np.dtype(np.int16): "int16", np.dtype(np.int32): "int32",
    np.dtype(np.int64): "int64", np.dtype(np.uint8): "uint8", np.dtype(np.uint16): "uint16",
    np.dtype(np.uint32): "uint32", np.dtype(np.uint64): "uint64", np.dtype(np.bool_): "bool",
}

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
INTS = (np.dtype(np.int32), np.dtype(np.int64))

# Element types stored as themselves at a graph's edges but held in a wider carrier type inside a plan (Numba has
# no float16 arithmetic on CPU; plan/widen.py). An op that computes in float32 takes float16 (``ARITHMETIC``);
# bfloat16's 8-bit significand makes float32 arithmetic differ from a bfloat16 computation by more than ONNX's
# tolerances, so only ops that move or convert values take it (those declaring ``ops.base.ANY``).
CARRIED = {np.dtype(np.float16): np.dtype(np.float32)}
ARITHMETIC = {np.dtype(np.float16): np.dtype(np.float32)}

try:        # onnx's own dependency; without it these element types stay unsupported
    import ml_dtypes
except ImportError:     # pragma: no cover - installed with onnx
    ml_dtypes = None

# ONNX element types numpy lacks, as ml_dtypes names them, and onnxruntime's spelling: carried in float32 (which
# holds each of their values exactly) and taken by Cast and the ops that only move values (``MOVED_ONLY``)
EXTENDED = {16: ("bfloat16", "bfloat16"), 17: ("float8_e4m3fn", "float8e4m3fn"),
            18: ("float8_e4m3fnuz", "float8e4m3fnuz"), 19: ("float8_e5m2", "float8e5m2"),
            20: ("float8_e5m2fnuz", "float8e5m2fnuz"), 21: ("uint4", "uint4"), 22: ("int4", "int4"),
            23: ("float4_e2m1fn", "float4e2m1"), 25: ("uint2", "uint2"), 26: ("int2", "int2")}
SATURATING = (17, 18, 19, 20)     # float8: a Cast with saturate=1 clips to the finite range before rounding
MOVED_ONLY: tuple[np.dtype, ...] = ()
if ml_dtypes is not None:
    for _code, (_name, _ort_name) in EXTENDED.items():
        _dtype = np.dtype(getattr(ml_dtypes, _name))
        ONNX_TO_NUMPY[_code] = _dtype
        NUMPY_TO_ONNX[_dtype] = _code
        ORT_TYPE_NAME[_dtype] = _ort_name
        CARRIED[_dtype] = np.dtype(np.float32)
        MOVED_ONLY += (_dtype,)


def computed_as(dtype) -> np.dtype:
    """The type an arithmetic op computes ``dtype`` in (float16: float32), for rules that check "a float"."""
    dtype = np.dtype(dtype)
    return ARITHMETIC.get(dtype, dtype)


def carrier(dtype) -> np.dtype:
    """The element type kernels compute ``dtype`` in (itself unless it is carried)."""
    dtype = np.dtype(dtype)
    return CARRIED.get(dtype, dtype)


def to_numpy(onnx_type: int, where: str) -> np.dtype:
    """numpy dtype of ONNX element type ``onnx_type``; ``where`` names the tensor for the error."""
    try:
        return ONNX_TO_NUMPY[onnx_type]
    except KeyError:
        raise UnsupportedOpError(
            f"{where}: ONNX element type {onnx_type} is not supported; supported: "
            + ", ".join(ORT_TYPE_NAME[d] for d in ONNX_TO_NUMPY.values())) from None


def to_onnx(dtype) -> int:
    return NUMPY_TO_ONNX[np.dtype(dtype)]
