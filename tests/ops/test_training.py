"""Optimizer updates (AdamWOptimizer, SGDOptimizerV2, ai.edgetrain SGDOptimizer, InplaceClipGradNorm) over flat
state arrays, against numpy formulas written here, torch.optim / torch.nn.utils, and ONNX Runtime 1.19.2
training the ORT-made mlp artifacts.

Each graph is planned as the training runtime plans an optimizer model: the tensor-sequence inputs typed as
flat 1-D tensors of one length, bound as external arrays that the kernels update in place.
"""
import numpy as np
import pytest
import torch
from onnx import numpy_helper

from edgetrain import checkpoint, onnxblock
from edgetrain.errors import ShapeError, UnsupportedOpError
from edgetrain.ir import Graph, Node, SequenceType, TensorType, Value
from edgetrain.onnx_io import to_graph
from edgetrain.ops import OP_TABLE
from edgetrain.plan import make_plan
from edgetrain.runtime import Program

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run): small flat arrays

MS, ET = "com.microsoft", "ai.edgetrain"
STATE = {"AdamWOptimizer": ["params", "gradients", "first_order_moments", "second_order_moments"],
         "SGDOptimizerV2": ["params", "gradients"], "SGDOptimizer": ["params", "gradients", "first_order_moments"],
         "InplaceClipGradNorm": ["gradients"]}
SCALARS = {"AdamWOptimizer": ["learning_rate", "step"], "SGDOptimizerV2": ["learning_rate"],
           "SGDOptimizer": ["learning_rate"], "InplaceClipGradNorm": []}
BUFFER = "_grad.accumulation.buffer"


def optimizer_graph(op: str, attrs: dict | None = None, n_out: int = 1, extra_inputs=(), dtype=np.float32) -> Graph:
    """A one-node optimizer model as onnxblock writes it: state inputs declared as tensor sequences."""
    domain = ET if op == "SGDOptimizer" else MS
    scalars = [Value("learning_rate", TensorType(np.float32, (1,))), Value("step", TensorType(np.int64, (1,)))]
    inputs = [v for v in scalars if v.name in SCALARS[op]] + [Value(n, SequenceType(dtype)) for n in STATE[op]]
    inputs += [Value(n, TensorType(np.bool_, (1,))) for n in extra_inputs]
    outputs = [f"out{k}" for k in range(n_out)]
    node = Node(op, [v.name for v in inputs], outputs, dict(attrs or {}), f"{op}_node", domain)
    return Graph([node], inputs, [Value(o, None) for o in outputs], {}, {"": 17, domain: 1},
                 name="optimizer").verify()


class Bound:
    """A planned optimizer graph bound to flat state arrays (updated in place by each ``run``)."""

    def __init__(self, graph: Graph, state: dict[str, np.ndarray], feeds: dict[str, np.ndarray]):
        self.state = {k: np.array(v, order="C") for k, v in state.items()}   # copies: the caller keeps its own
        types = {k: TensorType(a.dtype, a.shape) for k, a in {**feeds, **self.state}.items()}
        self.plan = make_plan(graph, types, [v.name for v in graph.outputs], external=list(self.state))
        self.program = Program(self.plan, self.state)

    def run(self, **feeds) -> list[np.ndarray]:
        return [np.array(o) for o in self.program.run([feeds[n] for n in self.plan.fed_inputs])]


def lr(value) -> np.ndarray:
    return np.array([value], np.float32)


def step(t) -> np.ndarray:
    return np.array([t], np.int64)


def flat_state(rng, n=1000, kinds=("params", "gradients")) -> dict[str, np.ndarray]:
    return {k: rng.standard_normal(n).astype(np.float32) for k in kinds}


# --- InPlaceAccumulatorV2 ------------------------------------------------------------------------------------

def test_accumulator_adds_unless_told_to_overwrite():
    """buffer = value after a reset, buffer + value otherwise (ORT's InPlaceAccumulatorV2): three steps with the
    flag True, False, False leave g1 + g2 + g3 in the buffer, as numpy sums them; the updated copy equals it."""
    rng = np.random.default_rng(11)
    shape = (7, 5)
    graph = Graph([Node("InPlaceAccumulatorV2", ["buffer", "grad", "reset"], ["done", "updated"], {}, "acc", MS)],
                  [Value("buffer", TensorType(np.float32, shape)), Value("grad", TensorType(np.float32, shape)),
                   Value("reset", TensorType(np.bool_, (1,)))],
                  [Value("done", None), Value("updated", None)], {}, {"": 17, MS: 1}, name="acc").verify()
    b = Bound(graph, {"buffer": rng.standard_normal(shape).astype(np.float32)},
              {"grad": np.zeros(shape, np.float32), "reset": np.ones(1, bool)})
    grads = [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]
    want = np.zeros(shape, np.float32)
    for k, (g, reset) in enumerate(zip(grads, (True, False, False))):
        want = g.copy() if reset else want + g
        done, updated = b.run(grad=g, reset=np.array([reset]))
        assert done.tolist() == [True]
        np.testing.assert_allclose(b.state["buffer"], want, rtol=1e-6, err_msg=f"step {k}")
        np.testing.assert_array_equal(updated, b.state["buffer"])


