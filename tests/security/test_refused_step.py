"""A refused training step leaves the state exactly as it was (issue 11, item 3).

A small Gemm -> BatchNormalization -> Relu -> Gemm model is made into training artifacts here; a step is then
refused three ways (a NaN input, targets that make the loss infinite, a kernel error raised in the backward
pass) after the state has been moved away from its start (gradients, moments, running statistics all
non-trivial), in both gradient modes. The oracle for "exactly as it was" is the saved checkpoint's bytes
(parameters, running statistics, optimizer moments and step), every parameter's gradient and the module's
flags; and carrying on after the refusal must give bit for bit what a module that never saw the bad batch
gives.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgetrain import artifacts
from edgetrain.api import CheckpointState, Module, Optimizer
from edgetrain.errors import EdgetrainError, InputError

N, D, H, C = 8, 6, 5, 3
TRAINABLE = ["W1", "b1", "scale", "bias", "W2", "b2"]
FROZEN = ["mean", "var"]


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = {"W1": rng.standard_normal((D, H)), "b1": rng.standard_normal(H), "scale": 1 + rng.random(H),
             "bias": rng.standard_normal(H), "mean": rng.standard_normal(H), "var": 1 + rng.random(H),
             "W2": rng.standard_normal((H, C)), "b2": rng.standard_normal(C)}
    nodes = [helper.make_node("Gemm", ["x", "W1", "b1"], ["h"]),
             helper.make_node("BatchNormalization", ["h", "scale", "bias", "mean", "var"],
                              ["n", "running_mean", "running_var"], training_mode=1, momentum=0.9),
             helper.make_node("Relu", ["n"], ["r"]),
             helper.make_node("Gemm", ["r", "W2", "b2"], ["y"])]
    graph = helper.make_graph(nodes, "bn_mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", D])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", C])],
                              [numpy_helper.from_array(a.astype(np.float32), k) for k, a in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    made = {}
    for loss in ("CrossEntropyLoss", "MSELoss"):
        folder = tmp_path_factory.mktemp(loss)
        artifacts.generate_artifacts(_model(), requires_grad=TRAINABLE, frozen_params=FROZEN,
                                     loss=artifacts.LossType[loss], optimizer=artifacts.OptimType.AdamW,
                                     artifact_directory=folder)
        made[loss] = folder
    return made


def _open(folder):
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    module = Module(folder / "training_model.onnx", state)
    return state, module, Optimizer(folder / "optimizer_model.onnx", module)


def _batch(loss: str, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((N, D)).astype(np.float32)
    if loss == "MSELoss":
        return x, rng.standard_normal((N, C)).astype(np.float32)
    return x, rng.integers(0, C, N).astype(np.int64)


def _snapshot(state, module, path) -> tuple:
    """Everything a step may change: checkpoint bytes (parameters, running statistics, moments, step), the
    gradients and the module's flags."""
    CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    grads = {n: p.grad for n, p in state.parameters}
    return (path.read_bytes(), {n: None if g is None else g.tobytes() for n, g in grads.items()},
            module.training_program.reset_pending, module.state_store.has_gradients)


def _moved(state, module, optimizer, loss: str, mode: str):
    """Steps that move every part of the state; then the mode the refused step meets."""
    for seed in (1, 2):
        module(*_batch(loss, seed))
        optimizer.step()
        module.lazy_reset_grad()
    module(*_batch(loss, 3))
    if mode == "reset":
        module.lazy_reset_grad()


class _FailingBackward:
    """BatchNormalizationGrad's launcher, raising while ``on``: the backward pass has by then written the
    second layer's gradients."""

    def __init__(self, monkeypatch):
        from edgetrain.kernels import normalization
        real, self.on = normalization.batch_norm_grad, False

        def launcher(ctx):
            run = real(ctx)

            def maybe_fail(*args):
                if self.on:
                    raise InputError(f"{ctx.node}: refused by the test")
                return run(*args)
            return maybe_fail
        monkeypatch.setattr(normalization, "batch_norm_grad", launcher)


def _refuse(how: str, loss: str, module, failing):
    x, y = _batch(loss, 4)
    if how == "nan input":
        x[3, 2] = np.nan
    elif how == "infinite loss":          # (x - 1e30)^2 overflows float32: the loss is inf, gradients finite
        y[:] = 1e30
    else:
        failing.on = True
    match = "refused by the test" if how == "kernel error in backward" else "not finite"
    with pytest.raises(EdgetrainError, match=match):
        module(x, y)
    failing.on = False


CASES = [("nan input", "CrossEntropyLoss"), ("infinite loss", "MSELoss"),
         ("kernel error in backward", "CrossEntropyLoss"), ("kernel error in backward", "MSELoss")]


@pytest.mark.parametrize("mode", ["reset", "accumulate"])
@pytest.mark.parametrize("how,loss", CASES)
def test_a_refused_step_changes_nothing(folders, tmp_path, monkeypatch, how, loss, mode):
    failing = _FailingBackward(monkeypatch)
    state, module, optimizer = _open(folders[loss])
    _moved(state, module, optimizer, loss, mode)
    before = _snapshot(state, module, tmp_path / "before")
    assert all(before[1][n] is not None for n in TRAINABLE) and before[2] == (mode == "reset")
    _refuse(how, loss, module, failing)
    assert _snapshot(state, module, tmp_path / "after") == before


@pytest.mark.parametrize("mode", ["reset", "accumulate"])
@pytest.mark.parametrize("how,loss", CASES)
def test_carrying_on_after_a_refusal_is_as_if_it_never_happened(folders, tmp_path, monkeypatch, how, loss, mode):
    failing = _FailingBackward(monkeypatch)
    runs = []
    for refuse in (True, False):
        state, module, optimizer = _open(folders[loss])
        _moved(state, module, optimizer, loss, mode)
        if refuse:
            _refuse(how, loss, module, failing)
        module(*_batch(loss, 5))
        optimizer.step()
        runs.append(_snapshot(state, module, tmp_path / f"{refuse}"))
    assert runs[0] == runs[1]
    params = CheckpointState.load_checkpoint(tmp_path / "True").parameters
    assert all(np.isfinite(p.data).all() for _, p in params)


def test_running_statistics_move_only_on_a_committed_step(folders):
    """The guard above would hold trivially if the step never updated the running statistics."""
    state, module, _ = _open(folders["CrossEntropyLoss"])
    start = state.parameters["mean"].data
    module(*_batch("CrossEntropyLoss", 1))
    assert not np.array_equal(state.parameters["mean"].data, start)


def test_a_refused_optimizer_step_changes_nothing(folders, tmp_path, monkeypatch):
    """Before any gradient, and when its kernel raises: no parameter, moment or step count moves."""
    from edgetrain.kernels import training
    state, module, optimizer = _open(folders["CrossEntropyLoss"])
    before = _snapshot(state, module, tmp_path / "before")
    with pytest.raises(EdgetrainError, match="before any gradient"):
        optimizer.step()
    assert _snapshot(state, module, tmp_path / "after") == before
    _moved(state, module, optimizer, "CrossEntropyLoss", "accumulate")
    before = _snapshot(state, module, tmp_path / "before")

    def failing(ctx):
        def run(*args):
            raise InputError(f"{ctx.node}: refused by the test")
        return run
    monkeypatch.setattr(training, "adamw", failing)
    refusing = Optimizer(folders["CrossEntropyLoss"] / "optimizer_model.onnx", module)
    with pytest.raises(InputError, match="refused by the test"):
        refusing.step()
    assert _snapshot(state, module, tmp_path / "after") == before
