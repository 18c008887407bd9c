"""Ops ONNX defines by a function body, run through that body (edgetrain/inline.py): Attention and a few
element-wise function ops against onnxruntime (forward), Attention's gradient against torch's
``scaled_dot_product_attention`` autograd, refusals that name the model's node. The exported-model test with
the dynamo exporter at opset 23 (tests/test_exporters.py, ``sdpa_attention``) covers artifacts -> train ->
export -> onnxruntime."""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import edgetrain
from edgetrain.errors import UnsupportedOpError
from edgetrain.onnx_io import to_graph

ort = pytest.importorskip("onnxruntime")

BOOL, FLOAT = TensorProto.BOOL, TensorProto.FLOAT


def _model(op, inputs, outputs, opset, attrs=None, domain=""):
    """One ``op`` node named 'the_node'; ``inputs``: name -> array (empty name: an omitted input)."""
    vis = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
           for n, a in inputs.items() if n]
    outs = [helper.make_tensor_value_info(n, FLOAT, None) for n in outputs]
    node = helper.make_node(op, list(inputs), outputs, name="the_node", domain=domain, **(attrs or {}))
    return helper.make_model(helper.make_graph([node], "g", vis, outs),
                             opset_imports=[helper.make_opsetid("", opset)])


def _both(model, feeds):
    data = model.SerializeToString()
    got = edgetrain.InferenceSession(data).run(None, feeds)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)
    return got, want


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("op, opset, attrs", [
    ("Swish", 24, {"alpha": 0.7}), ("Celu", 12, {"alpha": 1.3}), ("Shrink", 9, {"bias": 0.1, "lambd": 0.4}),
    ("Shrink", 23, {"lambd": 0.2}), ("Softsign", 22, {}), ("ThresholdedRelu", 22, {"alpha": 0.3}),
    ("Mish", 22, {})])