# --- AdamW ------------------------------------------------------------------------------------------------------

def adamw_reference(p, g, m, v, lr_, t, b1, b2, eps, wd, mode, correct_bias):
    """ORT's AdamW in float64, written from its kernel: t is the 1-based step of this update."""
    p, g, m, v = (x.astype(np.float64) for x in (p, g, m, v))
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    c1, c2 = (1 - b1 ** t, 1 - b2 ** t) if correct_bias else (1.0, 1.0)
    if mode == 0:      # PyTorch AdamW: decay first, each moment corrected
        p = p * (1 - lr_ * wd)
        p = p - lr_ * (m / c1) / (np.sqrt(v / c2) + eps)
    else:              # Hugging Face: correction folded into lr, decay after the update
        p = p - lr_ * np.sqrt(c2) / c1 * m / (np.sqrt(v) + eps)
        p = p - lr_ * wd * p
    return p, m, v


@pytest.mark.parametrize("mode,correct_bias", [(0, 1), (1, 1), (1, 0)])
@pytest.mark.parametrize("wd", [0.0, 0.05])
def test_adamw_matches_formula(mode, correct_bias, wd):
    rng = np.random.default_rng(mode * 10 + correct_bias + int(wd * 100))
    n = 4099      # not a multiple of any vector width
    attrs = {"alpha": 0.85, "beta": 0.99, "epsilon": 1e-6, "weight_decay": wd, "adam_mode": mode,
             "correct_bias": correct_bias}
    state = {"params": rng.standard_normal(n).astype(np.float32), "gradients": np.zeros(n, np.float32),
             "first_order_moments": np.zeros(n, np.float32), "second_order_moments": np.zeros(n, np.float32)}
    b = Bound(optimizer_graph("AdamWOptimizer", attrs), state, {"learning_rate": lr(0), "step": step(0)})
    ref = [state["params"].astype(np.float64), np.zeros(n), np.zeros(n)]
    for t in range(1, 5):
        g = (rng.standard_normal(n) * (0.1 * t)).astype(np.float32)
        b.state["gradients"][:] = g
        rate = 1e-2 / t
        (flag,) = b.run(learning_rate=lr(rate), step=step(t))
        assert flag.dtype == np.bool_ and flag.tolist() == [True]
        ref = adamw_reference(*ref[:1], g, *ref[1:], float(np.float32(rate)), t, float(np.float32(0.85)),
                              float(np.float32(0.99)), float(np.float32(1e-6)), float(np.float32(wd)), mode,
                              correct_bias)
        for name, want in zip(["params", "first_order_moments", "second_order_moments"], ref):
            np.testing.assert_allclose(b.state[name], want, rtol=2e-5, atol=1e-6, err_msg=f"{name}, step {t}")
        np.testing.assert_array_equal(b.state["gradients"], g)     # gradients are read, never written


