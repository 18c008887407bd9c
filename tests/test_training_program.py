"""The runtime's training program on its own (no edgetrain.api): accumulation and lazy reset as in ORT, a failed
step that leaves the state alone, the optimizer step's count and learning rate. Oracle: torch autograd."""
import numpy as np
import pytest
import torch_ref

from edgetrain import checkpoint
from edgetrain.compact import load_graph
from edgetrain.errors import EdgetrainError, InputError
from edgetrain.runtime.training import TrainingProgram


def _digits(shared):
    d = shared / "ort_artifacts" / "digits"
    ckpt = checkpoint.load(d / "checkpoint")
    tp = TrainingProgram(load_graph(d / "training_model.onnx"), ckpt.trainable | ckpt.frozen)
    return d, tp


def _batch(seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((16, 64)).astype(np.float32), rng.integers(0, 10, 16)


def _grads(tp):
    return {p: np.array(tp.store.grad(p)) for p in tp.store.names}


def test_accumulation_and_lazy_reset_follow_ort(shared):
    import torch

    _, tp = _digits(shared)
    params = {p: np.array(tp.store.param(p)) for p in tp.store.names}
    want = []
    for seed in (1, 2):
        x, y = _batch(seed)
        want.append(torch_ref.loss_and_gradients(shared / "models" / "digits.onnx", {"input": x, "labels": y},
                                                 params, dtype=torch.float64)[1])
    for seed in (1, 2):
        tp.run(True, _batch(seed))
    summed = _grads(tp)
    tp.lazy_reset_grad()                 # lazy: the gradients stay until the next training step
    after_reset = _grads(tp)
    tp.run(True, _batch(2))
    for p in params:
        scale = 1e-5 * np.abs(want[0][p] + want[1][p]).max()
        np.testing.assert_allclose(summed[p], want[0][p] + want[1][p], rtol=1e-4, atol=scale, err_msg=p)
        np.testing.assert_array_equal(after_reset[p], summed[p])
        np.testing.assert_allclose(tp.store.grad(p), want[1][p], rtol=1e-4, atol=1e-5 * np.abs(want[1][p]).max(),
                                   err_msg=p)


def test_each_gradient_slot_is_bound_when_a_step_first_needs_it(shared):
    """A process's first step binds one training and one optimizer program, not both slots' (start-up); the
    other slot's, bound at the next step, computes torch's gradients too."""
    import torch

    d, tp = _digits(shared)
    opt = tp.attach_optimizer(load_graph(d / "optimizer_model.onnx"))
    params = {p: np.array(tp.store.param(p)) for p in tp.store.names}

    def bound():
        step = next(iter(tp._steps.values()))
        return sum(p is not None for p in step._programs), sum(p is not None for p in opt._by_slot)

    for k, seed in enumerate((1, 2, 3)):
        tp.lazy_reset_grad()
        tp.run(True, _batch(seed))
        want = torch_ref.loss_and_gradients(shared / "models" / "digits.onnx", dict(zip(("input", "labels"),
                                            _batch(seed))), params, dtype=torch.float64)[1]
        for p in params:
            np.testing.assert_allclose(tp.store.grad(p), want[p], rtol=1e-4, atol=1e-5 * np.abs(want[p]).max(),
                                       err_msg=f"step {k + 1}: {p}")
        assert bound() == ((1, 1) if k == 0 else (2, 2 if k == 2 else 1)), k
        if k:
            opt.learning_rate = 0.0          # the next step's gradients stay torch's at the same parameters
            opt.run()
    assert opt.step_count == 2 and len(opt.by_slot) == 2 and bound() == (2, 2)
    np.testing.assert_array_equal(tp.store.params, np.concatenate([params[p].reshape(-1) for p in params]))


def test_a_step_that_raises_midway_changes_nothing(shared):
    _, tp = _digits(shared)
    tp.run(True, _batch(1))
    before = _grads(tp)
    x, y = _batch(2)
    y[5] = 10                            # found by the loss kernel, after the forward pass has run
    with pytest.raises(InputError, match="labels"):
        tp.run(True, (x, y))
    assert not tp.reset_pending          # still accumulating
    for p, g in before.items():
        np.testing.assert_array_equal(tp.store.grad(p), g)
    tp.run(True, _batch(2))              # and the next good step adds to the committed sums only
    tp.lazy_reset_grad()
    tp.run(True, _batch(1))
    for p, g in before.items():
        np.testing.assert_array_equal(tp.store.grad(p), g)


def test_the_optimizer_step_counts_and_reads_its_learning_rate(shared):
    d, tp = _digits(shared)
    opt = tp.attach_optimizer(load_graph(d / "optimizer_model.onnx"))
    with pytest.raises(EdgetrainError, match="before any gradient"):
        opt.run()
    assert opt.step_count == 0
    tp.run(True, _batch(1))
    params = np.array(tp.store.params)
    opt.learning_rate = 0.0              # AdamW with lr 0 (and so lr * weight decay 0) moves nothing
    opt.run()
    np.testing.assert_array_equal(tp.store.params, params)
    assert opt.step_count == 1 and np.abs(tp.store.moments[0]).max() > 0
    opt.learning_rate = 1e-2
    opt.run()
    assert opt.step_count == 2 and np.abs(tp.store.params - params).max() > 0


def test_launchers_are_bound_once(shared):
    """Every launcher that offers ``bind`` (kernels.bindable) was bound when the program was made: a steady step
    calls the bound functions on the same views, never a launcher that would reshape per call. After its first
    run a program calls its kernels' compiled entry points (kernels.direct), and those stay."""
    _, tp = _digits(shared)
    tp.run(True, _batch(1))
    progs = [p for _, p in tp.programs()]
    views = [[tuple(map(id, args)) for _, args in p.calls] for p in progs]
    assert all(not hasattr(fn, "bind") for p in progs for fn, _ in p.calls)
    tp.run(True, _batch(2))      # each of the step's two programs has run once
    calls = [[(fn, tuple(map(id, args))) for fn, args in p.calls] for p in progs]
    assert views == [[ids for _, ids in c] for c in calls]
    entry_points = [fn for c in calls for fn, _ in c if type(fn).__name__ == "builtin_function_or_method"]
    assert entry_points
    tp.run(True, _batch(3))
    assert calls == [[(fn, tuple(map(id, args))) for fn, args in p.calls] for p in progs]


def test_a_gradient_of_a_graph_input_is_refused_naming_it(tmp_path):
    """requires_grad on a graph input: artifacts build (as in ORT 1.19, whose Module then fails at its first
    step with a type error); the runtime refuses when binding, naming the input."""
    from onnx import TensorProto, helper, numpy_helper

    from edgetrain import artifacts
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
                          [numpy_helper.from_array(np.ones((4, 3), np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    artifacts.generate_artifacts(m, requires_grad=["w", "x"], loss=artifacts.LossType.MSELoss,
                                 artifact_directory=tmp_path)
    ckpt = checkpoint.load(tmp_path / "checkpoint")
    with pytest.raises(EdgetrainError, match="gradient for 'x', which is one of its inputs"):
        TrainingProgram(load_graph(tmp_path / "training_model.onnx"), ckpt.trainable | ckpt.frozen)


BOUND_OPS = {"ConvGrad", "MaxPool", "MaxPoolGrad", "AveragePool", "AveragePoolGrad", "GlobalAveragePool",
             "BatchNormalization", "BatchNormInternal", "BatchNormalizationGrad"}


@pytest.mark.parametrize("name, x_shape", [("cnn", (32, 1, 28, 28)), ("mobilenet", (16, 3, 32, 32))])
def test_conv_pool_and_batch_norm_launchers_bind(shared, name, x_shape):
    """ConvGrad (GEMM and direct paths), the pools and BatchNormalization's training ops offer ``bind``: their
    calls in a steady step are the bound functions on views made once."""
    from edgetrain.runtime.program import launcher

    d = shared / "ort_artifacts" / name
    ckpt = checkpoint.load(d / "checkpoint")
    tp = TrainingProgram(load_graph(d / "training_model.onnx"), ckpt.trainable | ckpt.frozen)
    rng = np.random.default_rng(0)
    batch = (rng.standard_normal(x_shape).astype(np.float32), rng.integers(0, 10, x_shape[0]))
    tp.run(True, batch)
    tp.run(True, batch)         # steady from here: the first run also resolved kernels' entry points
    progs = [p for _, p in tp.programs()]
    bound = [b for p in progs for s in p.plan.steps if s.kind != "fused" for b in s.nodes[:1]
             if b.op.op_type in BOUND_OPS]
    assert {b.op.op_type for b in bound} >= {"ConvGrad", "MaxPool" if name == "cnn" else "BatchNormInternal"}
    assert all(hasattr(launcher(b.op.kernel)(b.ctx), "bind") for b in bound)
    calls = [[(fn, tuple(map(id, args))) for fn, args in p.calls] for p in progs]
    tp.run(True, batch)
    assert calls == [[(fn, tuple(map(id, args))) for fn, args in p.calls] for p in progs]


def test_a_step_like_the_last_one_binds_as_the_full_lookup(shared):
    """The binding of the last call is reused after comparing shapes and dtypes (no hashing). Oracle: the same
    calls where every one goes through the binding dict (the last binding forgotten before each): the same
    losses, eval outputs and gradients bit for bit, and the same refusals, over changing batch sizes, modes and
    label dtypes."""
    d = shared / "ort_artifacts" / "digits"
    ckpt = checkpoint.load(d / "checkpoint")

    def make():
        return TrainingProgram(load_graph(d / "training_model.onnx"), ckpt.trainable | ckpt.frozen,
                               load_graph(d / "eval_model.onnx"))
    fast, full = make(), make()
    x, y = _batch(3)
    calls = [(True, x, y), (True, x, y), (True, x[:8], y[:8]), (False, x[:8], y[:8]), (False, x, y),
             (True, x, y), (True, x, y.astype(np.int32)), (True, x[:8], y[:8]), (True, x, y)]
    for training, *inputs in calls:
        results = []
        for tp in (fast, full):
            full._recent.clear()
            try:
                outs, picked = tp.run(training, tuple(inputs))
                results.append([np.array(outs[k]) for k in picked] + list(_grads(tp).values()))
            except InputError as e:
                results.append(str(e))
            tp.lazy_reset_grad()
        if isinstance(results[1], str):
            assert results[0] == results[1]
            continue
        for got, want in zip(*results, strict=True):
            np.testing.assert_array_equal(got, want)
    assert len(fast.bound_steps()) == len(full.bound_steps()) == 4
