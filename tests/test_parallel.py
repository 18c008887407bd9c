"""edgetrain.parallel: the blocks of intra-op threads cover every item once, each running thread has its own slot,
and a block's error is raised after every block has stopped."""
import threading

import pytest

from edgetrain import config, parallel


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
    # the fused loop reads t, which dies there: the planner writes its output over t (the in-place form, t read
    # through the output's array); b broadcasts along every dim but the channels
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
    monkeypatch.setattr(program, "SPLIT_ELEMENTS", 1 << 18)     # the first shape splits, the others do not
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


def _conv_training(tmp_path, group, side=20, stride=None):
    """Artifacts of x[4, 8, side, side] -> Conv 3x3 (stride 2 when depthwise unless ``stride`` says) -> Relu ->
    mean -> MSE."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from edgetrain import artifacts
    rng = np.random.default_rng(group)
    c_w = 8 // group
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1], group=group,
                              strides=[stride or (2 if group > 1 else 1)] * 2),
             helper.make_node("Relu", ["y"], ["r"]),
             helper.make_node("ReduceMean", ["r"], ["out"], axes=[2, 3], keepdims=0)]
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8, side, side])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 8])],
                          [numpy_helper.from_array(rng.standard_normal((8, c_w, 3, 3)).astype(np.float32), "w")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    artifacts.generate_artifacts(m, requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    return rng.standard_normal((4, 8, side, side)).astype(np.float32), rng.standard_normal((4, 8)).astype(np.float32)


@pytest.mark.parametrize("group,side,stride", [(1, 20, 1), (8, 20, 2), (1, 6, 1), (8, 12, 1)])
def test_conv_and_its_gradient_split_over_threads_agree(monkeypatch, split_calls, tmp_path, group, side, stride):
    """Conv (im2col + GEMM per image, or one GEMM over the batch for small images; depthwise direct, per plane
    or on stacked planes) and ConvGrad's im2col/col2im split over the batch at 2 threads, their GEMMs in blocks
    (per image, per row block): the same loss and gradient as at 1 thread, and the split ran."""
    import numpy as np

    from edgetrain.api import CheckpointState, Module, Optimizer
    from edgetrain.kernels import _gemm_pool, _gemm_threads
    from edgetrain.ops import conv
    monkeypatch.setattr(conv, "SPLIT_WORK", 1)       # the test model is small: split anyway
    monkeypatch.setattr(_gemm_threads, "MIN_FLOPS", 0)   # ... and its GEMMs into blocks
    monkeypatch.setattr(_gemm_threads, "MIN_ROWS", 1)
    monkeypatch.setattr(_gemm_pool, "MIN_FLOPS", 0)      # (on the native pool where it takes them)
    x, y = _conv_training(tmp_path, group, side, stride)
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


def _attention_training(tmp_path):
    """Artifacts of x[4, 2, 16, 8] -> q = x @ w, s = q @ x^T (stacked GEMMs over batch and heads), Softmax,
    o = s @ x, LayerNormalization(o; scale, bias), mean over heads and features -> MSE; and a batch."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    from edgetrain import artifacts
    rng = np.random.default_rng(3)
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w"], ["q"]), n("Transpose", ["x"], ["kt"], perm=[0, 1, 3, 2]),
             n("MatMul", ["q", "kt"], ["s"]), n("Softmax", ["s"], ["p"], axis=-1), n("MatMul", ["p", "x"], ["o"]),
             n("LayerNormalization", ["o", "scale", "bias"], ["ln"], axis=-1),
             n("ReduceMean", ["ln", "axes"], ["out"], keepdims=0)]
    inits = {"w": rng.standard_normal((8, 8)) * 0.5, "scale": 1 + 0.1 * rng.standard_normal(8),
             "bias": 0.1 * rng.standard_normal(8)}
    g = helper.make_graph(nodes, "attention", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 2, 16, 8])],
                          [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 16])],
                          [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()]
                          + [numpy_helper.from_array(np.array([1, 3], np.int64), "axes")])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    artifacts.generate_artifacts(m, requires_grad=list(inits), loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.SGD, artifact_directory=tmp_path)
    x = rng.standard_normal((4, 2, 16, 8)).astype(np.float32)
    return x, rng.standard_normal((4, 16)).astype(np.float32), inits


