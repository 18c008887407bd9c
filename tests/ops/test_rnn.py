"""LSTM, GRU and RNN: forward against onnxruntime (layout 0; layout 1 against onnxruntime on the transposed
layout-0 model, since its CPU kernels refuse batch-first), gradients against PyTorch's autograd (torch's gate
orders mapped to ONNX's iofc / zrh) and by finite differences in float64 over every direction, both layouts,
initial states, sequence lengths, peepholes, linear_before_reset and Relu/Sigmoid activations.
"""
import zlib

import numpy as np
import pytest
from onnx import helper
from oracle import model, run_edgetrain, run_onnxruntime

from edgetrain.errors import EdgetrainError
from edgetrain.ir import Node, TensorType

T, B, I, H = 5, 3, 4, 6
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DIRECTIONS = {"forward": 1, "reverse": 1, "bidirectional": 2}


def _inputs(op, direction, rng, dtype, layout=0, bias=True, sl=False, h0=False, peep=False, batch=B):
    """Named inputs of a recurrent node in ONNX order ("" for the absent ones)."""
    d, g = DIRECTIONS[direction], GATES[op]
    x = rng.standard_normal((T, batch, I) if layout == 0 else (batch, T, I)).astype(dtype)
    state = (d, batch, H) if layout == 0 else (batch, d, H)
    values = {"X": x, "W": (rng.standard_normal((d, g * H, I)) * 0.5).astype(dtype),
              "R": (rng.standard_normal((d, g * H, H)) * 0.5).astype(dtype)}
    if bias:
        values["B"] = (rng.standard_normal((d, 2 * g * H)) * 0.5).astype(dtype)
    if sl:
        values["SL"] = np.array(([T, 2, 4] * batch)[:batch], np.int32)
    if h0:
        values["H0"] = rng.standard_normal(state).astype(dtype)
        if op == "LSTM":
            values["C0"] = rng.standard_normal(state).astype(dtype)
    if peep:
        values["P"] = (rng.standard_normal((d, 3 * H)) * 0.5).astype(dtype)
    order = ["X", "W", "R", "B", "SL", "H0"] + (["C0", "P"] if op == "LSTM" else [])
    names = [n if n in values else "" for n in order]
    while not names[-1]:
        names.pop()
    return names, values


def _outputs(op):
    return ["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"]


FORWARD = [(op, direction, extra)
           for op, extras in (("LSTM", [{}, {"peep": True}]), ("GRU", [{"lbr": 0}, {"lbr": 1}]),
                              ("RNN", [{}]))
           for direction in DIRECTIONS for extra in extras]


@pytest.mark.parametrize("op,direction,extra", FORWARD, ids=[f"{o}-{d}-{e}" for o, d, e in FORWARD])
def test_forward_against_onnxruntime(op, direction, extra):
    rng = np.random.default_rng(zlib.crc32(f"{op}{direction}{extra}".encode()))
    names, values = _inputs(op, direction, rng, np.float32, sl=True, h0=True, peep=extra.get("peep", False))
    attrs = {"hidden_size": H, "direction": direction}
    if "lbr" in extra:
        attrs["linear_before_reset"] = extra["lbr"]
    m = model(helper.make_node(op, names, _outputs(op), **attrs), {"X": values["X"]}, _outputs(op),
              {k: v for k, v in values.items() if k != "X"})
    ours, ref = run_edgetrain(m, {"X": values["X"]}), run_onnxruntime(m, {"X": values["X"]})
    for a, b in zip(ours, ref):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
