"""Every pass on or off (EDGETRAIN_NO_PLANNER, EDGETRAIN_NO_FUSION, read when planning) gives the outside
oracle's numbers: onnxruntime for forward models and random graphs, torch autograd for training steps; every
plan made on the way keeps the planner's invariants, recounted from its steps (tests/plancheck.py).

Not on the emulated arm64 stage: each setting compiles its own kernels."""
import numpy as np
import pytest
from conftest import BENCH_MODELS, random_feed
from hypothesis import HealthCheck, given, settings
from plancheck import DAGS, SWITCHES, check_invariants, dag_model, switched

from edgetrain.onnx_io import to_graph


@settings(max_examples=12, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(DAGS)
def test_random_graphs_give_onnxruntimes_outputs_with_every_pass_on_or_off(dag):
    """Property: planner on/off x fusion on/off, each against onnxruntime (EDGETRAIN_NO_* are read when planning)."""
    from oracle import run_onnxruntime

    import edgetrain
    m, feeds = dag_model(*dag)
    want = run_onnxruntime(m, feeds)
    with pytest.MonkeyPatch.context() as mp:
        for label, switches in SWITCHES.items():
            switched(mp, switches)
            sess = edgetrain.InferenceSession(m.SerializeToString())
            got = sess.run(None, feeds)
            check_invariants(sess.program(feeds).plan)
            for k, (a, b) in enumerate(zip(got, want)):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5, err_msg=f"{label}: output {k}")


@pytest.mark.parametrize("switches", list(SWITCHES), ids=list(SWITCHES))
@pytest.mark.parametrize("name", BENCH_MODELS)
def test_bench_models_give_onnxruntimes_outputs_with_every_pass_on_or_off(shared, monkeypatch, name, switches):
    """Forward models under each switch setting against onnxruntime; plans checked from their steps."""
    import onnx
    from oracle import run_onnxruntime

    import edgetrain
    switched(monkeypatch, SWITCHES[switches])
    m = onnx.load(str(shared / "models" / f"{name}.onnx"))
    graph = to_graph(m)
    rng = np.random.default_rng(0)
    feeds = {v.name: random_feed(type("V", (), {"name": v.name, "shape": v.type.shape,
                                               "type": str(v.type.dtype)}), rng) for v in graph.inputs}
    sess = edgetrain.InferenceSession(m.SerializeToString())
    got = sess.run(None, feeds)
    check_invariants(sess.program(feeds).plan)
    for k, (a, b) in enumerate(zip(got, run_onnxruntime(m, feeds))):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4 * np.abs(b).max(), err_msg=f"output {k}")


@pytest.mark.parametrize("switches", list(SWITCHES), ids=list(SWITCHES))
@pytest.mark.parametrize("name", BENCH_MODELS)
def test_bench_training_steps_give_torchs_gradients_with_every_pass_on_or_off(shared, monkeypatch, name, switches):
    """ORT's training artifacts of every bench model, one step under each switch setting: the training plan
    (external state, gradients written straight into their buffers) keeps the invariants, and loss and gradients
    are torch autograd's (float64) to float32 accuracy."""
    import torch
    import torch_ref

    from edgetrain.api import CheckpointState, Module
    switched(monkeypatch, SWITCHES[switches])
    d = shared / "ort_artifacts" / name
    state = CheckpointState.load_checkpoint(d / "checkpoint")
    module = Module(d / "training_model.onnx", state)
    graph = module.graph()
    x_value = next(v for v in graph.inputs if v.name == module.input_names()[0])
    rng = np.random.default_rng(4)
    shape = [s if isinstance(s, int) else 8 for s in x_value.type.shape]
    x = rng.integers(0, 100, shape) if x_value.type.dtype == np.int64 else rng.standard_normal(shape).astype(
        np.float32)
    y = rng.integers(0, 4 if name == "transformer" else 10, shape[0])
    loss = float(module(x, y))
    (bound,) = module.training_program.bound_steps()
    check_invariants(bound.program.plan)
    params = {n: p.data for n, p in state.parameters if p.requires_grad}
    running = {n: p.data for n, p in state.parameters if not p.requires_grad}
    want_loss, want = torch_ref.loss_and_gradients(shared / "models" / f"{name}.onnx",
                                                   {"input": x, "labels": y} | running, params, dtype=torch.float64)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    for p in params:
        error = np.abs(state.parameters[p].grad - want[p]).max() / (np.abs(want[p]).max() + 1e-12)
        assert error <= 1e-3, f"{p}: error {error:.2e} relative to the largest gradient"
