"""Planner invariants (not offsets): live buffers never overlap, held buffers are never shared, arena <= naive."""
import numpy as np
import pytest
from conftest import BENCH_MODELS, random_feed

from edgetrain.onnx_io import to_graph
from edgetrain.plan import make_plan
from edgetrain.plan.memory import ALIGN
from edgetrain.session import bind_feeds

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")


def _plan(path, **kw):
    graph = to_graph(str(path))
    rng = np.random.default_rng(0)
    feeds = {v.name: random_feed(type("V", (), {"name": v.name, "shape": v.type.shape,
                                               "type": str(v.type.dtype)}), rng) for v in graph.inputs}
    return make_plan(graph, bind_feeds(graph.inputs, feeds, "test"), [v.name for v in graph.outputs], **kw)


def check_invariants(plan):
    bufs = plan.buffers
    n = len(plan.steps)
    for b in bufs:
        assert b.offset % ALIGN == 0
        assert 0 <= b.offset and b.offset + b.nbytes <= plan.arena_bytes
    for i, a in enumerate(bufs):
        for b in bufs[i + 1:]:
            if a.overlaps_in_time(b) and a.nbytes and b.nbytes:
                assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset, (a, b)
    spec = plan.spec
    value_buffer = plan.memory.value_buffer
    for name in spec.input_names + spec.output_names:
        if name in value_buffer:
            held = bufs[value_buffer[name]]
            assert held.held and held.end == n
    for name in spec.input_names:   # an input's bytes are never written by any step
        b = value_buffer[name]
        for step in plan.steps:
            if step.kind != "alias":
                assert all(value_buffer.get(o) != b for o in step.outputs if o)
    assert plan.arena_bytes <= plan.naive_bytes


@pytest.mark.parametrize("name", BENCH_MODELS)
def test_bench_model_plans_keep_invariants(shared, name):
    plan = _plan(shared / "models" / f"{name}.onnx")
    check_invariants(plan)
    assert plan.arena_bytes < plan.naive_bytes


@pytest.mark.parametrize("name", ["cnn", "mobilenet", "transformer"])
def test_eval_model_plans_keep_invariants(shared, name):
    check_invariants(_plan(shared / "ort_artifacts" / name / "eval_model.onnx"))


def test_switches_turn_passes_off(shared, monkeypatch):
    path = shared / "models" / "mlp.onnx"
    fused = _plan(path)
    monkeypatch.setenv("EDGETRAIN_NO_FUSION", "1")
    unfused = _plan(path)
    assert unfused.n_kernels > fused.n_kernels
    assert all(len(s.nodes) == 1 for s in unfused.steps)
    monkeypatch.setenv("EDGETRAIN_NO_PLANNER", "1")
    naive = _plan(path)
    check_invariants(naive)
    assert naive.arena_bytes == sum((b.nbytes + ALIGN - 1) // ALIGN * ALIGN for b in naive.buffers)


def test_summary_reports_arena_against_naive(shared):
    plan = _plan(shared / "models" / "mlp.onnx")
    text = plan.summary()
    assert "arena" in text and "naive" in text and f"{plan.n_kernels} kernels" in text


def test_memory_budget_fails_early_naming_tensors(shared):
    from edgetrain.errors import MemoryBudgetError
    with pytest.raises(MemoryBudgetError, match="largest tensors"):
        _plan(shared / "models" / "cnn.onnx", max_memory=1000)


def _random_dag(seed: int):
    """A random DAG of element-wise ops, MatMuls and reshapes whose values have several readers."""
    from onnx import helper
    from oracle import model
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((4, 6)).astype(np.float32)}
    inits = {"w": rng.standard_normal((6, 6)).astype(np.float32), "b": rng.standard_normal((6,)).astype(np.float32)}
    values, nodes = ["x"], []
    for k in range(14):
        out = f"v{k}"
        kind = rng.integers(0, 5)
        a, b = (values[i] for i in rng.integers(0, len(values), 2))
        if kind == 0:
            nodes.append(helper.make_node("Add", [a, b], [out]))
        elif kind == 1:
            nodes.append(helper.make_node("Mul", [a, "b"], [out]))
        elif kind == 2:
            nodes.append(helper.make_node("Relu", [a], [out]))
        elif kind == 3:
            nodes.append(helper.make_node("MatMul", [a, "w"], [out]))
        else:
            nodes.append(helper.make_node("Flatten", [a], [f"{out}_f"], axis=0))
            nodes.append(helper.make_node("Reshape", [f"{out}_f", "shape"], [out]))
        values.append(out)
    inits["shape"] = np.array([4, 6], np.int64)
    outputs = [values[-1], values[len(values) // 2]]
    return model(nodes, feeds, outputs, inits), feeds


@pytest.mark.parametrize("seed", range(6))
def test_random_graphs_plan_and_run_correctly(seed):
    from oracle import assert_matches

    import edgetrain
    m, feeds = _random_dag(seed)
    assert_matches(m, feeds, rtol=1e-4, atol=1e-4)
    sess = edgetrain.InferenceSession(m.SerializeToString())
    check_invariants(sess.program(feeds).plan)
