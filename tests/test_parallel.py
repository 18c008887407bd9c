"""edgetrain.parallel: the blocks of intra-op threads cover every item once, each running thread has its own slot,
and a block's error is raised after every block has stopped."""
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
    assert set(slots) <= set(range(threads))
    if threads == 1 or n < 2 * min_each:
        assert slots == [0]             # one thread's worth: run whole, in the caller


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
        parallel.split(2, work)         # two blocks: the caller holds one at the barrier, a helper the other
    assert done == [0]


@pytest.fixture
def split_calls(monkeypatch):
    """The ``n`` of every ``parallel.split`` call made while the test runs (the splits still run)."""
    calls = []
    real = parallel.split
    monkeypatch.setattr(parallel, "split", lambda n, work, *rest: (calls.append(n), real(n, work, *rest)))
    return calls


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


@pytest.mark.parametrize("shape", [(2, 8, 128, 128), (1, 3, 300, 300), (4, 2, 9, 7)])
def test_fused_loops_split_over_threads_give_the_same_bits(monkeypatch, split_calls, shape):
    """The same model at 1 and 2 threads: bit-identical outputs (element-wise work does not depend on the
    split), and the large loops did run split."""
    import numpy as np

    from edgetrain.runtime import program
    from edgetrain.session import InferenceSession
    model = _chain_model(shape).SerializeToString()
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    calls = split_calls
    out = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("EDGETRAIN_NUM_THREADS", threads)
        out[threads] = InferenceSession(model).run(None, {"x": x})[0].copy()
    np.testing.assert_array_equal(out["1"], out["2"])
    want = np.prod(shape) >= program.SPLIT_ELEMENTS
    assert bool(calls) == bool(want)


def _conv_training(tmp_path, group):
    """Artifacts of x[4, 8, 20, 20] -> Conv 3x3 (stride 2 when depthwise) -> Relu -> mean -> MSE."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from edgetrain import artifacts
    rng = np.random.default_rng(group)
    c_w = 8 // group
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=group,
                              strides=[2, 2] if group > 1 else [1, 1]),
             helper.make_node("Relu", ["y"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["out"], axes=[2, 3], keepdims=0)]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8, 20, 20])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 8])],
                          [numpy_helper.from_array(rng.standard_normal((8, c_w, 3, 3)).astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    artifacts.generate_artifacts(m, requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    return rng.standard_normal((4, 8, 20, 20)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)


@pytest.mark.parametrize("group", [1, 8])
def test_conv_and_its_gradient_split_over_threads_agree(monkeypatch, split_calls, tmp_path, group):
    """Conv (im2col + GEMM, and depthwise direct) and ConvGrad's im2col/col2im split over the batch at 2
    threads, their GEMMs in blocks (per image, per row block): the same loss and gradient as at 1 thread, and
    the split ran."""
    import numpy as np

    from edgetrain.api import CheckpointState, Module, Optimizer
    from edgetrain.ops import conv
    from edgetrain.kernels import _gemm_threads
    monkeypatch.setattr(conv, "SPLIT_WORK", 1)       # the test model is small: split anyway
    monkeypatch.setattr(_gemm_threads, "MIN_FLOPS", 0)   # ... and its GEMMs into blocks
    monkeypatch.setattr(_gemm_threads, "MIN_ROWS", 1)
    x, y = _conv_training(tmp_path, group)
    calls = split_calls
    got = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("EDGETRAIN_NUM_THREADS", threads)
        calls.clear()
        module = Module(tmp_path / "training_model.onnx", CheckpointState.load_checkpoint(tmp_path / "checkpoint"))
        optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
        optimizer.set_learning_rate(1.0)         # w - gradient: the parameters after the step show dW
        module.train()
        loss = float(module(x, y))
        before = module.get_contiguous_parameters(trainable_only=True).numpy().copy()
        optimizer.step()
        grad = before - module.get_contiguous_parameters(trainable_only=True).numpy()
        assert np.abs(grad).max() > 1e-3
        got[threads] = (loss, grad)
        assert (len(calls) >= (2 if group == 1 else 1)) == (threads == "2"), calls
    np.testing.assert_allclose(got["2"][0], got["1"][0], rtol=1e-6)
    np.testing.assert_allclose(got["2"][1], got["1"][1], rtol=1e-5, atol=1e-7)