def test_adamw_split_over_threads_gives_the_same_bits(monkeypatch):
    """At 2 intra-op threads the update runs in blocks of the flat state (from its second call; the first compiles
    in the caller): the parameters and moments are 1 thread's to the bit and follow the float64 formula."""
    from edgetrain import parallel
    from edgetrain.kernels import training
    monkeypatch.setattr(training, "UPDATE_BLOCK", 64)       # small state: split anyway
    splits = []
    real = parallel.split
    monkeypatch.setattr(parallel, "split", lambda n, work, *rest: (splits.append(n), real(n, work, *rest)))
    rng = np.random.default_rng(5)
    n = 1001
    attrs = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-6, "weight_decay": 0.01, "adam_mode": 1, "correct_bias": 1}
    start = {"params": rng.standard_normal(n).astype(np.float32), "gradients": np.zeros(n, np.float32),
             "first_order_moments": np.zeros(n, np.float32), "second_order_moments": np.zeros(n, np.float32)}
    grads = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    got = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("EDGETRAIN_NUM_THREADS", threads)
        splits.clear()
        b = Bound(optimizer_graph("AdamWOptimizer", attrs), start, {"learning_rate": lr(0), "step": step(0)})
        for t, g in enumerate(grads, start=1):
            b.state["gradients"][:] = g
            b.run(learning_rate=lr(1e-2), step=step(t))
        got[threads] = {k: b.state[k].copy() for k in ("params", "first_order_moments", "second_order_moments")}
        assert (splits == [n] * (len(grads) - 1)) == (threads == "2"), splits
    ref = [start["params"].astype(np.float64), np.zeros(n), np.zeros(n)]
    for t, g in enumerate(grads, start=1):
        ref = adamw_reference(*ref[:1], g, *ref[1:], float(np.float32(1e-2)), t, float(np.float32(0.9)),
                              float(np.float32(0.999)), float(np.float32(1e-6)), float(np.float32(0.01)), 1, 1)
    for k, want in zip(got["2"], ref):
        np.testing.assert_array_equal(got["2"][k], got["1"][k], err_msg=k)
        np.testing.assert_allclose(got["2"][k], want, rtol=2e-5, atol=1e-6, err_msg=k)


