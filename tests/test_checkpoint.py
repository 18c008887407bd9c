"""edgetrain.checkpoint: ORT 1.19's ODTC flatbuffer, read defensively, written atomically and byte-compatibly.

Oracles: the training models ORT generated beside its checkpoints (names, shapes, types), ORT 1.19.2 itself in
its own venv (tests/ort119.py: CheckpointState and ORT's generated flatbuffer modules), and the schema file.
"""
from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
import time
import tracemalloc

import flatbuffers
import numpy as np
import onnx
import pytest

import edgetrain.checkpoint as C
from edgetrain.checkpoint import files, reader
from edgetrain.checkpoint import schema as S
from edgetrain.checkpoint.verify import Buffer
from edgetrain.errors import EdgetrainError

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")

ORT_MODELS = ["cnn", "digits", "mlp", "mlp_sgd", "mobilenet", "transformer"]
ORT_ELEM = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
            9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}


def f32(x: float) -> float:
    return float(np.float32(x))


def sample(nominal: bool = False) -> C.Checkpoint:
    """Every kind of content: dtypes, a 0-d and an empty tensor, optimizer moments, each property type."""
    rng = np.random.default_rng(0)
    trainable = {"fc1.weight": rng.standard_normal((4, 3)).astype(np.float32),
                 "fc1.bias": rng.standard_normal(4).astype(np.float32),
                 "emb.half": rng.standard_normal((2, 5)).astype(np.float16),
                 "w.double": rng.standard_normal((3, 2)),
                 "z.last_but_sorted_first": np.float32([1.5, -2.5])}
    frozen = {"bn.running_mean": rng.standard_normal(3).astype(np.float32),
              "bn.num_batches": np.array(7, np.int64),
              "mask": rng.integers(0, 2, (2, 3)).astype(np.bool_),
              "codes": np.arange(5, dtype=np.uint8),
              "ids": np.array([-3, 4], np.int32),
              "empty": np.zeros((0, 4), np.float32)}
    states = {k: {"momentum0": rng.standard_normal(v.shape).astype(v.dtype),
                  "momentum1": np.abs(rng.standard_normal(v.shape)).astype(v.dtype)}
              for k, v in trainable.items()}
    groups = [C.OptimizerGroup("group0", step=5, initial_learning_rate=1e-3, states=states)]
    props = {"epoch": 3, "big": 2 ** 63 - 1, "neg": -(2 ** 63), "best_loss": 0.25, "lr": 0.1,
             "tag": "h\u00e9llo \u2713", "blank": ""}
    return C.Checkpoint(trainable, frozen, [] if nominal else groups, {} if nominal else props, nominal)


def assert_same(a: C.Checkpoint, b: C.Checkpoint) -> None:
    """Identical content: names in order, dtypes, shapes and bytes; properties with their types."""
    def arrays(x, y, where):
        assert list(x) == list(y), where
        for k in x:
            assert x[k].dtype == y[k].dtype and x[k].shape == y[k].shape, f"{where} '{k}'"
            assert x[k].tobytes() == y[k].tobytes(), f"{where} '{k}'"

    assert a.is_nominal == b.is_nominal
    arrays(a.trainable, b.trainable, "trainable")
    arrays(a.frozen, b.frozen, "frozen")
    assert len(a.optimizer_groups) == len(b.optimizer_groups)
    for g, h in zip(a.optimizer_groups, b.optimizer_groups, strict=True):
        assert (g.name, g.step) == (h.name, h.step)
        assert f32(g.initial_learning_rate) == f32(h.initial_learning_rate)
        assert list(g.states) == list(h.states)
        for p in g.states:
            arrays(g.states[p], h.states[p], f"moments of {p}")
    assert list(a.properties) == list(b.properties)
    for k, v in a.properties.items():
        w = b.properties[k]
        assert type(v) is type(w) and (f32(v) == f32(w) if isinstance(v, float) else v == w), k


def expected_after_round_trip(c: C.Checkpoint) -> C.Checkpoint:
    """What reading back gives: floats narrowed to float32, ints grouped before floats before strings."""
    props = {k: v for k, v in c.properties.items() if isinstance(v, int)}
    props |= {k: f32(v) for k, v in c.properties.items() if isinstance(v, float)}
    props |= {k: v for k, v in c.properties.items() if isinstance(v, str)}
    return C.Checkpoint(c.trainable, c.frozen, c.optimizer_groups, props, c.is_nominal)


def present_fields(data) -> dict:
    """Which vtable slots are filled in each table kind (the layout ORT writes)."""
    buf = Buffer(data)
    root = buf.root("root")

    def fields(t, n):
        return tuple(f for f in range(n) if t._field(f, 1) is not None)

    out = {"Checkpoint": fields(root, 4)}
    ms = root.table(S.Checkpoint.module_state, "ms")
    out["ModuleState"] = fields(ms, 4)
    tensors = [*ms.tables(0, "t"), *ms.tables(1, "t")]
    out["Tensor"] = {fields(t, 7) for t in tensors}
    if root._field(S.Checkpoint.property_bag, 4) is not None:
        out["PropertyBag"] = fields(root.table(S.Checkpoint.property_bag, "bag"), 3)
    return out


def structure_positions(data) -> dict:
    """Positions of fields, for patching: {name: absolute position}."""
    buf = Buffer(data)
    root = buf.root("root")
    ms = root.table(S.Checkpoint.module_state, "ms")
    t0 = next(ms.tables(0, "t"))
    dims_start, _ = t0.vector(S.Tensor.dims, 8, "dims")
    return {"version": root._field(S.Checkpoint.version, 4), "root_table": root.pos, "tensor0": t0.pos,
            "dims0": dims_start, "dims0_len": dims_start - 4, "raw0_len": t0.offset(S.Tensor.raw_data, "raw"),
            "name0": t0.offset(S.Tensor.name, "name")}


