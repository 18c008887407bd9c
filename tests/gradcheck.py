"""Check gradient graphs against finite differences (an oracle edgetrain did not write)."""
from __future__ import annotations

import numpy as np

import edgetrain
from edgetrain.autodiff.builder import with_gradients
from edgetrain.ir import Graph, Node, TensorType, Value
from edgetrain.onnx_io import from_graph


def _with_loss(nodes: list[Node], outputs: list[str], cotangents: dict[str, np.ndarray]) -> list[Node]:
    """loss = sum_k sum(C_k * Y_k): its gradient is the vector-Jacobian product with C."""
    extra, terms = [], []
    for k, y in enumerate(outputs):
        extra.append(Node("Mul", [y, f"cot_{k}"], [f"prod_{k}"], {}, f"loss_mul_{k}"))
        extra.append(Node("ReduceSum", [f"prod_{k}"], [f"term_{k}"], {"keepdims": 0}, f"loss_sum_{k}"))
        terms.append(f"term_{k}")
    if len(terms) > 1:
        extra.append(Node("Sum", terms, ["loss"], {}, "loss_total"))
    else:
        extra.append(Node("Identity", terms, ["loss"], {}, "loss_id"))
    return list(nodes) + extra


def gradient_session(nodes, params, consts, outputs, out_types, opset=17, seed=0):
    rng = np.random.default_rng(seed)
    cot = {f"cot_{k}": rng.standard_normal(t.shape).astype(t.dtype) for k, t in enumerate(out_types)}
    dtype = next(iter(params.values())).dtype
    graph = Graph(_with_loss(nodes, outputs, cot), [], [Value("loss", TensorType(dtype, ()))],
                  {**params, **consts, **cot}, {"": opset, "com.microsoft": 1}, name="gradcheck")
    train = with_gradients(graph, "loss", list(params))
    sess = edgetrain.InferenceSession(from_graph(train).SerializeToString())
    return sess, graph


def check_gradients(nodes: list[Node], params: dict[str, np.ndarray], outputs: list[str],
                    out_types: list[TensorType], consts: dict | None = None, opset: int = 17,
                    eps: float = 1e-6, rtol: float = 1e-5, atol: float = 1e-7, samples: int = 6, seed: int = 0):
    """Every float parameter's gradient against central differences at ``samples`` random positions."""
    consts = consts or {}
    sess, graph = gradient_session(nodes, params, consts, outputs, out_types, opset, seed)
    feeds = dict(params)
    results = sess.run(None, feeds)
    grads = dict(zip(params, results[1:]))
    forward = edgetrain.InferenceSession(from_graph(Graph(
        graph.nodes, [Value(p, TensorType(a.dtype, a.shape)) for p, a in params.items()], graph.outputs,
        {k: v for k, v in graph.initializers.items() if k not in params}, graph.opsets)).SerializeToString())

    def loss(f):
        return float(forward.run(None, f)[0])

    rng = np.random.default_rng(seed + 1)
    for name, value in params.items():
        assert grads[name].shape == value.shape, f"{name}: gradient shape {grads[name].shape} != {value.shape}"
        flat = rng.choice(value.size, size=min(samples, value.size), replace=False)
        for k in flat:
            idx = np.unravel_index(k, value.shape)
            plus, minus = value.copy(), value.copy()
            plus[idx] += eps
            minus[idx] -= eps
            numeric = (loss({**feeds, name: plus}) - loss({**feeds, name: minus})) / (2 * eps)
            np.testing.assert_allclose(grads[name][idx], numeric, rtol=rtol, atol=atol,
                                       err_msg=f"d loss / d {name}{list(idx)}")
    return grads


def check_directional(nodes, params, outputs, out_types, consts=None, opset=17, eps=None, rtol=None, seed=0):
    """Dot-product test <t, J^T c> == <J t, c>, one parameter at a time, for realistic shapes.

    Each parameter p gets its own random direction t (scaled to p's spread, so eps * t stays small against the
    values and kinks such as ReLU's are crossed by few elements) while the others stay put, and its own
    comparison: a wrong gradient of one small tensor (a bias) cannot hide behind a large one, as it could in
    one pooled number. Defaults: float64 eps 1e-7 (few ReLU kinks crossed), rtol 1e-5; float32 eps 1e-2,
    rtol 2e-2; the absolute floor is the rounding of the two loss evaluations in the parameters' type."""
    consts = consts or {}
    dtype = np.dtype(next(iter(params.values())).dtype)
    wide = dtype == np.float64
    eps = eps if eps is not None else (1e-7 if wide else 1e-2)
    rtol = rtol if rtol is not None else (1e-5 if wide else 2e-2)
    sess, graph = gradient_session(nodes, params, consts, outputs, out_types, opset, seed)
    grads = dict(zip(params, sess.run(None, dict(params))[1:]))
    forward = edgetrain.InferenceSession(from_graph(Graph(
        graph.nodes, [Value(p, TensorType(a.dtype, a.shape)) for p, a in params.items()], graph.outputs,
        {k: v for k, v in graph.initializers.items() if k not in params}, graph.opsets)).SerializeToString())
    base = float(forward.run(None, dict(params))[0])
    noise = 64 * np.finfo(dtype).eps * max(abs(base), 1.0) / eps    # the difference quotient's rounding
    rng = np.random.default_rng(seed + 2)
    for p, a in params.items():
        t = (rng.standard_normal(a.shape) * (a.std() or 0.05)).astype(a.dtype)
        lp = float(forward.run(None, {**params, p: (a + eps * t).astype(a.dtype)})[0])
        lm = float(forward.run(None, {**params, p: (a - eps * t).astype(a.dtype)})[0])
        analytic = float(np.vdot(t.astype(np.float64), grads[p].astype(np.float64)))
        np.testing.assert_allclose(analytic, (lp - lm) / (2 * eps), rtol=rtol, atol=noise,
                                   err_msg=f"<t, d loss / d {p}> against the difference quotient along t")