def test_layout1_against_onnxruntime_layout0(op):
    """Batch-first (layout=1) equals the layout-0 node on transposed X and states, as onnxruntime runs it."""
    rng = np.random.default_rng(zlib.crc32(op.encode()))
    names, values = _inputs(op, "bidirectional", rng, np.float32, layout=1, sl=True, h0=True)
    outs = _outputs(op)
    m1 = model(helper.make_node(op, names, outs, hidden_size=H, direction="bidirectional", layout=1),
               {"X": values["X"]}, outs, {k: v for k, v in values.items() if k != "X"})
    v0 = dict(values, X=values["X"].transpose(1, 0, 2), H0=values["H0"].transpose(1, 0, 2))
    if op == "LSTM":
        v0["C0"] = values["C0"].transpose(1, 0, 2)
    m0 = model(helper.make_node(op, names, outs, hidden_size=H, direction="bidirectional"), {"X": v0["X"]},
               outs, {k: v for k, v in v0.items() if k != "X"})
    ours = run_edgetrain(m1, {"X": values["X"]})
    ref = run_onnxruntime(m0, {"X": v0["X"]})
    np.testing.assert_allclose(ours[0], ref[0].transpose(2, 0, 1, 3), rtol=1e-5, atol=1e-6)
    for a, b in zip(ours[1:], ref[1:]):
        np.testing.assert_allclose(a, b.transpose(1, 0, 2), rtol=1e-5, atol=1e-6)


def test_relu_and_sigmoid_activations_against_onnxruntime():
    rng = np.random.default_rng(7)
    for op, acts in (("RNN", ["Relu", "Sigmoid"]), ("GRU", ["Sigmoid", "Relu"] * 2),
                     ("LSTM", ["Sigmoid", "Relu", "Tanh", "Sigmoid", "Tanh", "Relu"])):
        if op == "RNN":
            acts = ["Relu", "Sigmoid"]
        names, values = _inputs(op, "bidirectional", rng, np.float32, h0=True)
        m = model(helper.make_node(op, names, _outputs(op), hidden_size=H, direction="bidirectional",
                                   activations=acts), {"X": values["X"]}, _outputs(op),
                  {k: v for k, v in values.items() if k != "X"})
        for a, b in zip(run_edgetrain(m, {"X": values["X"]}), run_onnxruntime(m, {"X": values["X"]})):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"{op} {acts}")


GRADIENT = [("LSTM", "forward", {}), ("LSTM", "bidirectional", {"sl": True, "h0": True, "peep": True}),
            ("LSTM", "reverse", {"layout": 1, "h0": True, "sl": True}),
            ("GRU", "forward", {"lbr": 1, "h0": True}), ("GRU", "bidirectional", {"lbr": 0, "sl": True}),
            ("GRU", "reverse", {"lbr": 1, "layout": 1, "sl": True, "h0": True}),
            ("RNN", "bidirectional", {"h0": True, "sl": True}),
            ("RNN", "reverse", {"layout": 1, "acts": ["Relu"]}),
            ("LSTM", "forward", {"bias": False, "acts": ["Sigmoid", "Relu", "Tanh"]})]


@pytest.mark.parametrize("op,direction,extra", GRADIENT, ids=[f"{o}-{d}-{e}" for o, d, e in GRADIENT])
def test_gradients_by_finite_differences(op, direction, extra):
    from gradcheck import check_gradients
    rng = np.random.default_rng(zlib.crc32(f"{op}{direction}{extra}".encode()))
    layout = extra.get("layout", 0)
    names, values = _inputs(op, direction, rng, np.float64, layout=layout, bias=extra.get("bias", True),
                            sl=extra.get("sl", False), h0=extra.get("h0", False),
                            peep=extra.get("peep", False))
    attrs = {"hidden_size": H, "direction": direction, "layout": layout}
    if "lbr" in extra:
        attrs["linear_before_reset"] = extra["lbr"]
    if "acts" in extra:
        attrs["activations"] = extra["acts"] * DIRECTIONS[direction]
    outs = _outputs(op)
    params = {k: v for k, v in values.items() if k != "SL"}
    consts = {"SL": values["SL"]} if "SL" in values else {}
    probe = model(helper.make_node(op, names, outs, **attrs), {"X": values["X"]}, outs,
                  {k: v for k, v in values.items() if k != "X"}, opset=17)
    types = [TensorType(np.float64, a.shape) for a in run_edgetrain(probe, {"X": values["X"]})]
    check_gradients([Node(op, names, outs, attrs, "rnn")], params, outs, types, consts, samples=5)


