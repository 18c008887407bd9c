"""Test helpers: build tiny ONNX models and compare edgetrain with an oracle we did not write."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import edgetrain

NP_TO_ONNX = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
              np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
              np.dtype(np.bool_): TensorProto.BOOL, np.dtype(np.uint8): TensorProto.UINT8,
              np.dtype(np.int8): TensorProto.INT8, np.dtype(np.int16): TensorProto.INT16,
              np.dtype(np.uint16): TensorProto.UINT16, np.dtype(np.uint32): TensorProto.UINT32,
              np.dtype(np.uint64): TensorProto.UINT64}


def model(nodes, feeds: dict[str, np.ndarray], outputs: list[str], initializers: dict[str, np.ndarray] | None = None,
          opset: int = 17, ms_opset: int | None = None) -> onnx.ModelProto:
    """A model of ``nodes`` whose inputs are typed like ``feeds``; outputs get no declared shape."""
    if not isinstance(nodes, (list, tuple)):
        nodes = [nodes]
    inputs = [helper.make_tensor_value_info(k, NP_TO_ONNX[v.dtype], v.shape) for k, v in feeds.items()]
    outs = [helper.make_empty_tensor_value_info(o) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in (initializers or {}).items()]
    graph = helper.make_graph(list(nodes), "test", inputs, outs, inits)
    opsets = [helper.make_opsetid("", opset)]
    if ms_opset is not None or any(n.domain == "com.microsoft" for n in nodes):
        opsets.append(helper.make_opsetid("com.microsoft", ms_opset or 1))
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def run_edgetrain(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return edgetrain.InferenceSession(m.SerializeToString()).run(None, feeds)


def run_reference(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [np.asarray(r) for r in ReferenceEvaluator(m).run(None, feeds)]


def run_onnxruntime(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def assert_matches(m: onnx.ModelProto, feeds: dict[str, np.ndarray], oracle=run_reference,
                   rtol: float = 1e-5, atol: float = 1e-6):
    ours = run_edgetrain(m, feeds)
    ref = oracle(m, feeds)
    assert len(ours) == len(ref)
    for k, (a, b) in enumerate(zip(ours, ref)):
        b = np.asarray(b)
        assert a.shape == b.shape, f"output {k}: shape {a.shape} != oracle {b.shape}"
        assert a.dtype == b.dtype, f"output {k}: dtype {a.dtype} != oracle {b.dtype}"
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=f"output {k}")
    return ours