def test_attention_rows_and_stacked_gemms_split_over_threads_agree_with_torch(monkeypatch, split_calls, tmp_path):
    """Softmax, SoftmaxGrad and LayerNormalization in blocks of rows and the stacked GEMMs in blocks of whole
    matrices at 2 threads: the loss and gradients are 1 thread's to the bit and torch's (the oracle), and both
    kinds of split ran."""
    import numpy as np
    import torch

    from edgetrain import kernels
    from edgetrain.api import CheckpointState, Module, Optimizer
    from edgetrain.kernels import _gemm_pool, _gemm_threads
    monkeypatch.setattr(kernels, "ROW_BLOCK", 1)                  # the test model is small: split anyway
    monkeypatch.setattr(_gemm_threads, "MIN_BATCHED_FLOPS", 0)
    monkeypatch.setattr(_gemm_pool, "MIN_FLOPS", 0)     # stacks on the native pool, one sgemm per matrix as
    monkeypatch.setattr(_gemm_pool, "MIN_CUT", 1 << 30)     # numpy; 2-D GEMMs whole (row blocks round apart)
    stacked, native = [], []
    real_blocks, real_call = parallel.run_blocks, _gemm_pool._Pool.call
    monkeypatch.setattr(parallel, "run_blocks", lambda blocks, threads: (stacked.append(len(blocks)),
                                                                         real_blocks(blocks, threads)))
    monkeypatch.setattr(_gemm_pool._Pool, "call", lambda pool, *a: (native.append(1), real_call(pool, *a)))
    x, y, inits = _attention_training(tmp_path)
    got = {}
    for threads in ("1", "2"):
        monkeypatch.setenv("EDGETRAIN_NUM_THREADS", threads)
        split_calls.clear()
        stacked.clear()
        native.clear()
        module = Module(tmp_path / "training_model.onnx", CheckpointState.load_checkpoint(tmp_path / "checkpoint"))
        optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
        optimizer.set_learning_rate(1.0)         # w - gradient: the parameters after the step show the gradient
        module.train()
        loss = float(module(x, y))
        before = module.get_contiguous_parameters(trainable_only=True).numpy().copy()
        optimizer.step()
        got[threads] = (loss, before - module.get_contiguous_parameters(trainable_only=True).numpy())
        # Softmax, its gradient, LayerNormalization: in rows; the stacked GEMMs (forward and gradients): in blocks
        assert (len(split_calls) >= 3 and len(stacked) + len(native) >= 3) == (threads == "2"), (split_calls, stacked)
        assert bool(native) == (threads == "2")
    assert got["2"][0] == got["1"][0]
    np.testing.assert_array_equal(got["2"][1], got["1"][1])

    params = {k: torch.tensor(v.astype(np.float32), requires_grad=True) for k, v in inits.items()}
    xt = torch.tensor(x)
    o = torch.softmax((xt @ params["w"]) @ xt.transpose(-1, -2), dim=-1) @ xt
    ln = torch.nn.functional.layer_norm(o, (8,), params["scale"], params["bias"], eps=1e-5)
    want = torch.nn.functional.mse_loss(ln.mean(dim=(1, 3)), torch.tensor(y))
    want.backward()
    np.testing.assert_allclose(got["2"][0], float(want.detach()), rtol=1e-5)
    grads = np.concatenate([params[k].grad.numpy().reshape(-1) for k in inits])    # the checkpoint's order
    np.testing.assert_allclose(got["2"][1], grads, rtol=2e-4, atol=1e-6)


# --- the busy-wait between jobs (kernels/_spin.py) -----------------------------------------------------------

