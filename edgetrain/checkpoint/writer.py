"""``Checkpoint`` -> ORT 1.19 ``ODTC`` flatbuffer bytes, laid out as ORT 1.19.2 writes them.

Tensors carry name, dims, data_type and raw_data; default-valued scalars are left out; a nominal checkpoint
keeps names and types with empty dims and raw_data; float properties and the initial learning rate are
float32.
The builder calls match ORT's (C++ flatbuffers), so for the same content the bytes of an offline or nominal
checkpoint are identical to ORT's: tensor data sit 4-aligned behind their length, as in ORT's files (float32
reads need no copy), and empty vectors get no extra alignment. (Checkpoints ORT saves from a live session
build some objects in another order; the content is the same.)
"""
from __future__ import annotations

import math

import flatbuffers
import numpy as np

from . import schema as S
from .state import Checkpoint, CheckpointError


def encode(ckpt: Checkpoint) -> memoryview:
    """The checkpoint's bytes, as a view of the builder's buffer (no final copy)."""
    _check(ckpt)
    b = flatbuffers.Builder(_estimate(ckpt))
    try:
        root = _checkpoint(b, ckpt)
        b.Finish(root, file_identifier=S.FILE_IDENTIFIER)
    except flatbuffers.builder.BuilderSizeError:
        raise CheckpointError(f"the checkpoint holds {ckpt.nbytes()} bytes of tensors; a flatbuffer is "
                              "limited to 2 GiB and edgetrain does not write external data files") from None
    return memoryview(b.Bytes)[b.Head():]


def _estimate(ckpt: Checkpoint) -> int:
    """Builder size to start with, so the buffer rarely has to grow (each growth copies it)."""
    tensors = len(ckpt.trainable) + len(ckpt.frozen) + sum(len(m) for g in ckpt.optimizer_groups
                                                          for m in g.states.values())
    data = 0 if ckpt.is_nominal else ckpt.nbytes()
    names = sum(len(k) for k in ckpt.parameters) * (1 + 2 * len(ckpt.optimizer_groups))
    props = sum(len(k) + (len(v) if isinstance(v, str) else 0) + 32 for k, v in ckpt.properties.items())
    return min(data + tensors * (8 * S.MAX_NDIM + 96) + 4 * names + props + 1024, 2 ** 31 - 1)


def _check(ckpt: Checkpoint) -> None:
    """Reject what the format cannot hold before writing a byte."""
    seen: set[str] = set()
    for kind, params in (("trainable parameter", ckpt.trainable), ("frozen parameter", ckpt.frozen)):
        for name, value in params.items():
            _check_tensor(name, value, kind)
            if name in seen:
                raise CheckpointError(f"parameter '{name}' is both trainable and frozen")
            seen.add(name)
    for g in ckpt.optimizer_groups:
        if not isinstance(g.name, str):
            raise CheckpointError(f"optimizer group name {g.name!r} is not a str")
        _check_int(g.step, f"step of optimizer group '{g.name}'")
        _check_float(g.initial_learning_rate, f"initial learning rate of optimizer group '{g.name}'")
        for param, moments in g.states.items():
            if not isinstance(param, str):
                raise CheckpointError(f"optimizer group '{g.name}': parameter name {param!r} is not a str")
            for mname, value in moments.items():
                _check_tensor(mname, value, f"moment of '{param}' in optimizer group '{g.name}'")
    for name, value in ckpt.properties.items():
        if not isinstance(name, str):
            raise CheckpointError(f"property name {name!r} is not a str")
        if isinstance(value, (bool, int, np.integer)):
            _check_int(value, f"property '{name}'")
        elif isinstance(value, (float, np.floating)):
            _check_float(value, f"property '{name}'")
        elif not isinstance(value, str):
            raise CheckpointError(f"property '{name}' is {type(value).__name__}; a property is an int, float "
                                  "or str")


def _check_tensor(name, value, kind: str) -> None:
    if not isinstance(name, str):
        raise CheckpointError(f"{kind} name {name!r} is not a str")
    if not isinstance(value, np.ndarray):
        raise CheckpointError(f"{kind} '{name}' is {type(value).__name__}, not a numpy array")
    if _native(value.dtype) not in S.TYPE_OF:
        raise CheckpointError(f"{kind} '{name}' has dtype {value.dtype}; supported: "
                              + ", ".join(str(d) for d in S.TYPE_OF))
    if value.ndim > S.MAX_NDIM:
        raise CheckpointError(f"{kind} '{name}' has {value.ndim} dimensions (at most {S.MAX_NDIM})")


def _native(dtype: np.dtype) -> np.dtype:
    return dtype.newbyteorder("=")          # a big-endian array is stored little-endian, like any other


def _check_int(value, what: str) -> None:
    if not isinstance(value, (bool, int, np.integer)) or not S.INT64_MIN <= int(value) <= S.INT64_MAX:
        raise CheckpointError(f"{what} is {value!r}; it must be an int64")


def _check_float(value, what: str) -> None:
    if not isinstance(value, (float, int, np.floating, np.integer)) or isinstance(value, bool):
        raise CheckpointError(f"{what} is {value!r}; it must be a float")
    if math.isfinite(float(value)) and abs(float(value)) > float(np.finfo(np.float32).max):
        raise CheckpointError(f"{what} is {value!r}, beyond float32's range (the file stores float32)")