def test_function_op_matches_onnxruntime(op, opset, attrs):
    x = _rand(np.random.default_rng(0), 3, 5)
    model = _model(op, {"x": x}, ["y"], opset, attrs)
    assert op not in {n.op_type for n in to_graph(model).nodes}     # run through its body, not a kernel
    (got,), (want,) = _both(model, {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_rotary_embedding_matches_onnxruntime():
    rng = np.random.default_rng(1)
    x = _rand(rng, 2, 3, 4, 8)                      # batch, heads, sequence, head size (4-D: no num_heads)
    cos, sin = np.cos(_rand(rng, 2, 4, 4)), np.sin(_rand(rng, 2, 4, 4))     # batch, sequence, head size / 2
    model = _model("RotaryEmbedding", {"x": x, "cos": cos, "sin": sin}, ["y"], 23, {"interleaved": 1})
    model.graph.node[0].input[:] = ["x", "cos", "sin"]
    (got,), (want,) = _both(model, {"x": x, "cos": cos, "sin": sin})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


B, QH, KVH, S, L, H = 2, 4, 2, 3, 5, 8


def _attention_case(name, rng):
    """(inputs, outputs, attrs) of one Attention variant."""
    q, k, v = _rand(rng, B, QH, S, H), _rand(rng, B, QH, L, H), _rand(rng, B, QH, L, H)
    inputs, outputs, attrs = {"Q": q, "K": k, "V": v}, ["Y"], {}
    if name == "3d_gqa":
        inputs = {"Q": _rand(rng, B, S, QH * H), "K": _rand(rng, B, L, KVH * H), "V": _rand(rng, B, L, KVH * H)}
        attrs = {"q_num_heads": QH, "kv_num_heads": KVH}
    elif name == "4d_gqa":
        inputs.update(K=_rand(rng, B, KVH, L, H), V=_rand(rng, B, KVH, L, H))
    elif name == "causal":
        attrs = {"is_causal": 1}
    elif name == "bool_mask":
        inputs["mask"] = rng.random((S, L)) > 0.3
        inputs["mask"][:, 0] = True         # no row fully masked (ORT and ONNX's body differ there)
    elif name == "float_mask":
        inputs["mask"] = _rand(rng, B, 1, S, L)
    elif name == "scale_softcap":
        attrs = {"scale": 0.7, "softcap": 2.0}
    elif name == "past_key_value":
        inputs.update(mask=_rand(rng, S, L + 2), past_key=_rand(rng, B, QH, 2, H),
                      past_value=_rand(rng, B, QH, 2, H))
        outputs = ["Y", "present_key", "present_value"]
    return inputs, outputs, attrs


ATTENTION_CASES = ["4d", "3d_gqa", "4d_gqa", "causal", "bool_mask", "float_mask", "scale_softcap",
                   "past_key_value"]


@pytest.mark.parametrize("name", ATTENTION_CASES)
def test_attention_matches_onnxruntime(name):
    inputs, outputs, attrs = _attention_case(name, np.random.default_rng(2))
    model = _model("Attention", inputs, outputs, 23, attrs)
    got, want = _both(model, inputs)
    assert len(got) == len(outputs)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["causal", "4d_gqa", "float_mask", "scale_softcap"])
def test_attention_gradient_matches_torch(name):
    """dQ, dK, dV of Attention's body (edgetrain's autodiff over its ops) against torch's SDPA autograd."""
    torch = pytest.importorskip("torch")
    from edgetrain.forward_backward import ForwardBackward

    rng = np.random.default_rng(3)
    inputs, _, attrs = _attention_case(name, rng)
    model = _model("Attention", inputs, ["Y"], 23, attrs)
    fb = ForwardBackward(model, weights=[], input_grads=["Q", "K", "V"])
    (y,), ctx = fb.forward(inputs)
    dy = _rand(rng, *y.shape)
    grads = fb.backward(ctx, [dy])

    q, k, v = (torch.tensor(inputs[n], dtype=torch.float64, requires_grad=True) for n in "QKV")
    mask = torch.tensor(inputs["mask"], dtype=torch.float64) if "mask" in inputs else None
    if name == "scale_softcap":       # softcap has no SDPA form: its definition, softcap * tanh(s / softcap)
        scores = torch.tanh(q @ k.transpose(-1, -2) * attrs["scale"] / attrs["softcap"]) * attrs["softcap"]
        want = scores.softmax(-1) @ v
    else:
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                                is_causal=name == "causal", enable_gqa=True)
    (want * torch.tensor(dy, dtype=torch.float64)).sum().backward()
    np.testing.assert_allclose(y, want.detach().numpy(), rtol=1e-4, atol=1e-5)
    for n, t in zip("QKV", (q, k, v)):
        np.testing.assert_allclose(grads[n], t.grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=f"d{n}")


def test_ops_in_the_table_keep_their_kernel():
    """LayerNormalization has a function body too; edgetrain's own kernel (and gradient) stay in use."""
    x = _rand(np.random.default_rng(4), 2, 6)
    model = _model("LayerNormalization", {"x": x, "scale": np.ones(6, np.float32)}, ["y"], 17)
    assert [n.op_type for n in to_graph(model).nodes] == ["LayerNormalization"]


def test_body_with_an_unsupported_op_is_refused_naming_the_node(monkeypatch):
    from edgetrain import inline
    from edgetrain.ops import OP_TABLE

    # inline's view of the table without MatMul (Softmax would not do: ONNX defines it by a body too); deleting
    # from the shared table would leave it reordered for later tests
    monkeypatch.setattr(inline, "OP_TABLE", {k: v for k, v in OP_TABLE.items() if k != ("", "MatMul")})
    inputs, outputs, attrs = _attention_case("4d", np.random.default_rng(5))
    with pytest.raises(UnsupportedOpError, match=r"node 'the_node' \(Attention.*needs op 'MatMul'"):
        to_graph(_model("Attention", inputs, outputs, 23, attrs))