def _replay_against_torch(b, opt, params, shapes, rng, run_step, rtol: float, steps: int = 3) -> None:
    """Feed the same random gradients to a torch optimizer and to the bound optimizer model ``b`` (one
    ``run_step(k)`` per step); the flat parameters must follow torch's."""
    for k in range(steps):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g)
        opt.step()
        b.state["gradients"][:] = np.concatenate([g.ravel() for g in grads])
        run_step(k)
        want = np.concatenate([p.detach().numpy().ravel() for p in params])
        np.testing.assert_allclose(b.state["params"], want, rtol=rtol, atol=1e-6, err_msg=f"step {k + 1}")


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_adamw_mode0_is_torch_adamw(wd):
    """adam_mode 0 fed t = steps taken + 1 follows torch.optim.AdamW over a few tensors concatenated."""
    rng = np.random.default_rng(3)
    shapes = [(7, 5), (5,), (3, 7), (3,)]
    tensors = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [torch.tensor(t, requires_grad=True) for t in tensors]
    opt = torch.optim.AdamW(params, lr=3e-3, betas=(0.8, 0.95), eps=1e-7, weight_decay=wd)
    n = sum(t.size for t in tensors)
    state = {"params": np.concatenate([t.ravel() for t in tensors])} | {
        k: np.zeros(n, np.float32) for k in STATE["AdamWOptimizer"][1:]}
    attrs = {"alpha": 0.8, "beta": 0.95, "epsilon": 1e-7, "weight_decay": wd, "adam_mode": 0, "correct_bias": 1}
    b = Bound(optimizer_graph("AdamWOptimizer", attrs), state, {"learning_rate": lr(0), "step": step(0)})
    _replay_against_torch(b, opt, params, shapes, rng, lambda k: b.run(learning_rate=lr(3e-3), step=step(k + 1)),
                          rtol=1e-5)
    m1 = np.concatenate([opt.state[p]["exp_avg"].numpy().ravel() for p in params])
    m2 = np.concatenate([opt.state[p]["exp_avg_sq"].numpy().ravel() for p in params])
    np.testing.assert_allclose(b.state["first_order_moments"], m1, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(b.state["second_order_moments"], m2, rtol=1e-5, atol=1e-9)


def test_adamw_onnxruntime_defaults_and_float64():
    """Attributes left out take onnxruntime's kernel defaults (0.9, 0.999, 1e-8, wd 0, mode 0, correct_bias 1);
    float64 state runs too."""
    rng = np.random.default_rng(4)
    n = 64
    state = {k: rng.standard_normal(n) for k in STATE["AdamWOptimizer"][:2]} | {
        k: np.zeros(n) for k in STATE["AdamWOptimizer"][2:]}
    p0 = state["params"].copy()
    b = Bound(optimizer_graph("AdamWOptimizer", dtype=np.float64), state, {"learning_rate": lr(0), "step": step(0)})
    b.run(learning_rate=lr(0.01), step=step(1))
    want, _, _ = adamw_reference(p0, state["gradients"], np.zeros(n), np.zeros(n), float(np.float32(0.01)), 1,
                                 0.9, 0.999, 1e-8, 0.0, 0, 1)
    np.testing.assert_allclose(b.state["params"], want, rtol=1e-12, atol=1e-7)


def test_adamw_update_signal_and_copied_outputs():
    rng = np.random.default_rng(5)
    state = flat_state(rng, 50, STATE["AdamWOptimizer"])
    state["second_order_moments"] = np.abs(state["second_order_moments"])
    before = {k: v.copy() for k, v in state.items()}
    g = optimizer_graph("AdamWOptimizer", {"adam_mode": 1, "epsilon": 1e-6}, n_out=4, extra_inputs=["do_update"])
    b = Bound(g, state, {"learning_rate": lr(0), "step": step(0), "do_update": np.zeros(1, bool)})
    flag, p, m1, m2 = b.run(learning_rate=lr(1e-3), step=step(3), do_update=np.zeros(1, bool))
    assert flag.tolist() == [False]
    for k in state:
        np.testing.assert_array_equal(b.state[k], before[k])
    np.testing.assert_array_equal(p, before["params"])
    flag, p, m1, m2 = b.run(learning_rate=lr(1e-3), step=step(3), do_update=np.ones(1, bool))
    assert flag.tolist() == [True]
    assert not np.array_equal(b.state["params"], before["params"])
    for out, name in ((p, "params"), (m1, "first_order_moments"), (m2, "second_order_moments")):
        np.testing.assert_array_equal(out, b.state[name])


def test_adamw_step_zero_is_refused_and_eps_zero_gives_nan():
    """step is the 1-based number of the update; eps = 0 with a zero gradient gives NaN (as onnxruntime and
    torch do), not a Python exception."""
    from edgetrain.errors import InputError
    state = {k: np.zeros(4, np.float32) for k in STATE["AdamWOptimizer"]}
    state["gradients"][:2] = 1.0
    b = Bound(optimizer_graph("AdamWOptimizer", {"adam_mode": 1, "epsilon": 0.0}), state,
              {"learning_rate": lr(0), "step": step(0)})
    with pytest.raises(InputError, match=r"AdamWOptimizer_node.*step is 0; it must be the 1-based"):
        b.run(learning_rate=lr(0.1), step=step(0))
    with np.errstate(all="ignore"):
        b.run(learning_rate=lr(0.1), step=step(1))
    np.testing.assert_allclose(b.state["params"][:2], -0.1, rtol=1e-6)
    assert np.isnan(b.state["params"][2:]).all()


def _plan_error(graph, state, feeds):
    types = {k: TensorType(a.dtype, a.shape) for k, a in {**feeds, **state}.items()}
    return make_plan(graph, types, [v.name for v in graph.outputs], external=list(state))


@pytest.mark.parametrize("case,message", [
    ("length", r"AdamWOptimizer_node.*input 4 \('first_order_moments'\) is float\[9\] but input 2 \('params'\)"),
    ("dtype", r"input 5 \('second_order_moments'\) is double\[10\] but input 2"),
    ("rank", r"input 3 \('gradients'\) must be bound as one flat 1-D tensor"),
    ("step", r"input 1 \('step'\) must be a int64 tensor of one element"),
    ("mode0_nobias", r"correct_bias must be 1 with adam_mode 0"),
    ("mode", r"attribute 'adam_mode' is 2; allowed: 0, 1"),
])
def test_adamw_shape_rule_errors(case, message):
    state = {k: np.zeros(10, np.float32) for k in STATE["AdamWOptimizer"]}
    feeds = {"learning_rate": lr(0), "step": step(1)}
    attrs = {}
    if case == "length":
        state["first_order_moments"] = np.zeros(9, np.float32)
    elif case == "dtype":
        state["second_order_moments"] = np.zeros(10)
    elif case == "rank":
        state["gradients"] = np.zeros((2, 5), np.float32)
    elif case == "step":
        feeds["step"] = np.ones(1, np.int32)
    elif case == "mode0_nobias":
        attrs = {"adam_mode": 0, "correct_bias": 0}
    else:
        attrs = {"adam_mode": 2}
    with pytest.raises(ShapeError, match=message):
        _plan_error(optimizer_graph("AdamWOptimizer", attrs), state, feeds)


def test_unflattened_sequence_is_refused():
    """Planning the optimizer graph with its declared sequence types (not bound flat) says what to do."""
    graph = optimizer_graph("SGDOptimizerV2")
    types = {"learning_rate": TensorType(np.float32, (1,)), "params": SequenceType(np.float32),
             "gradients": SequenceType(np.float32)}
    with pytest.raises(ShapeError, match=r"SGDOptimizerV2_node.*'params'.*one flat 1-D tensor.*seq\(float\)"):
        make_plan(graph, types, ["out0"])


def test_integer_state_is_refused():
    state = {k: np.zeros(4, np.int64) for k in STATE["SGDOptimizerV2"]}
    with pytest.raises(UnsupportedOpError, match="int64.*SGDOptimizerV2"):
        _plan_error(optimizer_graph("SGDOptimizerV2", dtype=np.int64), state, {"learning_rate": lr(0)})


def test_optimizer_ops_are_stateful_and_not_differentiable():
    for key in [(MS, "AdamWOptimizer"), (MS, "SGDOptimizerV2"), (MS, "InplaceClipGradNorm"), (ET, "SGDOptimizer")]:
        op = OP_TABLE[key]
        assert op.vjp is None and not op.deterministic and op.kind == "kernel", key


@pytest.mark.parametrize("bias_correction", [False, True])
def test_adamw_non_default_arguments_are_the_hugging_face_formula(bias_correction):
    """onnxblock.optim.AdamW(bias_correction, betas, eps, weight_decay) built through onnxblock, 3 steps against
    the Hugging Face AdamW formula in numpy (float64)."""
    betas, eps, wd, rate = (0.8, 0.95), 1e-4, 0.1, 0.01
    n = 40
    proto = numpy_helper.from_array(np.zeros(n, np.float32), "w")
    with onnxblock.empty_base() as builder:
        onnxblock.optim.AdamW(bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=wd)(([proto], []))
        graph = to_graph(builder.model)
    rng = np.random.default_rng(21)
    p = rng.standard_normal(n).astype(np.float32)
    state = {"params": p, "gradients": np.zeros(n, np.float32), "first_order_moments": np.zeros(n, np.float32),
             "second_order_moments": np.zeros(n, np.float32)}
    b = Bound(graph, state, {"learning_rate": lr(0), "step": step(0)})
    f = lambda v: float(np.float32(v))     # noqa: E731  (attributes are float32)
    b1, b2, e, w = f(betas[0]), f(betas[1]), f(eps), f(wd)
    want, m, v = p.astype(np.float64), np.zeros(n), np.zeros(n)
    for t in range(1, 4):
        g = rng.standard_normal(n).astype(np.float32)
        b.state["gradients"][:] = g
        b.run(learning_rate=lr(rate), step=step(t))
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g.astype(np.float64) ** 2
        size = f(rate) * (np.sqrt(1 - b2 ** t) / (1 - b1 ** t) if bias_correction else 1.0)
        want = want - size * m / (np.sqrt(v) + e)
        want = want - f(rate) * w * want
        np.testing.assert_allclose(b.state["params"], want, rtol=1e-5, atol=1e-6, err_msg=f"step {t}")


# --- SGD --------------------------------------------------------------------------------------------------------

def test_sgd_v2_matches_formula():
    rng = np.random.default_rng(6)
    state = flat_state(rng, 3001)
    b = Bound(optimizer_graph("SGDOptimizerV2", n_out=2), state, {"learning_rate": lr(0)})
    want = state["params"].copy()
    for k in range(3):
        g = rng.standard_normal(3001).astype(np.float32)
        b.state["gradients"][:] = g
        rate = np.float32(0.1 / (k + 1))
        flag, copied = b.run(learning_rate=lr(rate))
        want = want - rate * g                      # float32, as onnxruntime computes it
        np.testing.assert_array_equal(b.state["params"], want)
        np.testing.assert_array_equal(copied, want)
        assert flag.tolist() == [True]


def test_sgd_v2_update_signal():
    rng = np.random.default_rng(7)
    state = flat_state(rng, 10)
    p0 = state["params"].copy()
    b = Bound(optimizer_graph("SGDOptimizerV2", extra_inputs=["do_update"]), state,
              {"learning_rate": lr(0), "do_update": np.zeros(1, bool)})
    assert b.run(learning_rate=lr(1.0), do_update=np.zeros(1, bool))[0].tolist() == [False]
    np.testing.assert_array_equal(b.state["params"], p0)
    assert b.run(learning_rate=lr(1.0), do_update=np.ones(1, bool))[0].tolist() == [True]
    np.testing.assert_array_equal(b.state["params"], p0 - state["gradients"])


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.9, 0, 0.0), (0.9, 1, 0.0), (0.8, 0, 0.01), (0.8, 1, 0.01),
                                                  (0.0, 0, 0.05)])