def structure_bytes(data: bytes) -> np.ndarray:
    """Positions of the bytes that are not tensor data (tables, vtables, offsets, names, dims)."""
    buf = bytearray(data)
    base = np.frombuffer(buf, np.uint8).ctypes.data
    c = C.loads(buf)
    is_data = np.zeros(len(buf), bool)
    arrays = list(c.parameters.values()) + [m for g in c.optimizer_groups for s in g.states.values()
                                            for m in s.values()]
    for a in arrays:
        if a.size:
            start = a.ctypes.data - base
            is_data[start:start + a.nbytes] = True
    return np.flatnonzero(~is_data)


def load_or_error(data: bytes):
    """The checkpoint, or None after a CheckpointError; any other exception fails the test."""
    try:
        return C.loads(data)
    except C.CheckpointError as e:
        assert "check was missed" not in str(e), str(e)
        return None


def peak_alloc(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


# ------------------------------------------------------------------------------------ schema, ORT files

def test_schema_file_matches_field_numbers():
    text = C.SCHEMA_PATH.read_text()
    tables = dict(re.findall(r"table (\w+) \{(.*?)\}", text, re.DOTALL))
    assert set(tables) == set(S.TABLES)
    for name, body in tables.items():
        fields = re.findall(r"^\s*(\w+)\s*:", body, re.MULTILINE)
        assert [getattr(S.TABLES[name], f) for f in fields] == list(range(len(fields))), name
    assert re.search(r"external_data_offset:int64 = -1;", text)
    assert 'file_identifier "ODTC"' in text and "root_type Checkpoint;" in text
    enum = {int(v): k for k, v in re.findall(r"(\w+) = (\d+)", text.split("enum TensorDataType")[1])}
    assert enum == S.TYPE_NAMES


@pytest.mark.parametrize("name", ORT_MODELS)
def test_reads_ort_checkpoints_as_the_training_model_declares(shared, name):
    folder = shared / "ort_artifacts" / name
    ckpt = C.load(folder / "checkpoint")
    graph = onnx.load(str(folder / "training_model.onnx")).graph
    inputs = {i.name: i for i in graph.input}
    suffix = "_grad.accumulation.buffer"
    with_grad = [n[:-len(suffix)] for n in inputs if n.endswith(suffix)]
    assert list(ckpt.trainable) == with_grad      # ORT keeps the initializer order offline
    assert not ckpt.is_nominal and ckpt.optimizer_groups == [] and ckpt.properties == {}
    for pname, value in ckpt.parameters.items():
        t = inputs[pname].type.tensor_type
        assert value.shape == tuple(d.dim_value for d in t.shape.dim), pname
        assert value.dtype == ORT_ELEM[t.elem_type], pname
        assert value.flags.writeable and np.isfinite(value).all()
    for pname in ckpt.frozen:
        assert pname + "_grad.accumulation.buffer" not in inputs
    if name == "mobilenet":
        assert list(ckpt.frozen) == ["bn1.running_mean", "bn1.running_var", "bn2.running_mean",
                                     "bn2.running_var"]
        assert (ckpt.frozen["bn1.running_var"] > 0).all()


@pytest.mark.parametrize("name", ORT_MODELS)
def test_rewriting_an_ort_checkpoint_gives_the_same_bytes(shared, name):
    original = bytes(files.read(shared / "ort_artifacts" / name / "checkpoint"))
    ours = C.dumps(C.loads(original))
    assert ours == original                             # the same builder calls as ORT: the same bytes


def test_ort_checkpoint_data_are_views_not_copies(shared):
    data = files.read(shared / "ort_artifacts" / "mlp" / "checkpoint")
    peak = peak_alloc(lambda: C.loads(data))
    assert peak < 64 * 1024, peak                       # 0.9 MB of float32 data, 4-aligned: all views


def test_file_read_fills_every_byte_or_refuses(tmp_path, monkeypatch):
    """The file is read into uninitialized memory (no zero pass): every byte comes from the file, and a file
    shorter than fstat said (it shrank while being read) is refused, so no uninitialized byte is decoded."""
    c = sample()
    C.save(c, tmp_path / "ckpt")
    data = files.read(tmp_path / "ckpt")
    assert bytes(data) == (tmp_path / "ckpt").read_bytes()
    assert_same(C.loads(data), expected_after_round_trip(c))
    assert not data.readonly and all(a.flags.writeable for a in C.loads(data).trainable.values())
    import edgetrain.reading as reading
    real = os.fstat
    monkeypatch.setattr(reading.os, "fstat", lambda fd: os.stat_result((*real(fd)[:6], real(fd).st_size + 8,
                                                                      *real(fd)[7:])))
    with pytest.raises(C.CheckpointError, match="shrank while being read"):
        C.load(tmp_path / "ckpt")


# ---------------------------------------------------------------------------------------------- round trips

def test_round_trip_keeps_everything(tmp_path):
    c = sample()
    C.save(c, tmp_path / "ckpt")
    back = C.load(tmp_path / "ckpt")
    assert_same(back, expected_after_round_trip(c))
    assert back.properties["lr"] == f32(0.1) != 0.1     # float properties are float32 in the file
    assert type(back.properties["epoch"]) is int and type(back.properties["lr"]) is float
    assert back.optimizer_groups[0].initial_learning_rate == f32(1e-3)
    assert all(a.flags.writeable for a in back.parameters.values())
    back.trainable["fc1.weight"][0, 0] = 42.0           # writable in place
    assert C.dumps(back) != C.dumps(C.load(tmp_path / "ckpt"))


def test_round_trip_of_bytes_and_of_a_writable_buffer():
    c = sample()
    data = C.dumps(c)
    assert data[4:8] == b"ODTC"
    for form in (data, bytearray(data), memoryview(bytearray(data))):
        assert_same(C.loads(form), expected_after_round_trip(c))


def test_float32_data_are_read_in_place():
    data = bytearray(C.dumps(sample()))
    base = np.frombuffer(data, np.uint8).ctypes.data
    back = C.loads(data)
    for a in back.parameters.values():
        inside = base <= a.ctypes.data < base + len(data)
        if a.dtype.itemsize <= 4 and a.size:            # raw_data is 4-aligned, as in ORT's files
            assert inside
        elif a.dtype.itemsize == 8 and (a.ctypes.data - base) % 8:
            assert not inside and a.flags.aligned       # an unaligned float64/int64 is copied


def test_nominal_checkpoint_keeps_names_and_types_only():
    c = sample(nominal=True)
    data = C.dumps(c)
    back = C.loads(data)
    assert back.is_nominal
    assert list(back.trainable) == list(c.trainable) and list(back.frozen) == list(c.frozen)
    for k, v in c.parameters.items():
        assert back.parameters[k].dtype == v.dtype and back.parameters[k].shape == (0,)
    assert len(data) < 1024
    assert present_fields(data)["Tensor"] == {(0, 2, 3, 4)}     # dims and raw_data present but empty, as ORT


def test_layout_mirrors_ort():
    fields = present_fields(C.dumps(sample()))
    assert fields["Checkpoint"] == (0, 1, 2, 3)
    assert fields["ModuleState"] == (0, 1)              # is_nominal_state false: omitted
    assert fields["Tensor"] == {(0, 2, 3, 4)}           # no doc_string, string_data, external_data_offset
    assert fields["PropertyBag"] == (0, 1, 2)
    offline = present_fields(C.dumps(C.Checkpoint({"w": np.ones(2, np.float32)})))
    assert offline["Checkpoint"] == (0, 1) and offline["ModuleState"] == (0, 1)


@pytest.mark.parametrize("bad, message", [
    (lambda c: c.trainable.__setitem__("c", np.zeros(2, np.complex64)), "dtype complex64"),
    (lambda c: c.trainable.__setitem__("s", np.array(["a"])), "dtype <U1"),
    (lambda c: c.frozen.__setitem__("l", [1.0, 2.0]), "'l' is list, not a numpy array"),
    (lambda c: c.frozen.__setitem__("fc1.weight", np.zeros(1, np.float32)), "both trainable and frozen"),
    (lambda c: c.properties.__setitem__("p", [1]), "property 'p' is list"),
    (lambda c: c.properties.__setitem__("p", 2 ** 63), "must be an int64"),
    (lambda c: c.properties.__setitem__("p", 1e39), "beyond float32's range"),
    (lambda c: c.properties.__setitem__(3, "x"), "property name 3"),
    (lambda c: setattr(c.optimizer_groups[0], "step", 1.5), "step of optimizer group 'group0'"),
    (lambda c: setattr(c.optimizer_groups[0], "initial_learning_rate", "0.1"), "initial learning rate"),
])
def test_unwritable_content_is_rejected_before_writing(tmp_path, bad, message):
    c = sample()
    bad(c)
    with pytest.raises(C.CheckpointError, match=re.escape(message)):
        C.save(c, tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


def test_big_endian_arrays_are_stored_little_endian():
    c = C.Checkpoint({"w": np.arange(6, dtype=">f4").reshape(2, 3)})
    back = C.loads(C.dumps(c))
    assert back.trainable["w"].dtype == np.float32 and back.trainable["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert C.dumps(c) == C.dumps(C.Checkpoint({"w": np.arange(6, dtype="<f4").reshape(2, 3)}))


def test_property_values_of_numpy_and_bool_types():
    c = C.Checkpoint(properties={"i": np.int32(-4), "f": np.float64(0.5), "b": True})
    assert C.loads(C.dumps(c)).properties == {"i": -4, "b": 1, "f": 0.5}


# ---------------------------------------------------------------------------------------------- corrupt files

def raw_checkpoint(version=2, has_external=False, name=b"w", data_type=1, dims=(2,), raw=b"\0" * 8,
                   external_offset=None, doc_strings=0, extra_module=None) -> bytes:
    """A hand-built checkpoint with one trainable tensor, for fields edgetrain's writer never emits."""
    b = flatbuffers.Builder(1024)
    doc = b.CreateString("d" * 4096) if doc_strings else None
    tensors = []
    for i in range(max(1, doc_strings)):
        raw_v = b.CreateByteVector(raw)
        b.StartVector(8, len(dims), 8)
        for d in reversed(dims):
            b.PrependInt64(d)
        dims_v = b.EndVector()
        n = b.CreateByteVector(name + (str(i).encode() if doc_strings else b""))
        b.StartObject(7)
        b.PrependUOffsetTRelativeSlot(0, n, 0)
        if doc is not None:
            b.PrependUOffsetTRelativeSlot(1, doc, 0)
        b.PrependUOffsetTRelativeSlot(2, dims_v, 0)
        b.PrependInt32Slot(3, data_type, 0)
        b.PrependUOffsetTRelativeSlot(4, raw_v, 0)
        if external_offset is not None:
            b.PrependInt64Slot(6, external_offset, -1)
        tensors.append(b.EndObject())
    b.StartVector(4, len(tensors), 4)
    for t in reversed(tensors):
        b.PrependUOffsetTRelative(t)
    tv = b.EndVector()
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(0, tv, 0)
    b.PrependBoolSlot(3, has_external, False)
    ms = b.EndObject()
    b.StartObject(4)
    b.PrependInt32Slot(0, version, 0)
    b.PrependUOffsetTRelativeSlot(1, ms, 0)
    b.Finish(b.EndObject(), file_identifier=b"ODTC")
    return bytes(b.Output())


def test_hand_built_checkpoint_reads():
    c = C.loads(raw_checkpoint(raw=np.float32([1, 2]).tobytes()))
    assert c.trainable["w"].tolist() == [1.0, 2.0]


@pytest.mark.parametrize("kwargs, message", [
    ({"version": 1}, "checkpoint version 1 is not supported; edgetrain reads version 2"),
    ({"version": 3}, "checkpoint version 3 is not supported"),
    ({"version": 0}, "checkpoint version 0 is not supported"),
    ({"has_external": True}, "external data file (has_external_data), which edgetrain does not support"),
    ({"external_offset": 0}, "'w': its data live in an external data file"),
    ({"data_type": 8}, "element type 8 (STRING) is not supported; supported: FLOAT, UINT8"),
    ({"data_type": 16}, "element type 16 (BFLOAT16) is not supported"),
    ({"data_type": 0}, "element type 0 (UNDEFINED)"),
    ({"dims": (256, 784)}, ("trainable parameter 'w': dims (256, 784) of FLOAT need 802816 bytes, raw_data "
                            "holds 8")),
    ({"dims": (2 ** 40, 2 ** 40, 2 ** 40)}, f"need {4 * 2 ** 120} bytes, raw_data holds 8"),
    ({"dims": (-2, -1)}, "negative dimension in dims (-2, -1)"),
    ({"dims": (1,) * 40, "raw": b"\0" * 4}, "40 dimensions"),
    ({"name": b"\xff\xfe"}, "is not UTF-8"),
    ({"doc_strings": 8}, "more bytes than the file holds"),
])
def test_unsupported_or_inconsistent_content_is_a_clear_error(kwargs, message):
    data = raw_checkpoint(**kwargs)
    with pytest.raises(C.CheckpointError, match=re.escape(message)):
        C.loads(data)
    assert peak_alloc(lambda: load_or_error(data)) < 256 * 1024


def test_error_names_the_file(tmp_path):
    path = tmp_path / "bad_ckpt"
    path.write_bytes(raw_checkpoint(version=3))
    with pytest.raises(C.CheckpointError, match=re.escape(f"checkpoint '{path}': checkpoint version 3")) as e:
        C.load(path)
    assert isinstance(e.value, EdgetrainError)


def test_missing_file_folder_and_empty_file(tmp_path):
    with pytest.raises(C.CheckpointError, match="cannot read checkpoint .*No such file"):
        C.load(tmp_path / "nope")
    with pytest.raises(C.CheckpointError, match="is a directory: ORT's folder checkpoints"):
        C.load(tmp_path)
    (tmp_path / "empty").write_bytes(b"")
    with pytest.raises(C.CheckpointError, match="has 0 bytes, fewer than a flatbuffer header"):
        C.load(tmp_path / "empty")


def test_wrong_identifier(shared):
    data = bytearray(files.read(shared / "ort_artifacts" / "digits" / "checkpoint"))
    data[4:8] = b"ORTM"
    with pytest.raises(C.CheckpointError, match=re.escape("file identifier b'ORTM' (an ORT-format model")):
        C.loads(data)
    data[4:8] = b"\0\0\0\0"
    with pytest.raises(C.CheckpointError, match="not an ORT training checkpoint"):
        C.loads(data)
    with pytest.raises(C.CheckpointError, match="not an ORT training checkpoint"):
        C.loads((shared / "ort_artifacts" / "digits" / "training_model.onnx").read_bytes())


def test_offsets_pointing_outside_the_file(shared):
    good = files.read(shared / "ort_artifacts" / "digits" / "checkpoint")
    pos = structure_positions(good)
    n = len(good)

    def patched(at, fmt, value):
        data = bytearray(good)
        struct.pack_into(fmt, data, at, value)
        return data

    cases = {
        "root offset past the end": (0, "<I", n + 64, "lies outside the file"),
        "root offset unaligned": (0, "<I", 13, "not aligned"),
        "vtable before the file": (pos["root_table"], "<i", 1 << 30, "lies outside the file"),
        "vtable after the file": (pos["root_table"], "<i", -(1 << 30), "lies outside the file"),
        "dims length huge": (pos["dims0_len"], "<I", 0xFFFFFFF0, "lies outside the file"),
        "raw_data length huge": (pos["raw0_len"], "<I", 0x7FFFFFFF, "lies outside the file"),
        "name length huge": (pos["name0"], "<I", n, "lies outside the file"),
        "forged dims": (pos["dims0"], "<q", 1 << 50, "need"),
        "version 1": (pos["version"], "<i", 1, "checkpoint version 1"),
    }
    for what, (at, fmt, value, message) in cases.items():
        data = patched(at, fmt, value)
        with pytest.raises(C.CheckpointError, match=message):
            C.loads(data)
        assert peak_alloc(lambda d=data: load_or_error(d)) < 2 * n + 64 * 1024, what


@pytest.mark.native   # asserts a time budget
def test_shared_tables_cannot_multiply_work():
    """One optimizer group (with a 4 kB moment) referenced 20000 times from a 90 kB file: refused, fast."""
    b = flatbuffers.Builder(1024)
    raw = b.CreateByteVector(b"\0" * 4000)
    n = b.CreateString("momentum0")
    b.StartVector(8, 1, 8)
    b.PrependInt64(1000)
    dims = b.EndVector()
    b.StartObject(7)
    b.PrependUOffsetTRelativeSlot(0, n, 0)
    b.PrependUOffsetTRelativeSlot(2, dims, 0)
    b.PrependInt32Slot(3, 1, 0)
    b.PrependUOffsetTRelativeSlot(4, raw, 0)
    tensor = b.EndObject()

    def repeated(off, count):
        b.StartVector(4, count, 4)
        for _ in range(count):
            b.PrependUOffsetTRelative(off)
        return b.EndVector()

    moments = repeated(tensor, 1)
    pname = b.CreateString("w")
    b.StartObject(2)
    b.PrependUOffsetTRelativeSlot(0, pname, 0)
    b.PrependUOffsetTRelativeSlot(1, moments, 0)
    states = repeated(b.EndObject(), 1)
    b.StartObject(4)
    b.PrependUOffsetTRelativeSlot(3, states, 0)
    groups = repeated(b.EndObject(), 20000)
    b.StartObject(4)
    b.PrependInt32Slot(0, 2, 0)
    b.PrependUOffsetTRelativeSlot(2, groups, 0)
    b.Finish(b.EndObject(), file_identifier=b"ODTC")
    data = bytes(b.Output())
    t = time.perf_counter()
    with pytest.raises(C.CheckpointError, match="more objects than it can hold|more bytes than the file"):
        C.loads(data)
    assert time.perf_counter() - t < 1.0
    # data bytes are capped by the file size; Python objects for the tables decoded before the budget ran
    # out (at most one per 4 bytes of file) add a bounded factor
    assert peak_alloc(lambda: load_or_error(data)) < 8 * len(data) + 256 * 1024


def corruption_corpus():
    """An ORT-written file (tables first) and edgetrain's sample (small tensors, so mostly structure)."""
    from conftest import SHARED
    return {"ort_digits": bytes(files.read(SHARED / "ort_artifacts" / "digits" / "checkpoint")),
            "sample": C.dumps(sample())}


@pytest.mark.parametrize("which", ["ort_digits", "sample"])
def test_every_truncation_is_an_error_or_loses_only_padding(which):
    good = corruption_corpus()[which]
    original = C.loads(good)
    cuts = range(len(good)) if len(good) < 6000 else \
        sorted(set(range(600)) | set(range(len(good) - 64, len(good)))
               | set(np.random.default_rng(1).integers(0, len(good), 300).tolist()))
    loaded = 0
    for cut in cuts:
        c = load_or_error(good[:cut])
        if c is not None:                     # only trailing padding was cut
            assert cut >= len(good) - 8, cut
            assert_same(c, original)
            loaded += 1
    assert loaded <= 8


@pytest.mark.native   # asserts a time budget
@pytest.mark.parametrize("which", ["ort_digits", "sample"])
def test_random_corruption_raises_checkpoint_error_or_loads(which):
    good = corruption_corpus()[which]
    structure = structure_bytes(good)
    rng = np.random.default_rng(20240919)
    budget = 3 * len(good) + 256 * 1024
    errors = 0
    t = time.perf_counter()
    tracemalloc.start()
    try:
        for i in range(400):
            data = bytearray(good)
            if i < 250:                                   # single byte flips, 4 in 5 outside tensor data
                at = int(rng.choice(structure)) if i % 5 else int(rng.integers(0, len(data)))
                data[at] ^= int(rng.integers(1, 256))
            else:                                         # forged 32-bit words at aligned places
                at = 4 * int(rng.choice(structure[structure % 4 == 0] // 4))
                value = int(rng.choice([0, 1, 0xFFFFFFFF, 0x7FFFFFFF, len(data), len(data) - 4,
                                        int(rng.integers(0, 2 ** 32))]))
                struct.pack_into("<I", data, at, value)
            tracemalloc.reset_peak()
            errors += load_or_error(bytes(data)) is None
            assert tracemalloc.get_traced_memory()[1] < budget, (i, at)
    finally:
        tracemalloc.stop()
    assert errors > 50                                    # the structure is checked, not just the identifier
    assert time.perf_counter() - t < 60


# ---------------------------------------------------------------------------------------------- atomic save

def test_failed_rename_leaves_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint"
    C.save(sample(), path)
    before = path.read_bytes()

    def no_space(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", no_space)
    changed = sample()
    changed.properties["epoch"] = 4
    with pytest.raises(C.CheckpointError, match="cannot write checkpoint .*No space left.*unchanged"):
        C.save(changed, path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]


def test_crash_in_the_middle_of_writing_leaves_the_previous_file(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint"
    C.save(sample(), path)
    before = path.read_bytes()
    real_write = os.write

    def half_write(fd, view):
        real_write(fd, view[: len(view) // 2])
        raise KeyboardInterrupt("power cut")

    with monkeypatch.context() as m:
        m.setattr(os, "write", half_write)
        with pytest.raises(KeyboardInterrupt):
            C.save(C.Checkpoint({"other": np.ones(1000, np.float32)}), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]

    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    with pytest.raises(C.CheckpointError, match="Input/output error"):
        C.save(C.Checkpoint({"other": np.ones(1000, np.float32)}), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]


@pytest.mark.native
def test_killed_process_leaves_the_previous_file(tmp_path):
    """A hard kill between fsync and rename (no Python cleanup runs): the old file is whole."""
    path = tmp_path / "checkpoint"
    C.save(sample(), path)
    before = path.read_bytes()
    script = ("import os, sys, numpy as np, edgetrain.checkpoint as C\n"
              "os.replace = lambda *a: os._exit(9)\n"
              "C.save(C.Checkpoint({'w': np.ones(10**6, np.float32)}), sys.argv[1])\n")
    r = subprocess.run([sys.executable, "-c", script, str(path)], check=False, capture_output=True)
    assert r.returncode == 9
    assert path.read_bytes() == before
    leftovers = [p.name for p in tmp_path.iterdir() if p.name != "checkpoint"]
    assert len(leftovers) == 1 and leftovers[0].startswith(".checkpoint.") and leftovers[0].endswith(".tmp")


def test_save_into_a_missing_folder_and_file_mode(tmp_path):
    with pytest.raises(C.CheckpointError, match="cannot write checkpoint"):
        C.save(sample(), tmp_path / "nope" / "checkpoint")
    C.save(sample(), tmp_path / "ck")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "ck").stat().st_mode & 0o777 == 0o666 & ~umask


@pytest.mark.native
def test_device_side_imports_neither_onnx_nor_numba():
    code = ("import sys, edgetrain.checkpoint as C; "
            "print(sorted(m for m in ('onnx', 'numba', 'torch') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_decode_reports_the_extent_it_read(shared):
    data = files.read(shared / "ort_artifacts" / "cnn" / "checkpoint")
    buf = Buffer(data)
    reader._checkpoint(buf)
    assert len(data) - 8 < buf.extent <= len(data)      # everything but the trailing padding was checked


# ---------------------------------------------------------------------------------------------- ORT 1.19.2



def test_ort119_tooling_skips_only_without_python311(monkeypatch):
    import types

    import ort119
    monkeypatch.setattr(ort119.shutil, "which", lambda name: None)
    monkeypatch.setattr(ort119, "sys", types.SimpleNamespace(version_info=(3, 13, 1), version="3.13.1",
                                                           executable="/usr/bin/python3.13"))
    with pytest.raises(ort119.Unavailable, match="python3.11 is not on PATH .*Python <= 3.11"):
        ort119.find_python311()


# Decodes a checkpoint with the flatbuffer modules generated by ORT (shipped in its wheel) into OUT.
ORT_DECODE = '''
NP = {1: np.float32, 2: np.uint8, 3: np.int8, 4: np.uint16, 5: np.int16, 6: np.int32, 7: np.int64,
      9: np.bool_, 10: np.float16, 11: np.float64, 12: np.uint32, 13: np.uint64}

def tensor(t):
    raw = t.RawDataAsNumpy() if t.RawDataLength() else np.zeros(0, np.uint8)
    dims = [t.Dims(i) for i in range(t.DimsLength())]
    arr = np.frombuffer(raw.tobytes(), NP[t.DataType()])
    return t.Name().decode(), arr if (not dims and arr.size == 0) else arr.reshape(dims)

def decode(path, key):
    buf = open(path, "rb").read()
    Checkpoint = fbs("Checkpoint").Checkpoint
    assert Checkpoint.CheckpointBufferHasIdentifier(buf, 0)
    ck = Checkpoint.GetRootAs(buf, 0)
    ms = ck.ModuleState()
    info = {"version": ck.Version(), "nominal": ms.IsNominalState(), "external": ms.HasExternalData(),
            "trainable": [], "frozen": [], "groups": [], "props": {}}
    for kind, n, get in (("trainable", ms.RequiresGradParamsLength(), ms.RequiresGradParams),
                         ("frozen", ms.FrozenParamsLength(), ms.FrozenParams)):
        for i in range(n):
            t = get(i)
            assert t.ExternalDataOffset() == -1 and t.DocString() is None
            name, arr = tensor(t)
            info[kind].append(name)
            OUT[f"{key}|{name}"] = arr
    for g in range(ck.OptimizerGroupsLength()):
        grp = ck.OptimizerGroups(g)
        info["groups"].append([grp.GroupName().decode(), grp.Step(), grp.InitialLearningRate(),
                               grp.OptimizerStatesLength()])
        for s in range(grp.OptimizerStatesLength()):
            st = grp.OptimizerStates(s)
            for m in range(st.MomentumsLength()):
                mname, arr = tensor(st.Momentums(m))
                OUT[f"{key}|{grp.GroupName().decode()}|{st.ParamName().decode()}|{mname}"] = arr
    bag = ck.PropertyBag()
    if bag is not None:
        for i in range(bag.IntsLength()):
            info["props"][bag.Ints(i).Name().decode()] = bag.Ints(i).Value()
        for i in range(bag.FloatsLength()):
            info["props"][bag.Floats(i).Name().decode()] = bag.Floats(i).Value()
        for i in range(bag.StringsLength()):
            info["props"][bag.Strings(i).Name().decode()] = bag.Strings(i).Value().decode()
    OUT[key] = info
'''


def assert_matches_ort_decode(out: dict, key: str, c: C.Checkpoint) -> None:
    info = out[key]
    assert info["version"] == 2 and info["nominal"] == c.is_nominal and not info["external"]
    assert info["trainable"] == list(c.trainable) and info["frozen"] == list(c.frozen)
    for name, value in c.parameters.items():
        theirs = out[f"{key}|{name}"]
        assert theirs.dtype == value.dtype, name
        if c.is_nominal:                        # names and types only: empty dims and raw_data
            assert theirs.size == 0, name
        else:
            assert theirs.shape == value.shape and theirs.tobytes() == value.tobytes(), name
    assert info["groups"] == [[g.name, g.step, f32(g.initial_learning_rate), len(g.states)]
                              for g in c.optimizer_groups]
    for g in c.optimizer_groups:
        for p, moments in g.states.items():
            for m, value in moments.items():
                theirs = out[f"{key}|{g.name}|{p}|{m}"]
                assert theirs.shape == value.shape and theirs.tobytes() == value.tobytes(), (p, m)
    assert info["props"] == {k: (f32(v) if isinstance(v, float) else v) for k, v in c.properties.items()}


def without_float16(c: C.Checkpoint) -> C.Checkpoint:
    """ORT 1.19.2 cannot load float16 tensors from a checkpoint ("Unsupported data type: 10")."""
    keep = {k: v for k, v in c.trainable.items() if v.dtype != np.float16}
    groups = [C.OptimizerGroup(g.name, g.step, g.initial_learning_rate, {k: g.states[k] for k in keep})
              for g in c.optimizer_groups]
    return C.Checkpoint(keep, c.frozen, groups, c.properties, c.is_nominal)


@pytest.mark.ort119
@pytest.mark.native
def test_ort_loads_what_edgetrain_writes(ort, tmp_path):
    written = {"full": sample(), "ort_full": without_float16(sample()),
               "nominal": without_float16(sample(nominal=True)),
               "half": C.Checkpoint({"h": np.ones(3, np.float16)})}
    for key, c in written.items():
        C.save(c, tmp_path / key)
    out = ort.run(ORT_DECODE + '''
for key in ("full", "ort_full", "nominal"):
    decode(ARGS["dir"] + "/" + key, "fbs:" + key)
state = ort_api.CheckpointState.load_checkpoint(ARGS["dir"] + "/ort_full")
names = [n for n, _ in state.parameters]
OUT["ort:ort_full"] = {"names": names, "requires_grad": {n: state.parameters[n].requires_grad for n in names},
                       "props": {k: state.properties[k] for k in ARGS["props"]}}
for n in names:
    OUT["data:" + n] = state.parameters[n].data
nominal = ort_api.CheckpointState.load_checkpoint(ARGS["dir"] + "/nominal")
OUT["nominal_has"] = [n for n in names if n in nominal.parameters]
try:
    nominal.parameters[names[0]]
    OUT["nominal_data_error"] = ""
except Exception as e:
    OUT["nominal_data_error"] = str(e)
try:
    ort_api.CheckpointState.load_checkpoint(ARGS["dir"] + "/half")
    OUT["half_error"] = ""
except Exception as e:
    OUT["half_error"] = str(e)
''', args={"dir": str(tmp_path), "props": list(written["full"].properties)})
    for key in ("full", "ort_full", "nominal"):
        assert_matches_ort_decode(out, "fbs:" + key, written[key])
    full = written["ort_full"]
    info = out["ort:ort_full"]
    assert sorted(info["names"]) == sorted(full.parameters)
    assert info["requires_grad"] == {n: n in full.trainable for n in full.parameters}
    assert sorted(out["nominal_has"]) == sorted(full.parameters)
    for name, value in full.parameters.items():
        theirs = out["data:" + name]
        assert theirs.dtype == value.dtype and theirs.shape == value.shape, name
        assert theirs.tobytes() == value.tobytes(), name
    assert out["ort:ort_full"]["props"] == {k: (f32(v) if isinstance(v, float) else v)
                                            for k, v in full.properties.items()}
    assert "nominal" in out["nominal_data_error"].lower()
    assert "Unsupported data type: 10" in out["half_error"]      # an ORT limit, not a format difference


@pytest.mark.ort119
@pytest.mark.native
def test_edgetrain_reads_what_ort_trains_and_ort_resumes_from_edgetrain(ort, shared, tmp_path):
    folder = shared / "ort_artifacts" / "mlp"
    out = ort.run('''
d, tmp = ARGS["dir"], ARGS["tmp"]
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
rng = np.random.default_rng(7)
x = rng.standard_normal((64, 784)).astype(np.float32); y = rng.integers(0, 10, 64).astype(np.int64)

def session(ckpt):
    state = ort_api.CheckpointState.load_checkpoint(ckpt)
    m = ort_api.Module(d + "/training_model.onnx", state, d + "/eval_model.onnx", session_options=so)
    return state, m, ort_api.Optimizer(d + "/optimizer_model.onnx", m)

state, m, opt = session(d + "/checkpoint")
m.train()
for _ in range(2):
    m(x, y); opt.step(); m.lazy_reset_grad()
state.properties["epoch"] = 2
state.properties["best_loss"] = 0.123456789
state.properties["run"] = "mlp-\u00e9"
ort_api.CheckpointState.save_checkpoint(state, tmp + "/ort_saved", include_optimizer_state=True)
for n, p in state.parameters:
    OUT["data:" + n] = p.data
OUT["names"] = [n for n, _ in state.parameters]
''', args={"dir": str(folder), "tmp": str(tmp_path)})
    ours = C.load(tmp_path / "ort_saved")
    assert list(ours.trainable) == sorted(out["names"]) and ours.frozen == {}
    for n in out["names"]:
        assert ours.trainable[n].tobytes() == out["data:" + n].tobytes() and ours.trainable[n].shape == \
            out["data:" + n].shape, n
    assert ours.properties == {"epoch": 2, "best_loss": f32(0.123456789), "run": "mlp-\u00e9"}
    (group,) = ours.optimizer_groups
    assert (group.name, group.step, group.initial_learning_rate) == ("group0", 2, f32(1e-3))
    assert list(group.states) == list(ours.trainable)
    for p, moments in group.states.items():
        assert list(moments) == list(C.MOMENTUM_NAMES)
        assert all(v.shape == ours.trainable[p].shape and v.dtype == np.float32 for v in moments.values())
        assert np.abs(moments["momentum0"]).sum() > 0 and (moments["momentum1"] >= 0).all()

    # edgetrain re-encodes ORT's file; ORT decodes both identically and resumes training identically from both
    C.save(ours, tmp_path / "rewritten")
    out2 = ort.run(ORT_DECODE + '''
d, tmp = ARGS["dir"], ARGS["tmp"]
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
rng = np.random.default_rng(8)
x = rng.standard_normal((64, 784)).astype(np.float32); y = rng.integers(0, 10, 64).astype(np.int64)
for key in ("ort_saved", "rewritten"):
    decode(tmp + "/" + key, key)
    state = ort_api.CheckpointState.load_checkpoint(tmp + "/" + key)
    m = ort_api.Module(d + "/training_model.onnx", state, d + "/eval_model.onnx", session_options=so)
    opt = ort_api.Optimizer(d + "/optimizer_model.onnx", m)
    m.train(); OUT["loss:" + key] = np.asarray(m(x, y)); opt.step()
    for n, p in state.parameters:
        OUT[f"after:{key}:{n}"] = p.data
''', args={"dir": str(folder), "tmp": str(tmp_path)})
    assert_matches_ort_decode(out2, "ort_saved", ours)
    assert_matches_ort_decode(out2, "rewritten", ours)
    assert out2["loss:ort_saved"].tobytes() == out2["loss:rewritten"].tobytes()
    for n in out["names"]:
        a, b = out2[f"after:ort_saved:{n}"], out2[f"after:rewritten:{n}"]
        assert a.tobytes() == b.tobytes(), n
        assert not np.array_equal(a, ours.trainable[n]), n          # the step did move the parameters


@pytest.mark.ort119
@pytest.mark.native
def test_ort_trains_from_an_edgetrain_nominal_checkpoint(ort, shared, tmp_path):
    """ORT's nominal workflow: load names only, build the Module, copy the real parameters in, train."""
    folder = shared / "ort_artifacts" / "digits"
    full = C.load(folder / "checkpoint")
    C.save(C.Checkpoint(full.trainable, full.frozen, is_nominal=True), tmp_path / "nominal")
    out = ort.run('''
d = ARGS["dir"]
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
rng = np.random.default_rng(3)
x = rng.standard_normal((32, 64)).astype(np.float32); y = rng.integers(0, 10, 32).astype(np.int64)
losses = {}
for key, path in (("full", d + "/checkpoint"), ("nominal", ARGS["nominal"])):
    state = ort_api.CheckpointState.load_checkpoint(path)
    m = ort_api.Module(d + "/training_model.onnx", state, d + "/eval_model.onnx", session_options=so)
    if key == "full":
        params = m.get_contiguous_parameters(trainable_only=False)
    else:
        m.copy_buffer_to_parameters(params, trainable_only=False)
    m.train()
    OUT["loss:" + key] = np.asarray(m(x, y))
''', args={"dir": str(folder), "nominal": str(tmp_path / "nominal")})
    assert out["loss:full"].tobytes() == out["loss:nominal"].tobytes()


@pytest.mark.ort119
@pytest.mark.native
def test_edgetrain_writes_the_bytes_ort_writes_offline(ort, shared, tmp_path):
    """ORT's onnxblock.save_checkpoint (full and nominal, trainable + frozen) vs edgetrain, same tensors."""
    model = onnx.load(str(shared / "models" / "mobilenet.onnx"))
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    trainable = [n for n in inits if n.startswith(("conv1.", "fc."))]
    frozen = [n for n in inits if n.startswith("bn") and "num_batches" not in n]
    ort.run('''
import onnx
from onnxruntime.training import onnxblock
inits = {t.name: t for t in onnx.load(ARGS["model"]).graph.initializer}
params = ([inits[n] for n in ARGS["trainable"]], [inits[n] for n in ARGS["frozen"]])
onnxblock.save_checkpoint(params, ARGS["tmp"] + "/full")
onnxblock.save_checkpoint(params, ARGS["tmp"] + "/nominal", nominal_checkpoint=True)
''', args={"model": str(shared / "models" / "mobilenet.onnx"), "trainable": trainable, "frozen": frozen,
             "tmp": str(tmp_path)})
    for key, nominal in (("full", False), ("nominal", True)):
        ours = C.Checkpoint({n: inits[n] for n in trainable}, {n: inits[n] for n in frozen},
                            is_nominal=nominal)
        assert C.dumps(ours) == (tmp_path / key).read_bytes(), key


@pytest.mark.ort119
@pytest.mark.native
def test_ort_decodes_edgetrain_rewrites_of_its_checkpoints(ort, shared, tmp_path):
    ckpts = {}
    for name in ORT_MODELS:
        ckpts[name] = C.load(shared / "ort_artifacts" / name / "checkpoint")
        C.save(ckpts[name], tmp_path / name)
    out = ort.run(ORT_DECODE + '''
for name in ARGS["names"]:
    decode(ARGS["tmp"] + "/" + name, name)
    state = ort_api.CheckpointState.load_checkpoint(ARGS["tmp"] + "/" + name)
    OUT["sum:" + name] = float(sum(np.abs(p.data).astype(np.float64).sum() for _, p in state.parameters))
''', args={"names": ORT_MODELS, "tmp": str(tmp_path)})
    for name, c in ckpts.items():
        assert_matches_ort_decode(out, name, c)
        ours = sum(float(np.abs(v).astype(np.float64).sum()) for v in c.parameters.values())
        assert out["sum:" + name] == pytest.approx(ours, rel=1e-12)