def _local_function(calls="Softsign"):
    """A model calling model-local function local.F, whose body applies ``calls`` (possibly F itself) with
    attribute alpha referring to F's (default 0.5)."""
    inner = helper.make_node(calls, ["a"], ["b"], domain="local" if calls == "F" else "")
    if calls == "Swish":
        inner.attribute.append(helper.make_attribute_ref("alpha", onnx.AttributeProto.FLOAT))
    f = helper.make_function("local", "F", ["a"], ["b"], [inner],
                             [helper.make_opsetid("", 24), helper.make_opsetid("local", 1)],
                             attribute_protos=[helper.make_attribute("alpha", 0.5)])
    x = helper.make_tensor_value_info("x", FLOAT, [4])
    g = helper.make_graph([helper.make_node("F", ["x"], ["y"], name="the_call", domain="local")], "g", [x],
                          [helper.make_tensor_value_info("y", FLOAT, [4])])
    return helper.make_model(g, functions=[f], opset_imports=[helper.make_opsetid("", 24),
                                                              helper.make_opsetid("local", 1)])


@pytest.mark.parametrize("calls", ["Softsign", "Swish"])
def test_model_local_function_is_inlined(calls):
    """Swish: a function op inside a local function (two levels), its alpha from the function's default."""
    x = np.linspace(-2, 2, 4, dtype=np.float32)
    (got,), (want,) = _both(_local_function(calls), {"x": x})
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_nested_refusal_names_the_models_node(monkeypatch):
    from edgetrain import inline
    from edgetrain.ops import OP_TABLE

    # inline's view of the table without Sigmoid (Swish's body needs it)
    monkeypatch.setattr(inline, "OP_TABLE", {k: v for k, v in OP_TABLE.items() if k != ("", "Sigmoid")})
    with pytest.raises(UnsupportedOpError, match=r"node 'the_call' \(F, local.*needs op 'Sigmoid'"):
        to_graph(_local_function("Swish"))


def test_recursive_function_is_refused_at_the_depth_limit():
    with pytest.raises(UnsupportedOpError, match=r"node 'the_call' \(F, local.*levels deep"):
        to_graph(_local_function(calls="F"))


def test_ops_cli_lists_function_ops(capsys):
    from edgetrain.cli import main

    assert main(["ops"]) == 0
    out = capsys.readouterr().out
    assert "Attention" in out and "function body" in out


def test_local_functions_that_multiply_the_graph_are_refused_by_node_count(monkeypatch):
    """F0 calls F1 twenty times, F1 calls F2 twenty times, ...: a few hundred bytes that would inline to 20**6
    nodes. Refused once the graph passes the cap (lowered here to keep the test quick), naming the model's node."""
    from edgetrain import inline

    monkeypatch.setattr(inline, "MAX_NODES", 20_000)
    fans, levels = 20, 7
    functions = []
    for level in range(levels):
        if level == levels - 1:
            body = [helper.make_node("Relu", ["a"], ["b"])]
        else:
            body, prev = [], "a"
            for k in range(fans):
                body.append(helper.make_node(f"F{level + 1}", [prev], [f"t{k}"], domain="local"))
                prev = f"t{k}"
            body.append(helper.make_node("Identity", [prev], ["b"]))
        functions.append(helper.make_function("local", f"F{level}", ["a"], ["b"], body,
                                              [helper.make_opsetid("", 21), helper.make_opsetid("local", 1)]))
    x = helper.make_tensor_value_info("x", FLOAT, [4])
    g = helper.make_graph([helper.make_node("F0", ["x"], ["y"], name="the_call", domain="local")], "g", [x],
                          [helper.make_tensor_value_info("y", FLOAT, [4])])
    model = helper.make_model(g, functions=functions, opset_imports=[helper.make_opsetid("", 21),
                                                                     helper.make_opsetid("local", 1)])
    assert fans ** (levels - 1) > inline.MAX_NODES
    with pytest.raises(UnsupportedOpError, match=r"'the_call'.*grows the graph past 20,000 nodes"):
        to_graph(model)
