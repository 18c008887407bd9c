"""kernels/_gemm_pool.py: float32 GEMMs cut into blocks that native threads claim and run through numpy's own
BLAS by address. Oracles: numpy's float64 matmul of the same operands, onnxruntime for whole ops."""
import threading
import time

import numpy as np
import pytest
from onnx import helper

import edgetrain
from edgetrain import config
from edgetrain.kernels import _gemm_pool

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage: LP64 BLAS builds, the aarch64 spin hint
rng = np.random.default_rng(7)


@pytest.fixture
def threads(monkeypatch, request):
    n = getattr(request, "param", 2)
    monkeypatch.setattr(config, "num_threads", lambda: n)
    monkeypatch.setattr(_gemm_pool, "MIN_FLOPS", 0)         # small operands: split anyway
    if _gemm_pool._NO_JIT:
        pytest.skip("the native pool's intrinsics need Numba's JIT")
    return n


def _f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def _run(a, b, alpha=1.0):
    """y from the native job (NaN-filled first: every element must be written), and the job's descriptor."""
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    y = np.full(shape, np.nan, np.float32)
    job = _gemm_pool.job(a, b, y, alpha)
    assert job is not None
    fn, args = job
    fn(*args)
    return y, fn


def _check(a, b, alpha=1.0):
    y, _ = _run(a, b, alpha)
    want = alpha * np.matmul(a.astype(np.float64), b.astype(np.float64))
    np.testing.assert_allclose(y, want, rtol=2e-5, atol=2e-5 * np.abs(want).max())
    return y


