"""Checkpoint bytes -> ``Checkpoint``: decode an ORT 1.19 ``ODTC`` flatbuffer through checked accessors."""
from __future__ import annotations

import struct

import numpy as np

from . import schema as S
from .state import Checkpoint, CheckpointError, OptimizerGroup
from .verify import Buffer, Table


def decode(data, source: str = "<bytes>") -> Checkpoint:
    """Decode checkpoint bytes; ``data`` must be writable (a bytearray) for the arrays to be writable views.

    Raises ``CheckpointError`` naming ``source`` and what is wrong.
    """
    buf = Buffer(data)
    try:
        return _checkpoint(buf)
    except CheckpointError as e:
        raise CheckpointError(f"checkpoint {source}: {e}") from None
    except (struct.error, ValueError, IndexError, OverflowError, MemoryError) as e:
        # A safety net: every check above should have caught this first (the fuzz tests look for this text).
        raise CheckpointError(f"checkpoint {source}: malformed (a check was missed: "
                              f"{type(e).__name__}: {e})") from e


def _checkpoint(buf: Buffer) -> Checkpoint:
    if buf.size >= 8 and bytes(buf.data[4:8]) != S.FILE_IDENTIFIER:
        ident = bytes(buf.data[4:8])
        hint = " (an ORT-format model, not a checkpoint)" if ident == b"ORTM" else ""
        raise CheckpointError(f"not an ORT training checkpoint: file identifier {ident!r}{hint}, expected "
                              f"{S.FILE_IDENTIFIER!r}")
    root = buf.root("Checkpoint table")
    version = root.scalar(S.Checkpoint.version, "i32", 0)
    if version != S.VERSION:
        raise CheckpointError(f"checkpoint version {version} is not supported; edgetrain reads version "
                              f"{S.VERSION} (written by ONNX Runtime 1.19 and edgetrain)")
    ckpt = Checkpoint()
    names: set[str] = set()
    module = root.table(S.Checkpoint.module_state, "ModuleState")
    if module is not None:
        ckpt.is_nominal = module.scalar(S.ModuleState.is_nominal_state, "b", False)
        if module.scalar(S.ModuleState.has_external_data, "b", False):
            raise CheckpointError("its tensor data live in an external data file (has_external_data), which "
                                  "edgetrain does not support; save the checkpoint with its data inline")
        for fid, into, kind in ((S.ModuleState.requires_grad_params, ckpt.trainable, "trainable parameter"),
                                (S.ModuleState.frozen_params, ckpt.frozen, "frozen parameter")):
            for t in module.tables(fid, kind):
                name, value = _tensor(buf, t, kind, ckpt.is_nominal)
                if name in names:
                    raise CheckpointError(f"parameter '{name}' appears twice")
                names.add(name)
                into[name] = value
    for g in root.tables(S.Checkpoint.optimizer_groups, "optimizer group"):
        ckpt.optimizer_groups.append(_group(buf, g))
    bag = root.table(S.Checkpoint.property_bag, "PropertyBag")
    if bag is not None:
        _properties(bag, ckpt.properties)
    return ckpt


def _group(buf: Buffer, g: Table) -> OptimizerGroup:
    name = g.string(S.OptimizerGroup.group_name, f"name of {g.what}") or ""
    group = OptimizerGroup(name=name, step=g.scalar(S.OptimizerGroup.step, "i64", 0),
                           initial_learning_rate=g.scalar(S.OptimizerGroup.initial_learning_rate, "f32", 0.0))
    where = f"optimizer group '{name}'"
    for s in g.tables(S.OptimizerGroup.optimizer_states, f"parameter state of {where}"):
        param = s.string(S.ParameterOptimizerState.param_name, f"parameter name of {s.what}")
        if param is None:
            raise CheckpointError(f"{s.what} has no parameter name")
        if param in group.states:
            raise CheckpointError(f"{where} holds two states for parameter '{param}'")
        moments = group.states[param] = {}
        for t in s.tables(S.ParameterOptimizerState.momentums, f"moment of '{param}' in {where}"):
            mname, value = _tensor(buf, t, f"moment of '{param}' in {where}", False)
            if mname in moments:
                raise CheckpointError(f"{where}: parameter '{param}' has two moments named '{mname}'")
            moments[mname] = value
    return group


def _properties(bag: Table, into: dict) -> None:
    for fid, kind, read in ((S.PropertyBag.ints, "int property",
                             lambda t: t.scalar(S.Property.value, "i64", 0)),
                            (S.PropertyBag.floats, "float property",
                             lambda t: t.scalar(S.Property.value, "f32", 0.0)),
                            (S.PropertyBag.strings, "string property",
                             lambda t: t.string(S.Property.value, f"value of {t.what}") or "")):
        for t in bag.tables(fid, kind):
            name = t.string(S.Property.name, f"name of {t.what}")
            if name is None:
                raise CheckpointError(f"{t.what} has no name")
            if name in into:
                raise CheckpointError(f"property '{name}' appears twice")
            into[name] = read(t)


def _tensor(buf: Buffer, t: Table, kind: str, nominal: bool) -> tuple[str, np.ndarray]:
    name = t.string(S.Tensor.name, f"name of {t.what}")
    if name is None:
        raise CheckpointError(f"{t.what} has no name")
    where = f"{kind} '{name}'"
    t.string(S.Tensor.doc_string, f"doc_string of {where}")
    data_type = t.scalar(S.Tensor.data_type, "i32", 0)
    if data_type not in S.DTYPES:
        raise CheckpointError(f"{where}: element type {S.type_name(data_type)} is not supported; supported: "
                              f"{S.supported_types()}")
    dtype = S.DTYPES[data_type]
    if t.scalar(S.Tensor.external_data_offset, "i64", S.Tensor.EXTERNAL_DATA_OFFSET_DEFAULT) != -1:
        raise CheckpointError(f"{where}: its data live in an external data file, which edgetrain does not "
                              "support")
    dims_v = t.vector(S.Tensor.dims, 8, f"dims of {where}")
    ndim = 0 if dims_v is None else dims_v[1]
    if ndim > S.MAX_NDIM:
        raise CheckpointError(f"{where}: {ndim} dimensions (at most {S.MAX_NDIM} are supported)")
    buf.charge(8 * ndim, f"dims of {where}")
    dims = () if dims_v is None else struct.unpack_from(f"<{ndim}q", buf.data, dims_v[0])
    if any(d < 0 for d in dims):
        raise CheckpointError(f"{where}: negative dimension in dims {dims}")
    raw = t.vector(S.Tensor.raw_data, 1, f"raw_data of {where}")
    start, nbytes = raw if raw is not None else (0, 0)
    if nominal and not dims and nbytes == 0:
        return name, np.empty((0,), dtype)
    need = dtype.itemsize
    for d in dims:
        need *= d
    if need != nbytes:
        raise CheckpointError(f"{where}: dims {dims} of {S.TYPE_NAMES[data_type]} need {need} bytes, "
                              f"raw_data holds {nbytes}")
    count = nbytes // dtype.itemsize
    arr = np.frombuffer(buf.data, dtype=dtype.newbyteorder("<"), count=count, offset=start) if count else \
        np.empty((0,), dtype)
    if not arr.flags.aligned or arr.dtype != dtype or not arr.flags.writeable:
        buf.charge(nbytes, f"data of {where}")
        arr = arr.astype(dtype)          # a copy: unaligned data, a big-endian host or read-only input
    return name, arr.reshape(dims)
