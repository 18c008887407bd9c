"""An ORT-format model (.ort) is hostile input. Whatever its bytes, reading it either gives a ModelProto or
raises ModelLoadError (MemoryBudgetError for a size over the budget) naming the file; nothing else escapes, no
check is missed (the reader's safety net says so when one is), and a tensor's declared size is checked against
its data and the memory budget before anything is copied."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from edgetrain.errors import EdgetrainError, MemoryBudgetError, ModelLoadError
from edgetrain.onnx_io import load_model
from edgetrain.ortformat import to_model_proto
from edgetrain.ortformat_writer import to_ort_bytes


def _model() -> onnx.ModelProto:
    """Small, with every part the writer emits: symbolic and unknown dims, a scalar, declared intermediate
    types, a Constant (an initializer in the file), an omitted optional input, attributes of several kinds
    (a tensor one included), a sequence-typed input."""
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["y"], "gemm", alpha=0.5, transB=1),
             helper.make_node("Transpose", ["y"], ["t"], "transpose", perm=[1, 0]),
             helper.make_node("Constant", [], ["c"], "constant", value_floats=[1.0, 2.0]),
             helper.make_node("Shape", ["t"], ["s"], "shape"),
             helper.make_node("ConstantOfShape", ["s"], ["z"], "fill",
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.25])),
             helper.make_node("Clip", ["z", "", "lim"], ["out"], "clip"),
             helper.make_node("SequenceLength", ["seq"], ["n"], "len")]
    g = helper.make_graph(
        nodes, "hostile",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
         helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, None]),
         helper.make_tensor_value_info("n", TensorProto.INT64, [])],
        [helper.make_tensor("w", TensorProto.FLOAT, [4, 4], np.arange(16.0)),
         helper.make_tensor("b", TensorProto.FLOAT, [4], np.ones(4)),
         helper.make_tensor("lim", TensorProto.FLOAT, [], [3.0])],
        value_info=[helper.make_tensor_value_info("t", TensorProto.FLOAT, [4, "batch"]),
                    helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
                    helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
                    helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, "batch"])])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


DATA = to_ort_bytes(_model())


def _read_or_refuse(data: bytes):
    """The only outcomes allowed: a ModelProto, or an error naming the file with no missed check."""
    try:
        return to_model_proto(data, "fuzz.ort")
    except EdgetrainError as e:
        assert isinstance(e, (ModelLoadError, MemoryBudgetError)) and "'fuzz.ort'" in str(e), e
        assert "a check was missed" not in str(e), e
        return None


def test_the_model_round_trips():
    read = to_model_proto(DATA, "fuzz.ort")
    onnx.checker.check_model(read)
    assert [n.op_type for n in read.graph.node] == ["Gemm", "Transpose", "Shape", "ConstantOfShape", "Clip",
                                                    "SequenceLength"]
    assert read.graph.input == _model().graph.input and read.graph.output == _model().graph.output
    c = next(t for t in read.graph.initializer if t.name == "c")
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(c), [1.0, 2.0])


def test_every_truncation_is_a_load_error():
    for cut in range(len(DATA) - 8):       # the last bytes may be padding nothing reads
        assert _read_or_refuse(DATA[:cut]) is None, cut


@pytest.mark.parametrize("seed", range(2))
def test_random_byte_mutations_read_or_raise_a_load_error(seed):
    rng = np.random.default_rng(seed)
    for _ in range(600):
        bad = bytearray(DATA)
        for pos in rng.integers(0, len(bad), int(rng.integers(1, 4))):
            bad[pos] = int(rng.integers(0, 256))
        _read_or_refuse(bytes(bad))


def test_every_aligned_word_replaced_by_a_hostile_value():
    for value in (0xFFFFFFFF, len(DATA) - 4):     # far out, and just inside the end
        for pos in range(0, len(DATA) - 3, 4):
            bad = bytearray(DATA)
            bad[pos:pos + 4] = value.to_bytes(4, "little")
            _read_or_refuse(bytes(bad))


def test_a_declared_size_is_checked_against_the_data_and_the_budget():
    data = bytearray(DATA)
    dims = (4).to_bytes(8, "little") + (4).to_bytes(8, "little")      # w's dims [4, 4]
    i = data.find(dims)
    data[i:i + 16] = (2 ** 20).to_bytes(8, "little") * 2
    with pytest.raises(MemoryBudgetError, match="'fuzz.ort'.*initializer 'w'.*memory budget"):
        to_model_proto(bytes(data), "fuzz.ort", max_memory=1 << 30)
    with pytest.raises(ModelLoadError, match=r"initializer 'w' has dims \[1048576, 1048576\].*64 bytes of data"):
        to_model_proto(bytes(data), "fuzz.ort", max_memory=1 << 45)


def test_files_are_told_apart_by_content(tmp_path):
    path = tmp_path / "model.bin"          # any name: the identifier decides
    path.write_bytes(DATA)
    assert [n.name for n in load_model(path).graph.node][0] == "gemm"
    path.write_bytes(DATA[:4] + b"ODTC" + DATA[8:])
    with pytest.raises(ModelLoadError, match="model.bin"):
        load_model(path)