@pytest.mark.parametrize("threads", [2, 3], indirect=True)
@pytest.mark.parametrize("m,k,n", [(37, 19, 23), (11, 19, 41), (64, 8, 3), (3, 8, 70), (200, 33, 130)])
@pytest.mark.parametrize("trans_a,trans_b", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_two_dim_gemms_in_row_or_column_blocks(threads, m, k, n, trans_a, trans_b):
    """Row blocks when y is tall, column blocks when wide (uneven sizes: the last block is short); transposed
    operands are views BLAS takes with their leading dims, as numpy's matmul does."""
    a = _f32(k, m).T if trans_a else _f32(m, k)
    b = _f32(n, k).T if trans_b else _f32(k, n)
    if max(m, n) // _gemm_pool.MIN_CUT < 2:
        assert _gemm_pool.job(a, b, np.empty((m, n), np.float32)) is None      # too few rows for two blocks
        return
    _check(a, b, alpha=0.5 if trans_a else 1.0)


def test_views_with_a_row_stride_beyond_the_row(threads):
    """A column slice of a wider matrix: its leading dim is the wider row, not its own width."""
    wide = _f32(40, 70)
    _check(wide[:, 5:37], _f32(32, 50))
    y = np.full((40, 90), np.nan, np.float32)
    fn, args = _gemm_pool.job(_f32(40, 16), _f32(16, 60), y[:, 10:70])
    fn(*args)
    assert np.isnan(y[:, :10]).all() and np.isnan(y[:, 70:]).all()         # nothing written beside the view


@pytest.mark.parametrize("threads", [2, 3], indirect=True)
def test_stacks_of_matrices(threads):
    """Stacked GEMMs in blocks of whole matrices: contiguous stacks, a weight broadcast over the stack (a conv's
    W against each image's columns), and attention's permuted heads, whose two leading axes do not collapse
    into one (the stack runs as outer x inner)."""
    _check(_f32(6, 20, 9), _f32(6, 9, 12))
    _check(_f32(16, 36), _f32(5, 36, 49))
    batch, heads, t, d = 3, 4, 10, 8
    q = _f32(batch, t, heads, d).transpose(0, 2, 1, 3)
    k = _f32(batch, t, heads, d).transpose(0, 2, 3, 1)
    scores = _check(q, k, alpha=0.25)
    v = _f32(batch, t, heads, d).transpose(0, 2, 1, 3)
    _check(np.ascontiguousarray(scores), v)


def test_an_output_transposed_in_memory(threads):
    """A permuted output whose matrices are column-major (attention's gradient written in the forward's
    layout) runs as y^T = b^T @ a^T into its row-major view."""
    a, b = _f32(3, 4, 40, 24), _f32(3, 4, 24, 36)
    y = np.full((3, 4, 36, 40), np.nan, np.float32).swapaxes(-1, -2)
    fn, args = _gemm_pool.job(a, b, y)
    fn(*args)
    np.testing.assert_allclose(y, np.matmul(a.astype(np.float64), b), rtol=2e-5, atol=2e-5)


def test_what_it_leaves_to_numpy(threads):
    """None (numpy's matmul then runs the GEMM whole) for: float64, an operand whose rows are strided
    elements, an output overlapping an operand or broadcast along the stack, one thread, too small."""
    a, b = _f32(64, 32), _f32(32, 48)
    y = np.zeros((64, 48), np.float32)
    assert _gemm_pool.job(a.astype(np.float64), b.astype(np.float64), y.astype(np.float64)) is None
    assert _gemm_pool.job(_f32(64, 64)[:, ::2], b, y) is None
    square = _f32(64, 64)
    assert _gemm_pool.job(square, _f32(64, 64), square) is None
    assert _gemm_pool.job(_f32(3, 64, 32), b, np.broadcast_to(y, (3, 64, 48))) is None
    assert _gemm_pool.job(a, b, y) is not None
    config_threads = config.num_threads
    try:
        config.num_threads = lambda: 1
        assert _gemm_pool.job(a, b, y) is None
    finally:
        config.num_threads = config_threads


def test_another_thread_calling_meanwhile_runs_its_gemm_whole(threads):
    """One caller at a time: concurrent callers from several Python threads all get right answers (the ones
    that find the pool busy run numpy's matmul)."""
    jobs = [(_f32(96, 40), _f32(40, 80)) for _ in range(4)]
    outs = [np.empty((96, 80), np.float32) for _ in jobs]
    launches = [_gemm_pool.job(a, b, y)[0] for (a, b), y in zip(jobs, outs)]
    errors = []

    def loop(k):
        try:
            for _ in range(200):
                outs[k].fill(np.nan)
                launches[k]()
                np.testing.assert_allclose(outs[k], jobs[k][0] @ jobs[k][1], rtol=1e-4, atol=1e-4)
        except AssertionError as e:
            errors.append(e)
    workers = [threading.Thread(target=loop, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors, errors[0]


def test_idle_helpers_sleep_and_wake_for_the_next_job(threads, monkeypatch):
    """After ``EDGETRAIN_SPIN_US`` without a job every helper sleeps; the next job wakes them and is right."""
    monkeypatch.setattr(_gemm_pool, "_POOLS", {})        # a fresh pool: its spin timed with the setting below
    monkeypatch.setenv("EDGETRAIN_SPIN_US", "1000")
    a, b = _f32(128, 64), _f32(64, 96)
    y, fn = _run(a, b)
    pool = _gemm_pool._POOLS[threads]
    deadline = time.monotonic() + 10
    while pool.ctl[_gemm_pool.W_ASLEEP] < threads - 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool.ctl[_gemm_pool.W_ASLEEP] == threads - 1
    y.fill(np.nan)
    fn()
    np.testing.assert_allclose(y, a @ b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("node, shapes", [
    (helper.make_node("MatMul", ["a", "b"], ["y"]), ((37, 19), (19, 23))),
    (helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain="com.microsoft", transA=1, transB=1,
                      alpha=0.5), ((19, 37), (23, 19))),
    (helper.make_node("MatMul", ["a", "b"], ["y"]), ((2, 3, 17, 19), (2, 3, 19, 23))),
])
def test_matmul_ops_run_on_the_native_pool_against_onnxruntime(threads, node, shapes):
    """A session at 2 threads binds the op to the native pool (its launcher names ``run``) and agrees with
    onnxruntime."""
    from oracle import model, run_onnxruntime
    feeds = {"a": _f32(*shapes[0]), "b": _f32(*shapes[1])}
    m = model(node, feeds, ["y"])
    sess = edgetrain.InferenceSession(m.SerializeToString())
    fn, _ = sess.program(feeds).calls[0]
    assert fn.kernel_calls[0][0] is _gemm_pool.run
    want = run_onnxruntime(m, feeds)[0]
    for _ in range(3):
        np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-5, atol=1e-5)


def _adamw_state(n):
    return [_f32(n) for _ in range(3)] + [np.abs(_f32(n))]


@pytest.mark.parametrize("threads", [2, 3], indirect=True)
@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("n", [5, 1001])
def test_adamw_in_blocks_gives_one_calls_bits(threads, monkeypatch, mode, n):
    """An AdamW update cut into blocks of the flat state (uneven: the last block is short) gives every element
    the bits one call of the kernel gives it, in both of onnxruntime's modes; the caller's scratch is not shared
    with the blocks'."""
    from edgetrain.kernels import training
    monkeypatch.setattr(_gemm_pool, "UPDATE_MIN", 0)
    start = _adamw_state(n)
    lr, step = np.array([1e-2], np.float32), np.array([3], np.int64)
    consts = np.array([0.9, 0.999, 0.1, 0.001, 1e-6, 0.01], np.float32)
    one, blocks = [x.copy() for x in start], [x.copy() for x in start]
    training.adamw_update(*one, lr, step, consts, np.zeros(6, np.float32), mode, True)
    fn, args = _gemm_pool.adamw_job((*blocks, lr, step, consts, np.zeros(6, np.float32), mode, True))
    for _ in range(2):      # compiled on the first call, direct on the second
        fn(*args)
        for got, want in zip(blocks, one):
            np.testing.assert_array_equal(got, want)
        training.adamw_update(*one, lr, step, consts, np.zeros(6, np.float32), mode, True)
    assert all(not np.array_equal(a, b) for a, b in zip(blocks[:1] + blocks[2:], start[:1] + start[2:]))


def test_adamw_stays_one_call_where_blocks_do_not_apply(monkeypatch):
    """One thread, a float64 state, or fewer elements than ``UPDATE_MIN``: no job (the caller's loop runs)."""
    lr, step = np.array([1e-2], np.float32), np.array([1], np.int64)
    consts = np.ones(6, np.float32)
    job = lambda state: _gemm_pool.adamw_job((*state, lr, step, consts.astype(state[0].dtype),
                                              np.zeros(6, state[0].dtype), 1, True))
    n = _gemm_pool.UPDATE_MIN
    monkeypatch.setattr(config, "num_threads", lambda: 1)
    assert job(_adamw_state(n)) is None
    monkeypatch.setattr(config, "num_threads", lambda: 2)
    if _gemm_pool._NO_JIT:
        assert job(_adamw_state(n)) is None
        return
    assert job(_adamw_state(n)) is not None
    assert job(_adamw_state(n - 1)) is None
    assert job([x.astype(np.float64) for x in _adamw_state(n)]) is None


def test_training_at_two_threads_updates_on_the_native_pool_with_one_threads_bits(monkeypatch, tmp_path):
    """edgetrain's AdamW artifacts at 2 threads (GEMMs kept whole, so only the update is split): the optimizer
    program binds the native update, and three steps leave every parameter and moment as 1 thread does."""
    from onnx import TensorProto, numpy_helper

    from edgetrain import artifacts
    from edgetrain.api import CheckpointState, Module, Optimizer
    from edgetrain.kernels import _gemm_threads
    if _gemm_pool._NO_JIT:
        pytest.skip("the native pool's intrinsics need Numba's JIT")
    monkeypatch.setattr(_gemm_pool, "UPDATE_MIN", 64)
    monkeypatch.setattr(_gemm_pool, "MIN_FLOPS", 1 << 60)
    monkeypatch.setattr(_gemm_threads, "MIN_FLOPS", 1 << 60)
    w = rng.standard_normal((24, 40)).astype(np.float32)
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)], "linear",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 40])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 24])],
                          [numpy_helper.from_array(w, "w")])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    artifacts.generate_artifacts(model, requires_grad=["w"], loss=artifacts.LossType.MSELoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)
    x, target = _f32(8, 40), _f32(8, 24)
    jobs = []
    real = _gemm_pool.adamw_job
    monkeypatch.setattr(_gemm_pool, "adamw_job", lambda call: jobs.append(real(call)) or jobs[-1])
    got = {}
    for threads in (1, 2):
        monkeypatch.setattr(config, "num_threads", lambda threads=threads: threads)
        jobs.clear()
        state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
        module = Module(tmp_path / "training_model.onnx", state)
        optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
        module.train()
        for _ in range(3):
            module(x, target)
            optimizer.step()
            module.lazy_reset_grad()
        assert jobs and all((j is not None) == (threads == 2) for j in jobs)    # one per gradient slot bound
        path = tmp_path / f"after{threads}"
        CheckpointState.save_checkpoint(state, path)
        got[threads] = path.read_bytes()
    assert got[1] == got[2]
