"""Nothing read from a file becomes code: every attribute of every op is checked against the op's schema.

A hostile value is put in every attribute each op of the table accepts (and in one it does not), through each
way a model arrives: an ONNX file (``InferenceSession``), a graph built in memory and planned, a compact ``.etm``
model, a training model bound by ``Module`` and the ``edgetrain train`` command. Each is refused naming the node
and the attribute, the payload -- valid Python if it were pasted into a generated kernel -- never runs, and no
generated file in the kernel cache contains it. The declared schemas are checked against ONNX's own (names,
kinds, defaults), an oracle edgetrain did not write.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import helper

import edgetrain
from edgetrain import compact
from edgetrain.errors import AttributeValueError, ModelLoadError
from edgetrain.ir import Graph, Node, TensorType, Value
from edgetrain.ops import OP_TABLE
from edgetrain.ops.attrs import REQUIRED
from edgetrain.plan import make_plan

pytestmark = pytest.mark.arm64

OPS = sorted(OP_TABLE.items())
UNKNOWN = "edgetrain_unknown_attribute"


@pytest.fixture
def marker(tmp_path, monkeypatch):
    """A file the payload would create, and a fresh kernel cache whose generated files are searched."""
    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path / "cache"))
    path = tmp_path / "pwned"
    yield path
    assert not path.exists(), "the payload ran"
    for f in (tmp_path / "cache").rglob("*.py"):
        assert "__import__" not in f.read_text(), f"generated file {f} holds the payload"


def _payload(marker) -> str:
    """Python that runs when pasted in place of a number in a fused kernel's line ``t0 = (... np.float32(ALPHA)
    * x0)``: it closes the line, touches ``marker`` at module level, and reopens a block for the rest of the
    function body, so the generated module imports cleanly (before edgetrain checked attributes, it did)."""
    return (f"0.5) * x0)\n__import__('pathlib').Path({str(marker)!r}).touch()\n"
            "if True:\n    if True:\n        t0 = (np.float32(1")


def _graph(op_type: str, domain: str, attrs: dict) -> Graph:
    node = Node(op_type, ["x"], ["y"], attrs, "victim", domain)
    return Graph([node], [Value("x", TensorType(np.float32, (2, 3)))], [Value("y", None)], {},
                 {"": 17, "com.microsoft": 1, "ai.edgetrain": 1})


def _model(op_type: str, domain: str, name: str, value) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3])
    y = helper.make_empty_tensor_value_info("y")
    node = helper.make_node(op_type, ["x"], ["y"], name="victim", domain=domain)
    node.attribute.append(helper.make_attribute(name, value))
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1),
              helper.make_opsetid("ai.edgetrain", 1)]
    return helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=opsets, ir_version=8)


def _targets(op) -> list[str]:
    return sorted(op.attrs) + [UNKNOWN]


@pytest.mark.parametrize("key,op", OPS, ids=[f"{d}::{o}" if d else o for (d, o), _ in OPS])
def test_hostile_string_in_every_attribute_is_refused_everywhere(key, op, marker):
    payload = _payload(marker)
    domain, op_type = key
    for name in _targets(op):
        where = rf"'victim'.*attribute '?{name}'?"
        with pytest.raises(AttributeValueError, match=where):              # an ONNX file
            edgetrain.InferenceSession(_model(op_type, domain, name, payload).SerializeToString())
        graph = _graph(op_type, domain, {name: payload})
        with pytest.raises(AttributeValueError, match=where):              # a graph built in memory, planned
            make_plan(graph, {"x": TensorType(np.float32, (2, 3))}, ["y"])
        with pytest.raises(ModelLoadError, match=where):                   # a compact model
            compact.loads(compact.dumps(_graph(op_type, domain, {name: payload})))


NOT_NUMBERS = [float("nan"), float("inf"), -float("inf"), "1.0", b"1", [1.0], None]


@pytest.mark.parametrize("key,op", OPS, ids=[f"{d}::{o}" if d else o for (d, o), _ in OPS])
def test_numeric_attributes_take_finite_numbers_in_range_only(key, op):
    """Floats must be finite numbers; ints integers within int64 (and their range or choices)."""
    domain, op_type = key
    for name, spec in op.attrs.items():
        bad = {"float": NOT_NUMBERS[:-1] + [True], "int": [1.5, "3", 2 ** 64, float("nan"), spec.high + 1],
               "ints": [[1, "2"], [2 ** 63], "12"], "floats": [[1.0, float("nan")], ["1"]],
               "string": [3, b"\xff\xfe"], "tensor": ["1", [1, 2]],
               "strings": [[3], "ab", [b"\xff\xfe"]]}[spec.kind]
        for value in bad:
            with pytest.raises(AttributeValueError, match=f"'victim'.*'{name}'"):
                OP_TABLE[key].checked_attrs(Node(op_type, ["x"], ["y"], {name: value}, "victim", domain))


def test_the_leaky_relu_exploit_end_to_end(marker):
    """The reported attack: LeakyRelu's alpha as a string reached the fused kernel's source and ran when the
    plan was compiled. Now the model is refused on load and a valid alpha still computes the right answer."""
    bad = _model("LeakyRelu", "", "alpha", _payload(marker))
    with pytest.raises(AttributeValueError, match="'victim'.*'alpha' must be a number"):
        edgetrain.InferenceSession(bad.SerializeToString())
    good = _model("LeakyRelu", "", "alpha", 0.25)
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    (y,) = edgetrain.InferenceSession(good.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(y, np.where(x >= 0, x, np.float32(0.25) * x))


def test_generated_source_formats_only_numbers():
    """The last line of defence: codegen refuses to format anything but a finite number."""
    from edgetrain.codegen import number_literal
    assert number_literal(0.1, "a") == "0.1" and number_literal(np.float32(2.5), "a") == "2.5"
    assert number_literal(np.int64(-3), "a") == "-3"
    for value in ["0.1", float("nan"), float("inf"), True, None, b"1", [1]]:
        with pytest.raises(AttributeValueError):
            number_literal(value, "a")


# -- through training: a tampered training model bound by Module, and the CLI -------------------------------

def _leaky_artifacts(tmp_path):
    from edgetrain import artifacts
    rng = np.random.default_rng(0)
    w = helper.make_tensor("w", onnx.TensorProto.FLOAT, [4, 3], rng.standard_normal(12).astype(np.float32).tolist())
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("LeakyRelu", ["h"], ["y"], alpha=0.1)]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["N", 3])], [w])
    path = tmp_path / "leaky.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    out = tmp_path / "art"
    artifacts.generate_artifacts(str(path), requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=str(out))
    return out


def _tamper(model_path, op_type: str, name: str, value) -> None:
    m = onnx.load(model_path)
    (node,) = [n for n in m.graph.node if n.op_type == op_type]
    kept = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(kept + [helper.make_attribute(name, value)])
    onnx.save(m, model_path)


def test_tampered_training_model_is_refused_by_module(tmp_path, marker):
    from edgetrain.api import CheckpointState, Module
    art = _leaky_artifacts(tmp_path)
    _tamper(art / "training_model.onnx", "LeakyReluGrad", "alpha", _payload(marker))
    state = CheckpointState.load_checkpoint(art / "checkpoint")
    with pytest.raises(AttributeValueError, match="LeakyReluGrad.*'alpha' must be a number"):
        Module(art / "training_model.onnx", state, art / "eval_model.onnx")


@pytest.mark.native
def test_tampered_training_model_is_refused_by_the_cli(tmp_path, marker):
    art = _leaky_artifacts(tmp_path)
    _tamper(art / "training_model.onnx", "LeakyReluGrad", "alpha", _payload(marker))
    data = tmp_path / "d.npz"
    np.savez(data, x=np.ones((8, 4), np.float32), target=np.ones((8, 3), np.float32))
    env = dict(os.environ, EDGETRAIN_CACHE_DIR=str(tmp_path / "cache"))
    cli = "import sys; from edgetrain.cli import main; sys.exit(main())"
    r = subprocess.run([sys.executable, "-c", cli, "train", str(art), "--data", str(data), "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode != 0 and "Traceback" not in r.stderr
    assert "LeakyReluGrad" in r.stderr and "'alpha' must be a number" in r.stderr


# -- the schemas against ONNX's own -------------------------------------------------------------------------

ONNX_KIND = {onnx.AttributeProto.INT: "int", onnx.AttributeProto.FLOAT: "float",
             onnx.AttributeProto.STRING: "string", onnx.AttributeProto.INTS: "ints",
             onnx.AttributeProto.FLOATS: "floats", onnx.AttributeProto.TENSOR: "tensor",
             onnx.AttributeProto.STRINGS: "strings"}
# attributes ONNX defines at opsets 13-21 that edgetrain refuses on purpose (it has no string tensors)
NOT_ACCEPTED = {("Constant", "value_string"), ("Constant", "value_strings"), ("Constant", "sparse_value")}


def _onnx_schemas(op_type: str) -> dict[int, onnx.defs.OpSchema]:
    out = {}
    for version in range(1, onnx.defs.onnx_opset_version() + 1):
        try:
            s = onnx.defs.get_schema(op_type, version, "")
        except onnx.defs.SchemaError:
            continue
        out[s.since_version] = s
    return out


@pytest.mark.parametrize("op_type", sorted(o for (d, o) in OP_TABLE if d == "" and _onnx_schemas(o)))
def test_declared_attributes_match_onnx_schemas(op_type):
    """Every declared attribute exists in some ONNX version of the op with the same kind and default, and every
    attribute of the versions edgetrain loads (13-21) is declared (or refused on purpose)."""
    op = OP_TABLE[("", op_type)]
    schemas = _onnx_schemas(op_type)
    loaded = {n for v, s in schemas.items() for n in s.attributes
              if any(onnx.defs.get_schema(op_type, k, "").since_version == v for k in range(13, 22)
                     if _has_schema(op_type, k))}
    for name, spec in op.attrs.items():
        found = [s.attributes[name] for _, s in sorted(schemas.items()) if name in s.attributes]
        assert found, f"{op_type}: '{name}' is in no ONNX version of the op"
        a = found[-1]          # its newest definition (Cast-1 took 'to' as a string, later versions an int)
        assert ONNX_KIND[a.type] == spec.kind, f"{op_type}.{name}: ONNX says {a.type}"
        if a.default_value.name:
            want = helper.get_attribute_value(a.default_value)
            want = want.decode() if isinstance(want, bytes) else want
            if spec.kind == "strings":
                want = tuple(w.decode() for w in want)
            if spec.kind == "float":
                assert math.isclose(spec.default, want, rel_tol=1e-6), f"{op_type}.{name}: {want}"
            else:
                assert spec.default == want, f"{op_type}.{name}: default {spec.default}, ONNX {want}"
        elif a.required and name in loaded:    # older forms (Pad's pads, ...) became inputs: optional here
            assert spec.default is REQUIRED, f"{op_type}.{name} is required in ONNX"
    missing = {n for n in loaded if n not in op.attrs and (op_type, n) not in NOT_ACCEPTED}
    assert not missing, f"{op_type}: ONNX attributes {sorted(missing)} are not declared"


def _has_schema(op_type: str, version: int) -> bool:
    try:
        onnx.defs.get_schema(op_type, version, "")
        return True
    except onnx.defs.SchemaError:
        return False
