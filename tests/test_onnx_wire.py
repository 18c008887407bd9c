"""``onnx_wire`` (ModelProto bytes without onnx) against onnx itself: the bytes parse to exactly the ModelProto
``onnx_io.from_graph`` builds with onnx's helpers, for the bench models and edgetrain's artifacts."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from edgetrain import artifacts
from edgetrain.ir import Graph, Node, SequenceType, TensorType, Value
from edgetrain.onnx_io import from_graph, to_graph
from edgetrain.onnx_wire import model_bytes, varint


def _parsed(graph: Graph) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.ParseFromString(model_bytes(graph))
    return m


@pytest.mark.parametrize("model", ["digits", "cnn", "mobilenet", "transformer"])
def test_bench_models_encode_as_onnx_does(shared, model):
    g = to_graph(shared / "models" / f"{model}.onnx")
    assert _parsed(g) == from_graph(g)


def test_artifacts_encode_as_onnx_does(shared, tmp_path):
    artifacts.generate_artifacts(str(shared / "models" / "digits.onnx"), requires_grad=["fc2.weight", "fc2.bias"],
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=tmp_path)
    for name in ("training_model", "eval_model", "optimizer_model"):
        g = to_graph(tmp_path / f"{name}.onnx")
        assert _parsed(g) == from_graph(g), name


def test_every_attribute_kind_and_type_encodes_as_onnx_does():
    node = Node("Custom", ["x", ""], ["y"], {"i": -3, "b": True, "f": 0.1, "s": "nearest", "ints": (1, -2, 3),
                                            "floats": (0.5, 2), "strings": ("a", "bc"),
                                            "t": np.arange(6, dtype=np.int64).reshape(2, 3)}, "n", "com.example")
    g = Graph([node], [Value("x", TensorType(np.float16, ("N", None, 3))), Value("s", SequenceType(np.float32))],
              [Value("y", TensorType(np.bool_, ())), Value("z", None)], {"w": np.ones((2, 2), np.float64)},
              {"": 17, "com.example": 1}, {"h": TensorType(np.int32, (4,))}, "g")
    assert _parsed(g) == from_graph(g)


def test_varints_are_protobufs():
    for n in (0, 1, 127, 128, 300, 2 ** 32, 2 ** 63 - 1, -1, -(2 ** 63)):
        t = onnx.TensorProto()
        t.ParseFromString(b"\x10" + varint(n))      # field 2 (data_type), varint
        assert t.data_type == (n if -(2 ** 31) <= n < 2 ** 31 else t.data_type)
        a = onnx.AttributeProto()
        a.ParseFromString(b"\x18" + varint(n))      # field 3 (i), int64
        assert a.i == n