def _torch_cell(op, direction, values, h0):
    """The same recurrent layer in PyTorch, its weights mapped from ONNX's gate order."""
    import torch
    d = DIRECTIONS[direction]
    layer = {"LSTM": torch.nn.LSTM, "GRU": torch.nn.GRU, "RNN": torch.nn.RNN}[op](
        I, H, bidirectional=d == 2, dtype=torch.float64)
    # ONNX iofc -> torch ifgo; ONNX zrh -> torch rzn
    perm = {"LSTM": [0, 2, 3, 1], "GRU": [1, 0, 2], "RNN": [0]}[op]

    def reorder(a):
        return np.concatenate([a[k * H:(k + 1) * H] for k in perm])
    g = GATES[op]
    with torch.no_grad():
        for k in range(d):
            sfx = "_reverse" if k else ""
            getattr(layer, f"weight_ih_l0{sfx}").copy_(torch.from_numpy(reorder(values["W"][k])))
            getattr(layer, f"weight_hh_l0{sfx}").copy_(torch.from_numpy(reorder(values["R"][k])))
            getattr(layer, f"bias_ih_l0{sfx}").copy_(torch.from_numpy(reorder(values["B"][k, :g * H])))
            getattr(layer, f"bias_hh_l0{sfx}").copy_(torch.from_numpy(reorder(values["B"][k, g * H:])))
    return layer, reorder