def test_sgd_momentum_is_torch_sgd(momentum, nesterov, wd):
    rng = np.random.default_rng(8)
    shapes = [(6, 4), (4,), (2, 3, 3), (1,)]
    tensors = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    params = [torch.tensor(t, requires_grad=True) for t in tensors]
    opt = torch.optim.SGD(params, lr=0.05, momentum=momentum, nesterov=bool(nesterov), weight_decay=wd)
    n = sum(t.size for t in tensors)
    state = {"params": np.concatenate([t.ravel() for t in tensors]), "gradients": np.zeros(n, np.float32),
             "first_order_moments": np.zeros(n, np.float32)}
    attrs = {"momentum": momentum, "nesterov": nesterov, "weight_decay": wd}
    b = Bound(optimizer_graph("SGDOptimizer", attrs), state, {"learning_rate": lr(0)})
    for k in range(3):
        grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = torch.tensor(g)
        opt.step()
        b.state["gradients"][:] = np.concatenate([g.ravel() for g in grads])
        assert b.run(learning_rate=lr(0.05))[0].tolist() == [True]
        want = np.concatenate([p.detach().numpy().ravel() for p in params])
        np.testing.assert_allclose(b.state["params"], want, rtol=1e-6, atol=1e-6, err_msg=f"step {k + 1}")
        if momentum:
            buf = np.concatenate([opt.state[p]["momentum_buffer"].numpy().ravel() for p in params])
            np.testing.assert_allclose(b.state["first_order_moments"], buf, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.9, True, 0.0), (0.8, True, 0.01), (0.9, False, 0.0),
                                                  (0.0, False, 0.05), (0.0, False, 0.0)])
