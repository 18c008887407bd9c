"""edgetrain.onnx_read (ONNX bytes -> IR without onnx or protobuf) against onnx_io.to_graph, which parses with
onnx's protobuf: the same graph for the bench models and both systems' training artifacts, for tensors in every
typed field and attributes of every kind it reads; everything else goes to onnx_io (NeedsOnnx), hostile bytes
raise edgetrain's errors only, and a process that builds a Module and Optimizer from artifacts imports neither
onnx nor protobuf."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgetrain import compact, onnx_read
from edgetrain.errors import EdgetrainError
from edgetrain.onnx_io import to_graph


def _same_value(a, b, where, ours=True):
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        assert (a.dtype, a.shape) == (b.dtype, b.shape), where
        # aligned and writable, as onnx's copies are: a misaligned view of the file costs BLAS a copy per call
        assert not ours or (a.flags.aligned and a.flags.writeable and a.flags.c_contiguous), where
        np.testing.assert_array_equal(a, b, err_msg=where)
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


def assert_same_graph(got, want, ours=True):
    assert (got.name, got.opsets) == (want.name, want.opsets)
    assert [(v.name, v.type) for v in got.inputs] == [(v.name, v.type) for v in want.inputs]
    assert [(v.name, v.type) for v in got.outputs] == [(v.name, v.type) for v in want.outputs]
    assert got.value_types == want.value_types
    assert list(got.initializers) == list(want.initializers)
    for name, a in want.initializers.items():
        _same_value(got.initializers[name], a, f"initializer {name}", ours)
    assert len(got.nodes) == len(want.nodes)
    for m, n in zip(got.nodes, want.nodes):
        assert (m.op_type, m.domain, m.name, m.inputs, m.outputs) == (n.op_type, n.domain, n.name, n.inputs, n.outputs)
        assert list(m.attrs) == list(n.attrs), n.name
        for k in n.attrs:
            _same_value(m.attrs[k], n.attrs[k], f"{n.name}.{k}", ours)


def _model_files(shared):
    files = sorted((shared / "models").glob("*.onnx")) + sorted((shared / "ort_artifacts").glob("*/*.onnx"))
    assert len(files) >= 20
    return files


def test_bench_models_and_ort_artifacts_read_as_onnx_reads_them(shared):
    for path in _model_files(shared):
        assert_same_graph(onnx_read.read(path.read_bytes(), str(path)), to_graph(str(path)))


def test_edgetrain_artifacts_read_as_onnx_reads_them(shared, tmp_path):
    from edgetrain import artifacts, checkpoint
    ckpt = checkpoint.load(shared / "ort_artifacts" / "digits" / "checkpoint")
    artifacts.generate_artifacts(str(shared / "models" / "digits.onnx"), requires_grad=list(ckpt.trainable),
                                 frozen_params=list(ckpt.frozen), loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)
    for path in sorted(tmp_path.glob("*.onnx")):
        assert_same_graph(onnx_read.read(path.read_bytes(), str(path)), to_graph(str(path)))


def _typed_tensor_model():
    """Initializers in every typed field (not raw_data), unpacked repeated fields, attributes of each kind."""
    rng = np.random.default_rng(0)
    inits = [helper.make_tensor("f32", TensorProto.FLOAT, [2, 3], rng.standard_normal(6).tolist()),
             helper.make_tensor("f64", TensorProto.DOUBLE, [3], [1.5, -2.25, 1e300]),
             helper.make_tensor("i64", TensorProto.INT64, [2, 2], [1, -2, 2**62, -(2**63)]),
             helper.make_tensor("i32", TensorProto.INT32, [3], [7, -8, 2**31 - 1]),
             helper.make_tensor("i8", TensorProto.INT8, [2], [-128, 127]),
             helper.make_tensor("u8", TensorProto.UINT8, [2], [0, 255]),
             helper.make_tensor("b", TensorProto.BOOL, [3], [True, False, True]),
             helper.make_tensor("f16", TensorProto.FLOAT16, [2], np.array([0.5, -65504], np.float16)),
             helper.make_tensor("u64", TensorProto.UINT64, [2], [0, 2**64 - 1]),
             helper.make_tensor("u32", TensorProto.UINT32, [1], [2**32 - 1]),
             helper.make_tensor("empty", TensorProto.FLOAT, [0, 4], []),
             numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(3, 2), "raw"),
             numpy_helper.from_array(np.ones((1, 2, 3), np.float32), "w"),
             numpy_helper.from_array(np.ones((1, 2, 2), np.float32), "rr")]
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("LeakyRelu", ["r"], ["l"], alpha=0.1),
             helper.make_node("Transpose", ["l"], ["t"], perm=[1, 0], name="tr"),
             helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.INT64, [2], [2, 3])),
             helper.make_node("Constant", [], ["cf"], value_floats=[1.0, 0.1]),
             helper.make_node("Einsum", ["t"], ["e"], equation="ij->ji"),
             helper.make_node("RNN", ["x", "w", "rr"], ["h"], hidden_size=2, activations=["Tanh"], name="é"),
             helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT, domain="ai.onnx")]
    graph = helper.make_graph(nodes, "", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, "N"]),
                               helper.make_empty_tensor_value_info("c")], inits,
                              value_info=[helper.make_tensor_value_info("r", TensorProto.FLOAT, ["N", 3]),
                                          helper.make_tensor_value_info("l", TensorProto.FLOAT, [None, 3])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_typed_tensors_and_every_attribute_kind():
    model = _typed_tensor_model()
    assert_same_graph(onnx_read.read(model.SerializeToString()), to_graph(model))


def test_unpacked_repeated_fields():
    """proto2 writers may emit repeated numbers one by one; protobuf accepts both forms."""
    from edgetrain import onnx_wire as W
    dims = W.int_field(W.TENSOR_DIMS, 2) + W.int_field(W.TENSOR_DIMS, 1)
    tensor = dims + W.int_field(W.TENSOR_DATA_TYPE, 7) + W.str_field(W.TENSOR_NAME, "k")
    tensor += W.int_field(7, 5) + W.int_field(7, -1)            # int64_data, unpacked
    attr = W.str_field(W.ATTR_NAME, "perm") + W.int_field(W.ATTR_INTS, 1) + W.int_field(W.ATTR_INTS, 0)
    attr += W.int_field(W.ATTR_TYPE, W.INTS)
    node = (W.str_field(W.NODE_INPUT, "x") + W.str_field(W.NODE_OUTPUT, "y") + W.str_field(W.NODE_OP_TYPE, "Transpose")
            + W.bytes_field(W.NODE_ATTRIBUTE, attr))
    x = W.value_info(edgetrain_value("x", (2, 3)))
    y = W.value_info(edgetrain_value("y", (3, 2)))
    graph = (W.bytes_field(W.GRAPH_NODE, node) + W.bytes_field(W.GRAPH_INITIALIZER, tensor)
             + W.bytes_field(W.GRAPH_INPUT, x) + W.bytes_field(W.GRAPH_OUTPUT, y))
    data = W.int_field(W.MODEL_IR_VERSION, 8) + W.bytes_field(W.MODEL_GRAPH, graph)
    data += W.bytes_field(W.MODEL_OPSET_IMPORT, W.int_field(W.OPSET_VERSION, 17))
    assert_same_graph(onnx_read.read(data), to_graph(data))


def edgetrain_value(name, shape):
    from edgetrain.ir import TensorType, Value
    return Value(name, TensorType(np.float32, shape))


def _function_op_model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    graph = helper.make_graph([helper.make_node("Celu", ["x"], ["y"], alpha=1.3)], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_what_it_leaves_to_onnx_io(shared, tmp_path):
    """Each case raises NeedsOnnx naming what it met; load_graph then reads it with onnx_io as before."""
    cases = {"not in the op table": _function_op_model()}
    local = _typed_tensor_model()
    local.functions.append(onnx.FunctionProto(name="f", domain="local"))
    cases["model-local functions"] = local
    old = _function_op_model()
    old.graph.node[0].op_type, old.opset_import[0].version = "Round", 11
    del old.graph.node[0].attribute[:]
    cases["schemas to upgrade"] = old
    newest = _typed_tensor_model()
    newest.opset_import[0].version = onnx_read.NEWEST_OPSET + 1
    cases[f"opset {onnx_read.NEWEST_OPSET + 1}"] = newest
    for why, model in cases.items():
        with pytest.raises(onnx_read.NeedsOnnx, match=why):
            onnx_read.read(model.SerializeToString())
        assert_same_graph(compact.load_graph(model.SerializeToString()), to_graph(model), ours=False)
    ort_file = next(shared.glob("ort_artifacts/*/*.ort"), None) if (shared / "ort_artifacts").exists() else None
    if ort_file is not None:
        with pytest.raises(onnx_read.NeedsOnnx, match="ORT-format"):
            onnx_read.read(ort_file.read_bytes())
    ext = _typed_tensor_model()
    onnx.save(ext, tmp_path / "ext.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
              location="ext.bin", size_threshold=0)
    with pytest.raises(onnx_read.NeedsOnnx, match="outside the file"):
        onnx_read.read((tmp_path / "ext.onnx").read_bytes())
    assert_same_graph(compact.load_graph(tmp_path / "ext.onnx"), to_graph(str(tmp_path / "ext.onnx")), ours=False)


def test_hostile_bytes_raise_edgetrain_errors_only(shared):
    """Truncations and byte flips of a real training model: a clear refusal (NeedsOnnx sends the file to
    onnx_io) or a graph, never an IndexError, a MemoryError or a hang."""
    data = (shared / "ort_artifacts" / "mlp" / "training_model.onnx").read_bytes()
    rng = np.random.default_rng(0)
    structure = data[:4096] if len(data) > 4096 else data      # flips in the graph, not in the weights
    for cut in sorted(set(rng.integers(0, len(data), 150).tolist()) | {1, 2, 3, 10}):
        try:
            onnx_read.read(data[:cut])
        except EdgetrainError:
            pass
    for _ in range(300):
        buf = bytearray(data)
        k = int(rng.integers(0, len(structure)))
        buf[k] = int(rng.integers(0, 256))
        try:
            onnx_read.read(bytes(buf))
        except EdgetrainError:
            pass
    huge = TensorProto(name="big", data_type=TensorProto.FLOAT, dims=[2**40, 2**40], raw_data=bytes(8))
    model = _typed_tensor_model()
    model.graph.initializer.append(huge)
    with pytest.raises(onnx_read.NeedsOnnx, match="'big'.s raw data does not fill its dims"):
        onnx_read.read(model.SerializeToString())
    huge.ClearField("raw_data")
    model.graph.initializer[-1].CopyFrom(huge)
    with pytest.raises(onnx_read.NeedsOnnx, match="'big' has no data"):
        onnx_read.read(model.SerializeToString())
    model.graph.initializer[-1].CopyFrom(TensorProto(name="big", data_type=TensorProto.FLOAT, dims=[0] * 65))
    with pytest.raises(onnx_read.NeedsOnnx, match="more than 64"):
        onnx_read.read(model.SerializeToString())


NO_ONNX = textwrap.dedent(r'''
    import json, sys
    import numpy as np
    from edgetrain.api import CheckpointState, Module, Optimizer
    art, model = sys.argv[1], sys.argv[2]
    state = CheckpointState.load_checkpoint(art + "/checkpoint")
    module = Module(art + "/training_model.onnx", state, art + "/eval_model.onnx")
    opt = Optimizer(art + "/optimizer_model.onnx", module)
    rng = np.random.default_rng(0)
    loss = float(module(rng.standard_normal((4, 64)).astype(np.float32), rng.integers(0, 10, 4)))
    opt.step()
    before = sorted(m for m in sys.modules if m == "onnx" or m.startswith(("onnx.", "google.protobuf")))
    before += ["flatbuffers"] if "flatbuffers" in sys.modules else []    # the checkpoint writer's: not to train
    import edgetrain
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    (y,) = edgetrain.InferenceSession(model).run(None, {"x": x})
    print(json.dumps({"before": before, "loss": loss, "y": y.tolist(), "onnx_after": "onnx" in sys.modules}))
''')


@pytest.mark.native
def test_a_module_from_onnx_artifacts_imports_neither_onnx_nor_protobuf(shared, tmp_path):
    """Nor flatbuffers: a process that only loads a checkpoint does not import its writer."""
    from onnx.reference import ReferenceEvaluator
    model = _function_op_model()
    onnx.save(model, tmp_path / "celu.onnx")
    script = tmp_path / "no_onnx.py"
    script.write_text(NO_ONNX)
    r = subprocess.run([sys.executable, str(script), str(shared / "ort_artifacts" / "digits"),
                        str(tmp_path / "celu.onnx")], capture_output=True, text=True, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["before"] == [] and np.isfinite(out["loss"])
    # the function op (Celu, inlined by onnx_io through onnx's body) still works: onnx is imported for it
    assert out["onnx_after"]
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(out["y"], ReferenceEvaluator(model).run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)