@pytest.mark.parametrize("op", ["LSTM", "GRU", "RNN"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_gradients_against_torch(op, direction):
    """Loss sum(C * Y) + sum(C_h * Y_h): dX, dW, dR, dB and dH0 against torch's autograd (GRU: torch's is the
    linear_before_reset=1 form)."""
    import torch
    from gradcheck import gradient_session
    rng = np.random.default_rng(zlib.crc32(f"torch{op}{direction}".encode()))
    names, values = _inputs(op, direction, rng, np.float64, h0=True)
    attrs = {"hidden_size": H, "direction": direction}
    if op == "GRU":
        attrs["linear_before_reset"] = 1
    outs = _outputs(op)[:2]
    d = DIRECTIONS[direction]
    types = [TensorType(np.float64, (T, d, B, H)), TensorType(np.float64, (d, B, H))]
    sess, graph = gradient_session([Node(op, names, outs, attrs, "rnn")], values, {}, outs, types)
    results = sess.run(None, dict(values))
    grads = dict(zip(values, results[1:]))
    cot_y, cot_h = graph.initializers["cot_0"], graph.initializers["cot_1"]

    layer, reorder = _torch_cell(op, direction, values, True)
    x = torch.from_numpy(values["X"]).requires_grad_()
    h0 = torch.from_numpy(values["H0"]).requires_grad_()
    state = (h0, torch.from_numpy(values["C0"]).requires_grad_()) if op == "LSTM" else h0
    y, hn = layer(x, state)
    hn = hn[0] if op == "LSTM" else hn
    y = y.reshape(T, B, d, H).permute(0, 2, 1, 3)     # torch [T, B, D*H] -> ONNX [T, D, B, H]
    loss = (y * torch.from_numpy(cot_y)).sum() + (hn * torch.from_numpy(cot_h)).sum()
    loss.backward()
    np.testing.assert_allclose(results[0], loss.item(), rtol=1e-10)
    np.testing.assert_allclose(grads["X"], x.grad.numpy(), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(grads["H0"], h0.grad.numpy(), rtol=1e-7, atol=1e-10)
    g = GATES[op]
    for k in range(d):
        sfx = "_reverse" if k else ""
        np.testing.assert_allclose(reorder(grads["W"][k]), getattr(layer, f"weight_ih_l0{sfx}").grad.numpy(),
                                   rtol=1e-7, atol=1e-10)
        np.testing.assert_allclose(reorder(grads["R"][k]), getattr(layer, f"weight_hh_l0{sfx}").grad.numpy(),
                                   rtol=1e-7, atol=1e-10)
        for half, name in ((slice(0, g * H), "ih"), (slice(g * H, 2 * g * H), "hh")):
            np.testing.assert_allclose(reorder(grads["B"][k, half]),
                                       getattr(layer, f"bias_{name}_l0{sfx}").grad.numpy(),
                                       rtol=1e-7, atol=1e-10)


def test_training_graph_uses_onnxruntime_ops():
    """An LSTM trains as com.microsoft LSTMTraining + LSTMGrad, a GRU as GRUTraining + GRUGrad, an RNN with
    ai.edgetrain RNNGrad."""
    from gradcheck import gradient_session
    rng = np.random.default_rng(3)
    for op, want in (("LSTM", {"LSTMTraining", "LSTMGrad"}), ("GRU", {"GRUTraining", "GRUGrad"}),
                     ("RNN", {"RNN", "RNNGrad"})):
        names, values = _inputs(op, "forward", rng, np.float64)
        outs = _outputs(op)[:1]
        _, graph = gradient_session([Node(op, names, outs, {"hidden_size": H}, "rnn")], values, {}, outs,
                                    [TensorType(np.float64, (T, 1, B, H))])
        from edgetrain.autodiff.builder import with_gradients
        train = with_gradients(graph, "loss", list(values))
        assert want <= {n.op_type for n in train.nodes}


@pytest.mark.parametrize("attrs,message", [
    ({"clip": 1.0}, "clip"), ({"activations": ["Sigmoid", "Tanh", "Softsign"]}, "Softsign"),
    ({"input_forget": 1}, "input_forget"), ({"hidden_size": 5}, "hidden_size"),
    ({"activations": ["Sigmoid", "Tanh"]}, "per direction")])
def test_refusals_name_the_attribute(attrs, message):
    rng = np.random.default_rng(0)
    names, values = _inputs("LSTM", "forward", rng, np.float32)
    m = model(helper.make_node("LSTM", names, ["Y"], **attrs), {"X": values["X"]}, ["Y"],
              {k: v for k, v in values.items() if k != "X"})
    with pytest.raises(EdgetrainError, match=message):
        run_edgetrain(m, {"X": values["X"]})


def test_sequence_length_out_of_range_is_refused():
    rng = np.random.default_rng(0)
    names, values = _inputs("GRU", "forward", rng, np.float32, sl=True)
    m = model(helper.make_node("GRU", names, ["Y"], hidden_size=H), {"X": values["X"], "SL": values["SL"]},
              ["Y"], {k: v for k, v in values.items() if k not in ("X", "SL")})
    with pytest.raises(EdgetrainError, match="sequence length"):
        run_edgetrain(m, {"X": values["X"], "SL": np.array([1, T + 1, 2], np.int32)})


def test_training_form_drops_the_default_layout_as_onnxruntime_does():
    from edgetrain.autodiff.builder import prepare_for_training
    from edgetrain.ir import Graph, Value
    rng = np.random.default_rng(4)
    for op, layout in (("LSTM", 0), ("GRU", 0), ("LSTM", 1)):
        names, values = _inputs(op, "forward", rng, np.float32, layout=layout)
        graph = Graph([Node(op, names, ["Y"], {"hidden_size": H, "layout": layout}, "rnn")],
                      [Value("X", TensorType(np.float32, values["X"].shape))], [Value("Y", None)],
                      {k: v for k, v in values.items() if k != "X"}, {"": 17})
        (node,) = prepare_for_training(graph).nodes
        assert node.op_type == op + "Training" and node.domain == "com.microsoft"
        assert ("layout" in node.attrs) == (layout == 1)


@pytest.mark.ort119
def test_training_graphs_run_in_onnxruntime_119(ort):
    """onnxruntime-training 1.19.2 runs the LSTMTraining/LSTMGrad and GRUTraining/GRUGrad graphs edgetrain
    emits (forward direction, the only one its kernels take; GRU with linear_before_reset 0 and 1; LSTM with
    every output used, so dY, dY_h and dY_c all flow in) and agrees on the loss and every gradient: the
    gradient ops' input layouts are its own."""
    from gradcheck import gradient_session

    from edgetrain.autodiff.builder import with_gradients
    from edgetrain.onnx_io import from_graph
    cases = []
    for op, attrs, n_out in (("GRU", {"linear_before_reset": 1}, 2), ("GRU", {"linear_before_reset": 0}, 2),
                             ("LSTM", {}, 3), ("LSTM", {}, 1)):
        rng = np.random.default_rng(zlib.crc32(f"ort119{op}{attrs}{n_out}".encode()))
        names, values = _inputs(op, "forward", rng, np.float32, h0=True)
        outs = _outputs(op)[:n_out]
        types = [TensorType(np.float32, (T, 1, B, H))] + [TensorType(np.float32, (1, B, H))] * (n_out - 1)
        _, graph = gradient_session([Node(op, names, outs, {"hidden_size": H, **attrs}, "rnn")], values, {},
                                    outs, types)
        cases.append((from_graph(with_gradients(graph, "loss", list(values))), values))
    for (m, feeds), theirs in zip(cases, ort.run_models(cases)):
        ours = run_edgetrain(m, feeds)
        assert len(ours) == len(theirs) == 1 + len(feeds)
        for a, b in zip(ours, theirs):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_default_gate_activations_round_as_the_exact_values():
    """The default activations' kernels (``gate_sigmoid``, ``gate_tanh``; float32: a polynomial exp in
    float64) against numpy's float64 formulas: float32 results equal the float64 values rounded (what libm's
    tanhf missed on 3% of inputs), float64 ones within 4 ulp; NaN stays NaN, +-inf saturate."""
    import numba

    from edgetrain.kernels import _jit
    from edgetrain.kernels import rnn as kernels
    _jit.load_numba()

    @numba.njit
    def apply(x, s, t):
        for i in range(x.size):
            s[i] = kernels.gate_sigmoid(x[i])
            t[i] = kernels.gate_tanh(x[i])

    @numba.njit
    def apply_into(x, s, t):      # float64 intermediates stored as float32: the destination picks the form
        for i in range(x.size):
            s[i] = kernels.gate_sigmoid(x[i], s)
            t[i] = kernels.gate_tanh(x[i], t)

    rng = np.random.default_rng(11)
    x64 = np.concatenate([np.linspace(-30, 30, 600001), rng.standard_normal(100000) * 4,
                          np.linspace(-2e-4, 2e-4, 4001), [0.0, -0.0, 800.0, -800.0, np.inf, -np.inf],
                          [np.nan]])
    for dtype in (np.float32, np.float64):
        x = x64.astype(dtype)
        s, t = np.empty_like(x), np.empty_like(x)
        apply(x, s, t)
        xd = x.astype(np.float64)
        with np.errstate(over="ignore"):
            want_s, want_t = 1.0 / (1.0 + np.exp(-xd)), np.tanh(xd)
        if dtype == np.float32:
            np.testing.assert_array_equal(s, want_s.astype(np.float32))
            np.testing.assert_array_equal(t, want_t.astype(np.float32))
        else:
            np.testing.assert_array_max_ulp(s, want_s, maxulp=4)
            np.testing.assert_array_max_ulp(t, want_t, maxulp=4)
    s, t = np.empty(x64.shape, np.float32), np.empty(x64.shape, np.float32)
    apply_into(x64, s, t)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(s, (1.0 / (1.0 + np.exp(-x64))).astype(np.float32))
    np.testing.assert_array_equal(t, np.tanh(x64).astype(np.float32))