def test_sgd_built_by_onnxblock_is_torch_sgd(momentum, nesterov, wd):
    """onnxblock.optim.SGD(momentum, nesterov, weight_decay) builds a model that trains as torch.optim.SGD with
    the same arguments (plain SGD as ORT's SGDOptimizerV2, the rest as ai.edgetrain SGDOptimizer)."""
    rng = np.random.default_rng(12)
    shapes = [(5, 3), (3,)]
    tensors = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    protos = [numpy_helper.from_array(t, f"p{k}") for k, t in enumerate(tensors)]
    with onnxblock.empty_base() as builder:
        onnxblock.optim.SGD(momentum=momentum, nesterov=nesterov, weight_decay=wd)((protos, []))
        graph = to_graph(builder.model)
    params = [torch.tensor(t, requires_grad=True) for t in tensors]
    opt = torch.optim.SGD(params, lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    n = sum(t.size for t in tensors)
    names = {v.name for v in graph.inputs}
    state = {"params": np.concatenate([t.ravel() for t in tensors]), "gradients": np.zeros(n, np.float32)}
    state |= {"first_order_moments": np.zeros(n, np.float32)} if "first_order_moments" in names else {}
    feeds = {"learning_rate": lr(0)} | ({"step": step(0)} if "step" in names else {})
    b = Bound(graph, state, feeds)
    _replay_against_torch(b, opt, params, shapes, rng, lambda k: b.run(**(feeds | {"learning_rate": lr(0.1)})),
                          rtol=1e-6)


def test_sgd_momentum_nesterov_needs_momentum():
    state = {k: np.zeros(4, np.float32) for k in STATE["SGDOptimizer"]}
    with pytest.raises(ShapeError, match="SGDOptimizer_node.*Nesterov momentum needs momentum > 0"):
        _plan_error(optimizer_graph("SGDOptimizer", {"momentum": 0.0, "nesterov": 1}), state,
                    {"learning_rate": lr(0)})


# --- InplaceClipGradNorm ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("max_norm", [0.5, 3.0, 1000.0])
def test_clip_grad_norm_is_torch(max_norm):
    rng = np.random.default_rng(9)
    shapes = [(30, 20), (20,), (5, 30)]
    grads = [rng.standard_normal(s).astype(np.float32) * 0.1 for s in shapes]
    params = [torch.zeros(s, requires_grad=True) for s in shapes]
    for p, g in zip(params, grads):
        p.grad = torch.tensor(g)
    total = torch.nn.utils.clip_grad_norm_(params, max_norm, norm_type=2.0)
    want = np.concatenate([p.grad.numpy().ravel() for p in params])
    flat = np.concatenate([g.ravel() for g in grads])
    norm = np.sqrt(np.sum(flat.astype(np.float64) ** 2))
    np.testing.assert_allclose(norm, float(total), rtol=1e-6)
    b = Bound(optimizer_graph("InplaceClipGradNorm", {"max_norm": max_norm, "norm_type": "fro"}),
              {"gradients": flat}, {})
    (out,) = b.run()
    # formula: g * min(max_norm / (||g|| + 1e-6), 1)
    np.testing.assert_allclose(b.state["gradients"], flat * min(max_norm / (norm + 1e-6), 1.0), rtol=1e-6,
                               atol=1e-9)
    np.testing.assert_allclose(b.state["gradients"], want, rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(out, b.state["gradients"])
    if max_norm == 1000.0:
        np.testing.assert_array_equal(b.state["gradients"], flat)     # under the limit: untouched


def test_clip_grad_norm_of_tiny_gradients_keeps_the_1e6():
    """With ||g|| ~ 1e-5 the 1e-6 in max_norm / (||g|| + 1e-6) changes the scale by ~10%, so it is visible."""
    rng = np.random.default_rng(13)
    flat = (rng.standard_normal(50) * 1e-6).astype(np.float32)
    norm = np.sqrt(np.sum(flat.astype(np.float64) ** 2))
    param = torch.zeros(50, requires_grad=True)
    param.grad = torch.tensor(flat)
    torch.nn.utils.clip_grad_norm_([param], 1e-6)
    b = Bound(optimizer_graph("InplaceClipGradNorm", {"max_norm": 1e-6, "norm_type": "fro"}), {"gradients": flat}, {})
    b.run()
    np.testing.assert_allclose(b.state["gradients"], flat * (1e-6 / (norm + 1e-6)), rtol=1e-5)
    np.testing.assert_allclose(b.state["gradients"], param.grad.numpy(), rtol=1e-5)


def test_clip_grad_norm_errors():
    with pytest.raises(ShapeError, match="InplaceClipGradNorm_node.*attribute 'norm_type' is 'inf'; allowed: fro"):
        _plan_error(optimizer_graph("InplaceClipGradNorm", {"norm_type": "inf"}),
                    {"gradients": np.zeros(3, np.float32)}, {})


def test_clip_then_adamw_as_onnxblock_builds_it():
    """onnxblock.optim.AdamW(clip_grad=ClipGradNorm) builds clip -> AdamW; AdamW then reads the clipped
    gradients, and the gradient store is clipped in place."""
    rng = np.random.default_rng(10)
    n = 500
    proto = numpy_helper.from_array(np.zeros(n, np.float32), "w")
    block = onnxblock.optim.AdamW(weight_decay=0.01, clip_grad=onnxblock.optim.ClipGradNorm(0.25))
    with onnxblock.empty_base() as builder:
        block(([proto], []))
        graph = to_graph(builder.model)
    assert [nd.op_type for nd in graph.nodes] == ["InplaceClipGradNorm", "AdamWOptimizer"]
    state = {"params": rng.standard_normal(n).astype(np.float32),
             "gradients": rng.standard_normal(n).astype(np.float32),
             "first_order_moments": np.zeros(n, np.float32), "second_order_moments": np.zeros(n, np.float32)}
    p0, g0 = state["params"].copy(), state["gradients"].copy()
    b = Bound(graph, state, {"learning_rate": lr(0), "step": step(0)})
    (flag,) = b.run(learning_rate=lr(1e-3), step=step(1))
    assert flag.tolist() == [True]
    g = g0.astype(np.float64)
    g = g * min(0.25 / (np.linalg.norm(g) + 1e-6), 1.0)
    np.testing.assert_allclose(b.state["gradients"], g, rtol=1e-6, atol=1e-9)
    f32 = lambda x: float(np.float32(x))   # the attributes are float32
    want, m1, m2 = adamw_reference(p0, g, np.zeros(n), np.zeros(n), f32(1e-3), 1, f32(0.9), f32(0.999), f32(1e-6),
                                   f32(0.01), 1, 1)
    np.testing.assert_allclose(b.state["params"], want, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(b.state["first_order_moments"], m1, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(b.state["second_order_moments"], m2, rtol=1e-6, atol=1e-12)


# --- ONNX Runtime 1.19.2 on its own artifacts -------------------------------------------------------------------

ORT_STEPS = r'''
d, x, y = ARGS["dir"], ARRAYS["x"], ARRAYS["y"]
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
state = ort_api.CheckpointState.load_checkpoint(d + "/checkpoint")
m = ort_api.Module(d + "/training_model.onnx", state, d + "/eval_model.onnx", session_options=so)
opt = ort_api.Optimizer(d + "/optimizer_model.onnx", m)
m.train()
for n, p in state.parameters:
    if p.requires_grad:
        OUT["init:" + n] = np.array(p.data, copy=True)
for k in range(ARGS["steps"]):
    m.lazy_reset_grad()
    m(x, y)
    for n, p in state.parameters:
        if p.requires_grad:
            OUT[f"grad{k}:" + n] = np.array(p.grad, copy=True)
    opt.step()
    for n, p in state.parameters:
        if p.requires_grad:
            OUT[f"param{k}:" + n] = np.array(p.data, copy=True)
OUT["lr"] = float(opt.get_learning_rate())
ort_api.CheckpointState.save_checkpoint(state, ARGS["out"], include_optimizer_state=True)
'''


def _ort_run(ort, shared, tmp_path, name, steps=3):
    folder = shared / "ort_artifacts" / name
    train = to_graph(folder / "training_model.onnx")
    order = [v.name[: -len(BUFFER)] for v in train.inputs if v.name.endswith(BUFFER)]
    x_type = next(v.type for v in train.inputs if v.name == "input")
    rng = np.random.default_rng(11)
    shape = [d if isinstance(d, int) else 64 for d in x_type.shape]
    x = rng.standard_normal(shape).astype(np.float32)
    y = rng.integers(0, 10, shape[0]).astype(np.int64)
    out = ort.run(ORT_STEPS, args={"dir": str(folder), "out": str(tmp_path / "ckpt"), "steps": steps},
                  arrays={"x": x, "y": y})
    def flat(prefix):
        return np.concatenate([out[prefix + n].ravel() for n in order])
    return out, order, flat, to_graph(folder / "optimizer_model.onnx"), checkpoint.load(tmp_path / "ckpt")


@pytest.mark.ort119
@pytest.mark.native
def test_adamw_matches_ort_training_mlp(shared, tmp_path, ort):
    """ORT feeds step = steps taken + 1 (so 1 on the first update); three AdamW updates from ORT's own gradients
    land on ORT's parameters and moments."""
    out, order, flat, graph, ck = _ort_run(ort, shared, tmp_path, "mlp")
    assert out["lr"] == pytest.approx(1e-3)
    n = flat("init:").size
    state = {"params": flat("init:"), "gradients": np.zeros(n, np.float32),
             "first_order_moments": np.zeros(n, np.float32), "second_order_moments": np.zeros(n, np.float32)}
    b = Bound(graph, state, {"learning_rate": lr(0), "step": step(0)})
    for k in range(3):
        b.state["gradients"][:] = flat(f"grad{k}:")
        (flag,) = b.run(learning_rate=lr(1e-3), step=step(k + 1))
        assert flag.tolist() == [True]
        np.testing.assert_allclose(b.state["params"], flat(f"param{k}:"), rtol=1e-6, atol=1e-7,
                                   err_msg=f"params after step {k + 1}")
    group = ck.optimizer_groups[0]
    assert group.step == 3
    m1 = np.concatenate([group.states[p]["momentum0"].ravel() for p in order])
    m2 = np.concatenate([group.states[p]["momentum1"].ravel() for p in order])
    np.testing.assert_allclose(b.state["first_order_moments"], m1, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(b.state["second_order_moments"], m2, rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(b.state["params"], np.concatenate([ck.trainable[p].ravel() for p in order]),
                               rtol=1e-6, atol=1e-7)


@pytest.mark.ort119
@pytest.mark.native
def test_sgd_matches_ort_training_mlp_sgd(shared, tmp_path, ort):
    out, _, flat, graph, ck = _ort_run(ort, shared, tmp_path, "mlp_sgd")
    n = flat("init:").size
    state = {"params": flat("init:"), "gradients": np.zeros(n, np.float32)}
    feeds = {"learning_rate": lr(0), "step": step(0), "first_order_moments": np.zeros(n, np.float32)}
    # the SGD model declares step and first_order_moments but its node reads neither: feed them, unused
    types = {k: TensorType(a.dtype, a.shape) for k, a in {**feeds, **state}.items()}
    plan = make_plan(graph, types, [v.name for v in graph.outputs], external=list(state))
    prog = Program(plan, state)
    for k in range(3):
        state["gradients"][:] = flat(f"grad{k}:")
        fed = feeds | {"learning_rate": lr(out["lr"]), "step": step(k + 1)}
        (flag,) = prog.run([fed[nm] for nm in plan.fed_inputs])
        assert flag.tolist() == [True]
        np.testing.assert_allclose(state["params"], flat(f"param{k}:"), rtol=1e-6, atol=1e-7,
                                   err_msg=f"params after step {k + 1}")
    assert ck.optimizer_groups[0].step == 3