@pytest.fixture(params=["spin", "sleep"])
def hand_off(request):
    """The pools' threads busy-waiting between jobs (Numba loaded) or sleeping (the trimmed build,
    NUMBA_DISABLE_JIT)."""
    import edgetrain.kernels  # noqa: F401 -- loads Numba, which registers the busy-wait
    loop = parallel.spin_loop()
    if request.param == "spin" and loop is None:
        pytest.skip("no busy-wait without Numba's JIT")
    if request.param == "sleep":
        parallel.use_spin(None)
    yield request.param
    parallel.use_spin(loop)


@pytest.mark.parametrize("threads,n", [(2, 9), (3, 40), (2, 2)])
def test_pools_cover_each_block_once_spinning_or_sleeping(hand_off, threads, n):
    for _ in range(50):             # back-to-back jobs: helpers still spinning on the last one see the next
        seen, lock = [], threading.Lock()

        def block(slot, i):
            with lock:
                seen.append((i, slot))
        parallel.run_blocks([lambda slot, i=i: block(slot, i) for i in range(n)], threads)
        assert sorted(i for i, _ in seen) == list(range(n))
        assert {s for _, s in seen} <= set(range(threads))


@pytest.mark.parametrize("spin_us", [0, 20_000])
def test_a_helpers_error_is_raised_after_every_block_stopped(hand_off, monkeypatch, spin_us):
    """The caller's own blocks end first; the helper's block is still running when the caller looks (its wait
    for the last block is a spin of ``spin_us``, then a sleep): the error comes only once that block stopped."""
    import time
    monkeypatch.setenv("EDGETRAIN_SPIN_US", str(spin_us))
    barrier = threading.Barrier(2, timeout=10)
    stopped = []

    def block(slot):
        barrier.wait()              # one block each: a helper holds the other
        if slot:
            time.sleep(0.05)
            stopped.append(slot)
            raise ValueError("helper block failed")
    for _ in range(3):
        stopped.clear()
        with pytest.raises(ValueError, match="helper block failed"):
            parallel.run_blocks([block, block], 2)
        assert stopped == [1]


def test_idle_helpers_stop_spinning_and_sleep(hand_off, monkeypatch):
    """The spin is bounded: with no job, every helper is asleep on the lock after ``EDGETRAIN_SPIN_US``."""
    import time
    monkeypatch.setenv("EDGETRAIN_SPIN_US", "2000")
    parallel.run_blocks([lambda slot: None] * 6, 3)
    pool = parallel.pool(3)
    deadline = time.monotonic() + 10
    while pool.sleeping() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.sleeping() == 2
    parallel.run_blocks([lambda slot: None] * 6, 3)     # and sleepers are woken for the next job


@pytest.mark.native
def test_idle_pool_burns_no_cpu():
    """After a job, the process uses no CPU once the spin ran out (measures the host: native)."""
    import time

    import edgetrain.kernels  # noqa: F401
    parallel.run_blocks([lambda slot: None] * 4, 2)
    time.sleep(0.1 + config.spin_us() * 1e-6)
    t = time.process_time()
    time.sleep(0.3)
    assert time.process_time() - t < 0.05


def test_spin_loop_sees_another_threads_write_and_checks_its_index():
    import time

    import numpy as np

    import edgetrain.kernels  # noqa: F401
    if parallel.spin_loop() is None:
        pytest.skip("no busy-wait without Numba's JIT")
    loop = parallel.spin_loop()
    state = np.zeros(2, np.int64)
    assert loop(state, 1, 0, True, 1000) == 0             # bounded: nothing changes, it returns
    assert loop(state, 1, 5, False, 1000) == 0
    writer = threading.Timer(0.05, lambda: state.__setitem__(1, 7))
    writer.start()
    t = time.perf_counter()
    assert loop(state, 1, 0, True, 1 << 62) == 7          # the write ends the wait (else: spins for ever)
    assert time.perf_counter() - t < 5
    writer.join()
    with pytest.raises(IndexError, match="spin"):
        loop(state, 2, 0, True, 1)


def test_spin_time_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("EDGETRAIN_SPIN_US", "0")
    assert config.spin_us() == 0
    monkeypatch.setenv("EDGETRAIN_SPIN_US", "fast")
    with pytest.raises(ValueError, match="EDGETRAIN_SPIN_US"):
        config.spin_us()
