"""edgetrain.parallel: the batch split of intra-op threads covers every item once, gives each concurrent slice its
own slot, and raises a slice's error after every slice has stopped."""
import threading

import pytest

from edgetrain import parallel


@pytest.mark.parametrize("threads,n,min_each", [(1, 10, 1), (2, 10, 1), (2, 1, 1), (3, 7, 1), (2, 10, 6),
                                                (2, 0, 1)])
def test_split_covers_each_item_once_with_distinct_slots(monkeypatch, threads, n, min_each):
    monkeypatch.setenv("EDGETRAIN_NUM_THREADS", str(threads))
    seen, slots, lock = [], [], threading.Lock()

    def work(slot, lo, hi):
        with lock:
            seen.extend(range(lo, hi))
            slots.append(slot)
    parallel.split(n, work, min_each)
    assert sorted(seen) == list(range(n))
    assert sorted(slots) == list(range(len(slots))) and len(slots) <= threads
    assert len(slots) == max(1, min(threads, n // min_each))


def test_slices_run_at_once_and_errors_surface(monkeypatch):
    monkeypatch.setenv("EDGETRAIN_NUM_THREADS", "2")
    barrier = threading.Barrier(2, timeout=10)   # both slices must be running together to pass it
    done = []

    def work(slot, lo, hi):
        barrier.wait()
        if slot == 1:
            raise ValueError("slice 1 failed")
        done.append(slot)
    with pytest.raises(ValueError, match="slice 1 failed"):
        parallel.split(4, work)
    assert done == [0]


def _chain_model(shape):
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    n = helper.make_node
    # the fused loop reads t, which dies there: the planner writes its output over t (the in-place form, with
    # scratch rows); b broadcasts along every dim but the channels
    nodes = [n("Transpose", ["x"], ["t"], perm=[0, 1, 3, 2]), n("Mul", ["t", "t"], ["x2"]),
             n("Add", ["x2", "b"], ["a"]), n("Relu", ["a"], ["r"]), n("Sigmoid", ["r"], ["s"]),
             n("Mul", ["s", "x2"], ["z"]), n("Transpose", ["z"], ["y"], perm=[0, 1, 3, 2])]
    out = list(shape)
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, out)],
                          [numpy_helper.from_array(
                              np.random.default_rng(1).standard_normal((1, shape[1], 1, 1)).astype(np.float32), "b")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize("shape", [(2, 8, 64, 64), (1, 3, 200, 200), (4, 2, 9, 7)])
def test_fused_loops_split_over_threads_give_the_same_bits(monkeypatch, shape):
    """The same model at 1 and 2 threads: bit-identical outputs (element-wise work does not depend on the
    split), and the large loops did run split."""
    import numpy as np

    from edgetrain.runtime import program
    from edgetrain.session import InferenceSession
    model = _chain_model(shape).SerializeToString()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    calls = []
    real = parallel.split
    monkeypatch.setattr(parallel, "split", lambda n, work, m=1: (calls.append(n), real(n, work, m)))
    out = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("EDGETRAIN_NUM_THREADS", threads)
        out[threads] = InferenceSession(model).run(None, {"x": x})[0].copy()
    np.testing.assert_array_equal(out["1"], out["2"])
    want = np.prod(shape) >= program.SPLIT_ELEMENTS
    assert bool(calls) == bool(want)
