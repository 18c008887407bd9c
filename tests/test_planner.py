"""Planner invariants (not offsets): live buffers never overlap, held buffers are never shared, arena <= naive."""
import numpy as np
import pytest
from conftest import BENCH_MODELS, random_feed
from hypothesis import HealthCheck, example, given, settings
from plancheck import DAGS, SWITCHES, check_invariants, dag_model, switched

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


@pytest.mark.parametrize("name", BENCH_MODELS)
def test_bench_model_plans_keep_invariants(shared, name):
    plan = _plan(shared / "models" / f"{name}.onnx")
    check_invariants(plan)
    if name == "digits":    # x -> h -> logits, biases added by the GEMMs: each value alive with its neighbour's
        assert [s.kind for s in plan.steps] == ["kernel", "kernel"] and plan.arena_bytes == plan.naive_bytes
    else:
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
    rng = np.random.default_rng(seed)
    ops = [(int(rng.integers(0, 5)), *map(int, rng.integers(0, 1000, 2))) for _ in range(14)]
    return dag_model(ops, [13, 6])


@pytest.mark.parametrize("seed", range(6))
def test_random_graphs_plan_and_run_correctly(seed):
    from oracle import assert_matches

    import edgetrain
    m, feeds = _random_dag(seed)
    assert_matches(m, feeds, rtol=1e-4, atol=1e-4)
    sess = edgetrain.InferenceSession(m.SerializeToString())
    check_invariants(sess.program(feeds).plan)


@settings(max_examples=100, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(DAGS)
# v0 read by two one-node groups that one Add seals in turn: the first may not take v0's bytes, still read next
@example(([(3, 0, 0), (2, 0, 0), (7, 1, 1), (0, 1, 0)], [3]))
def test_random_graphs_keep_invariants_fused_or_not(dag):
    """Property: every random DAG plans with no two live values sharing a byte, fused step by step or not."""
    from edgetrain.onnx_io import to_graph
    m, feeds = dag_model(*dag)
    graph = to_graph(m)
    types = bind_feeds(graph.inputs, feeds, "test")
    with pytest.MonkeyPatch.context() as mp:
        for switches in (SWITCHES["planned+fused"], SWITCHES["planned"]):
            switched(mp, switches)
            check_invariants(make_plan(graph, types, [v.name for v in graph.outputs]))


def test_checked_shape_takes_integer_dims_only():
    """The planner's size check: plain ints (its fast path) and numpy integers pass, exactly; negative,
    boolean, float and symbolic dims and sizes beyond int64 are refused, naming the tensor."""
    from edgetrain.budget import checked_shape
    from edgetrain.errors import ShapeError

    assert checked_shape((2, 3, 0), 4, "t") == 0
    assert checked_shape((2, np.int64(3)), 4, "t") == 24
    assert checked_shape((), 8, "t") == 8
    for bad in ((2, -1), (True, 2), (2.0, 3), ("N", 3), (2**40, 2**40)):
        with pytest.raises(ShapeError, match="tensor 't'"):
            checked_shape(bad, 4, "tensor 't'")