def _checkpoint(b: flatbuffers.Builder, ckpt: Checkpoint) -> int:
    trainable = [_tensor(b, k, v, ckpt.is_nominal) for k, v in ckpt.trainable.items()]
    frozen = [_tensor(b, k, v, ckpt.is_nominal) for k, v in ckpt.frozen.items()]
    trainable_v, frozen_v = _offsets(b, trainable), _offsets(b, frozen)
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(S.ModuleState.requires_grad_params, trainable_v, 0)
    b.PrependUOffsetTRelativeSlot(S.ModuleState.frozen_params, frozen_v, 0)
    b.PrependBoolSlot(S.ModuleState.is_nominal_state, bool(ckpt.is_nominal), False)
    module = b.EndObject()

    groups = _offsets(b, [_group(b, g) for g in ckpt.optimizer_groups]) if ckpt.optimizer_groups else None
    bag = _properties(b, ckpt.properties) if ckpt.properties else None

    b.StartObject(4)
    b.PrependInt32Slot(S.Checkpoint.version, S.VERSION, 0)
    b.PrependUOffsetTRelativeSlot(S.Checkpoint.module_state, module, 0)
    if groups is not None:
        b.PrependUOffsetTRelativeSlot(S.Checkpoint.optimizer_groups, groups, 0)
    if bag is not None:
        b.PrependUOffsetTRelativeSlot(S.Checkpoint.property_bag, bag, 0)
    return b.EndObject()


def _group(b: flatbuffers.Builder, g) -> int:
    states = []
    for param, moments in g.states.items():
        pname = b.CreateString(param)
        mvec = _offsets(b, [_tensor(b, k, v, False) for k, v in moments.items()])
        b.StartObject(2)
        b.PrependUOffsetTRelativeSlot(S.ParameterOptimizerState.param_name, pname, 0)
        b.PrependUOffsetTRelativeSlot(S.ParameterOptimizerState.momentums, mvec, 0)
        states.append(b.EndObject())
    states_v = _offsets(b, states)
    name = b.CreateString(g.name)
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(S.OptimizerGroup.group_name, name, 0)
    b.PrependInt64Slot(S.OptimizerGroup.step, int(g.step), 0)
    b.PrependFloat32Slot(S.OptimizerGroup.initial_learning_rate, _f32(g.initial_learning_rate), 0.0)
    b.PrependUOffsetTRelativeSlot(S.OptimizerGroup.optimizer_states, states_v, 0)
    return b.EndObject()


def _properties(b: flatbuffers.Builder, props: dict) -> int:
    ints, floats, strings = [], [], []
    for name, value in props.items():
        n = b.CreateString(name)
        if isinstance(value, str):
            v = b.CreateString(value)
            b.StartObject(2)
            b.PrependUOffsetTRelativeSlot(S.Property.value, v, 0)
            into = strings
        elif isinstance(value, (bool, int, np.integer)):
            b.StartObject(2)
            b.PrependInt64Slot(S.Property.value, int(value), 0)
            into = ints
        else:
            b.StartObject(2)
            b.PrependFloat32Slot(S.Property.value, _f32(value), 0.0)
            into = floats
        b.PrependUOffsetTRelativeSlot(S.Property.name, n, 0)
        into.append(b.EndObject())
    # ORT writes all three vectors, empty ones too
    vecs = [(fid, _offsets(b, items)) for fid, items in
            ((S.PropertyBag.ints, ints), (S.PropertyBag.floats, floats), (S.PropertyBag.strings, strings))]
    b.StartObject(3)
    for fid, v in vecs:
        b.PrependUOffsetTRelativeSlot(fid, v, 0)
    return b.EndObject()


def _f32(x) -> float:
    """``x`` rounded to float32, the width the file keeps (``_check`` rejected values beyond its range)."""
    return float(np.float32(float(x)))


def _tensor(b: flatbuffers.Builder, name: str, value: np.ndarray, nominal: bool) -> int:
    name_off = b.CreateString(name)
    dims = () if nominal else value.shape
    if dims:
        b.StartVector(8, len(dims), 8)
        for d in reversed(dims):
            b.PrependInt64(d)
        dims_off = b.EndVector()
    else:
        dims_off = _empty_vector(b)
    raw_off = _raw(b, None if nominal else value)
    b.StartObject(7)
    b.PrependUOffsetTRelativeSlot(S.Tensor.name, name_off, 0)
    b.PrependUOffsetTRelativeSlot(S.Tensor.dims, dims_off, 0)
    b.PrependInt32Slot(S.Tensor.data_type, S.TYPE_OF[_native(value.dtype)], 0)
    b.PrependUOffsetTRelativeSlot(S.Tensor.raw_data, raw_off, 0)
    return b.EndObject()


def _empty_vector(b: flatbuffers.Builder) -> int:
    """A vector of length 0, aligned only for its length (C++ flatbuffers skips the element alignment)."""
    b.StartVector(1, 0, 1)
    return b.EndVector()


def _raw(b: flatbuffers.Builder, value: np.ndarray | None) -> int:
    """A [uint8] vector of ``value``'s bytes (little-endian, C order), copied straight into the builder."""
    if value is None or value.size == 0:
        return _empty_vector(b)
    src = np.ascontiguousarray(value, dtype=value.dtype.newbyteorder("<")).reshape(-1).view(np.uint8)
    n = src.size
    b.StartVector(1, n, 1)
    b.head = b.Head() - n
    b.Bytes[b.head:b.head + n] = memoryview(src)
    b.vectorNumElems = n
    return b.EndVector()


def _offsets(b: flatbuffers.Builder, items: list[int]) -> int:
    """A vector of offsets to already-built tables."""
    if not items:
        return _empty_vector(b)
    b.StartVector(4, len(items), 4)
    for off in reversed(items):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()
