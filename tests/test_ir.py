"""IR invariants, the ONNX import boundary and the op table's shape."""
import ast
from pathlib import Path

import numpy as np
import pytest

import edgetrain
from edgetrain.errors import GraphError
from edgetrain.ir import Graph, Node, TensorType, Value
from edgetrain.ops import OP_TABLE

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")

ROOT = Path(edgetrain.__file__).resolve().parent


def _graph(nodes, outputs=("y",)):
    t = TensorType(np.float32, ("N", 3))
    return Graph(nodes, [Value("x", t)], [Value(o, t) for o in outputs], {"w": np.ones(3, np.float32)})


def test_verify_accepts_a_well_formed_graph():
    g = _graph([Node("Add", ["x", "w"], ["t"]), Node("Relu", ["t"], ["y"])])
    assert g.verify() is g


def test_verify_rejects_double_assignment():
    with pytest.raises(GraphError, match="'t' is assigned twice"):
        _graph([Node("Relu", ["x"], ["t"]), Node("Relu", ["x"], ["t"]), Node("Relu", ["t"], ["y"])]).verify()


def test_verify_rejects_undefined_inputs_and_wrong_order():
    with pytest.raises(GraphError, match="'t' is not defined"):
        _graph([Node("Relu", ["t"], ["y"], name="first"), Node("Relu", ["x"], ["t"])]).verify()


def test_verify_rejects_unassigned_outputs():
    with pytest.raises(GraphError, match="output 'z'"):
        _graph([Node("Relu", ["x"], ["y"])], outputs=("y", "z")).verify()


def test_tensor_type_sizes():
    t = TensorType(np.float32, (2, 3))
    assert (t.size, t.nbytes, t.is_static, str(t)) == (6, 24, True, "float[2,3]")
    assert not TensorType(np.int64, ("N", 3)).is_static


def test_hand_written_frozen_records_behave_as_frozen_dataclasses():
    """``edgetrain.record.Frozen`` replaces ``@dataclass(frozen=True)`` on hot classes: the dataclass is the
    oracle for equality, hashing, repr, copies and the refusal to assign."""
    import copy
    import dataclasses
    import pickle

    @dataclasses.dataclass(frozen=True)
    class Oracle:
        dtype: np.dtype
        shape: tuple

    cases = [((np.float32, (2, "n", None)), (np.float32, (2, "n", None))), ((np.float32, (2,)), (np.float64, (2,))),
             ((np.int64, ()), (np.int64, (1,)))]
    for a, b in cases:
        mine = TensorType(*a), TensorType(*b)
        theirs = Oracle(np.dtype(a[0]), tuple(a[1])), Oracle(np.dtype(b[0]), tuple(b[1]))
        assert (mine[0] == mine[1]) == (theirs[0] == theirs[1])
        assert (hash(mine[0]) == hash(mine[1])) == (theirs[0] == theirs[1])
        assert repr(mine[0]) == "TensorType" + repr(theirs[0]).split("Oracle", 1)[1]
        for same in (pickle.loads(pickle.dumps(mine[0])), copy.deepcopy(mine[0]), copy.copy(mine[0])):
            assert same == mine[0] and hash(same) == hash(mine[0])
    t = TensorType(np.float32, [3])
    assert t.shape == (3,) and t.dtype == np.dtype(np.float32) and t != "float[3]"
    with pytest.raises(dataclasses.FrozenInstanceError, match="shape"):
        t.shape = (4,)
    with pytest.raises(dataclasses.FrozenInstanceError, match="dtype"):
        del t.dtype
    assert len({Value("x", t), Value("x", TensorType(np.float32, (3,))), Value("y", t)}) == 2


def test_only_the_onnx_import_module_imports_onnx():
    """Checked over the package's folders as installed: edgetrain/ with kernels/ and minimal_build/ inside. The
    ORT-format reader and writer turn .ort files into ModelProtos and back (host side, like onnx_io, which
    imports the reader only when it meets an .ort file); inline.py rewrites the ModelProto's function ops into
    their ONNX bodies before onnx_io builds the IR."""
    offenders = []
    source_tree = ROOT.parent / "minimal_build"           # a checkout keeps them beside edgetrain/
    paths = [*ROOT.rglob("*.py"), *(source_tree.rglob("*.py") if source_tree.is_dir() else []),
             *((ROOT.parent / "kernels").rglob("*.py") if source_tree.is_dir() else [])]
    for path in paths:
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            if any(n == "onnx" or n.startswith("onnx.") for n in names):
                offenders.append(path.name)
    assert sorted(set(offenders)) == ["inline.py", "onnx_io.py", "ortformat.py", "ortformat_writer.py"]


def test_op_table_is_sorted_and_consistent():
    keys = list(OP_TABLE)
    assert keys == sorted(keys)
    for (domain, name), op in OP_TABLE.items():
        assert (op.domain, op.op_type) == (domain, name)
        assert op.kind in ("elementwise", "alias", "kernel", "lowered", "fold")
        if op.kind == "kernel":
            family, fn = op.kernel.split(".")
            assert (ROOT / "ops" / f"{family}.py").exists()


def test_op_table_covers_the_required_ops():
    required = """Add Sub Mul Div Pow Sqrt Erf Relu LeakyRelu Sigmoid Tanh Clip Gemm MatMul Conv MaxPool AveragePool
    GlobalAveragePool BatchNormalization LayerNormalization Softmax LogSoftmax Gather Reshape Flatten Transpose Squeeze
    Unsqueeze Concat Split Slice Expand Shape Size Cast Constant Identity Dropout ReduceMean ReduceSum Sum Where Equal
    Greater Less GreaterOrEqual LessOrEqual And Mod SoftmaxCrossEntropyLoss HardSwish HardSigmoid Elu Selu Softplus
    PRelu GroupNormalization InstanceNormalization ReduceMax ReduceMin GlobalMaxPool Pad Resize""".split()
    missing = [op for op in required if ("", op) not in OP_TABLE]
    missing += [op for op in ("Gelu", "FusedMatMul", "Scale") if ("com.microsoft", op) not in OP_TABLE]
    assert not missing
