"""edgetrain.api with onnxruntime.training.api's semantics, on ORT's own artifacts and on edgetrain's."""
import numpy as np
import onnxruntime
import pytest

from edgetrain import artifacts, checkpoint
from edgetrain.api import CheckpointState, LinearLRScheduler, Module, Optimizer
from edgetrain.errors import EdgetrainError, InputError
from edgetrain.ir import TensorType


def _mlp(shared, eval_model=True):
    d = shared / "ort_artifacts" / "mlp"
    state = CheckpointState.load_checkpoint(d / "checkpoint")
    module = Module(d / "training_model.onnx", state, d / "eval_model.onnx" if eval_model else None)
    return d, state, module


def _batch(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((64, 784)).astype(np.float32), rng.integers(0, 10, 64)


def test_gradients_accumulate_until_lazy_reset(shared):
    _, state, module = _mlp(shared)
    x, y = _batch()
    np.testing.assert_array_equal(state.parameters["fc1.weight"].grad, 0)   # zeros before any step, as in ORT
    module(x, y)
    once = state.parameters["fc1.weight"].grad
    module(x, y)
    np.testing.assert_allclose(state.parameters["fc1.weight"].grad, 2 * once, rtol=1e-6, atol=1e-9)
    module.lazy_reset_grad()
    module(x, y)
    np.testing.assert_allclose(state.parameters["fc1.weight"].grad, once, rtol=1e-6)


@pytest.mark.parametrize("direct", [True, False], ids=["direct gradients", "accumulator nodes"])
def test_steps_without_reset_accumulate_the_sum_of_torchs_gradients(shared, monkeypatch, direct):
    """Two training steps on two batches without lazy_reset_grad leave grad(batch 1) + grad(batch 2) in every
    gradient buffer, with torch autograd (float64) as the oracle. Both ways a gradient reaches its buffer run:
    written straight by its kernel (the module keeps the sum aside and adds it back), and, with that rewrite
    switched off, through InPlaceAccumulatorV2's own add branch."""
    import torch
    import torch_ref

    import edgetrain.plan
    if not direct:
        monkeypatch.setattr(edgetrain.plan, "direct_gradients_into", lambda spec, external: [])
    d = shared / "ort_artifacts" / "digits"
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((16, 64)).astype(np.float32), rng.integers(0, 10, 16)) for _ in range(2)]
    state = CheckpointState.load_checkpoint(d / "checkpoint")
    module = Module(d / "training_model.onnx", state)
    params = {n: p.data for n, p in state.parameters if p.requires_grad}
    for x, y in batches:
        module(x, y)
    (bound,) = module.training_program.bound_steps()
    accumulators = sum(b.node.op_type == "InPlaceAccumulatorV2" for s in bound.program.plan.steps for b in s.nodes)
    assert accumulators == (0 if direct else len(params))
    want = {p: 0.0 for p in params}
    for x, y in batches:
        _, g = torch_ref.loss_and_gradients(shared / "models" / "digits.onnx", {"input": x, "labels": y},
                                            params, dtype=torch.float64)
        want = {p: want[p] + g[p] for p in params}
    for p in params:
        np.testing.assert_allclose(state.parameters[p].grad, want[p], rtol=1e-4, atol=1e-5 * np.abs(want[p]).max(),
                                   err_msg=p)


def test_names_sizes_and_contiguous_parameters(shared):
    _, state, module = _mlp(shared)
    assert module.input_names() == ["input", "labels"]
    assert module.output_names() == ["onnx::loss::2"]
    size = sum(p.data.size for _, p in state.parameters)
    assert module.get_parameters_size() == size == module.get_contiguous_parameters().size
    flat = module.get_contiguous_parameters(trainable_only=True)
    module.copy_buffer_to_parameters(np.zeros_like(flat))
    assert not state.parameters["fc3.bias"].data.any()


@pytest.mark.parametrize("trainable_only", [True, False])
def test_copy_buffer_to_parameters_fills_each_parameter_by_name(shared, trainable_only):
    """The flat buffer is laid out as ORT lays it: parameters in the order the training model declares them as
    inputs (read here with onnx, not through edgetrain), frozen ones (mobilenet's running statistics) included
    when trainable_only=False. Each parameter, looked up by name, must hold its own slice."""
    import onnx
    d = shared / "ort_artifacts" / "mobilenet"
    state = CheckpointState.load_checkpoint(d / "checkpoint")
    module = Module(d / "training_model.onnx", state, d / "eval_model.onnx")
    names = {n for n, p in state.parameters if p.requires_grad or not trainable_only}
    order = [i.name for i in onnx.load(str(d / "training_model.onnx")).graph.input if i.name in names]
    assert len(order) == len(names) and (trainable_only or any(not state.parameters[n].requires_grad
                                                               for n in order))
    sizes = [state.parameters[n].data.size for n in order]
    buffer = np.arange(sum(sizes), dtype=np.float32)
    module.copy_buffer_to_parameters(buffer, trainable_only=trainable_only)
    offsets = np.cumsum([0] + sizes)
    for n, start, stop in zip(order, offsets[:-1], offsets[1:]):
        np.testing.assert_array_equal(state.parameters[n].data.reshape(-1), buffer[start:stop], err_msg=n)
    np.testing.assert_array_equal(module.get_contiguous_parameters(trainable_only=trainable_only), buffer)


def test_parameter_assignment_copies_in_and_checks_the_type(shared):
    _, state, module = _mlp(shared)
    state.parameters["fc3.bias"] = np.full(10, 0.5, np.float32)
    assert (module.get_contiguous_parameters()[-10:] == 0.5).all()
    with pytest.raises(InputError, match="fc3.bias"):
        state.parameters["fc3.bias"] = np.zeros(11, np.float32)


def test_eval_step_and_export_match_onnxruntime(shared, tmp_path):
    _, _state, module = _mlp(shared)
    x, y = _batch()
    module(x, y)
    module.eval()
    loss = module(x, y)
    module.export_model_for_inferencing(tmp_path / "inference.onnx", ["output"])
    sess = onnxruntime.InferenceSession(str(tmp_path / "inference.onnx"))
    assert [i.name for i in sess.get_inputs()] == ["input"]
    logits = sess.run(None, {"input": x})[0]
    logp = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) - logits.max(
        1, keepdims=True)
    np.testing.assert_allclose(loss, -logp[np.arange(64), y].mean(), rtol=1e-5)


def test_clear_errors_where_ort_crashes_or_misleads(shared):
    _, _state, module = _mlp(shared, eval_model=False)
    x, y = _batch()
    with pytest.raises(EdgetrainError, match="eval model"):
        module.eval()(x, y)
    module.train()
    with pytest.raises(InputError, match="2 input"):
        module(x)
    with pytest.raises(InputError, match=r"'input'.*float\[64,784\]"):
        module(x.astype(np.float64), y)
    with pytest.raises(InputError, match="holds 10"):
        module(x, np.full(64, 10))
    with pytest.raises(EdgetrainError, match="not finite"):
        module(np.full_like(x, np.nan), y)


def test_optimizer_step_before_any_gradient_is_refused(shared):
    d, _state, module = _mlp(shared)
    opt = Optimizer(d / "optimizer_model.onnx", module)
    with pytest.raises(EdgetrainError, match="before any gradient"):
        opt.step()


def test_checkpoint_that_does_not_match_the_model(shared, tmp_path):
    d = shared / "ort_artifacts" / "mlp"
    ckpt = checkpoint.load(d / "checkpoint")
    missing = checkpoint.Checkpoint({k: v for k, v in ckpt.trainable.items() if k != "fc2.bias"})
    with pytest.raises(EdgetrainError, match="fc2.bias"):
        Module(d / "training_model.onnx", CheckpointState(missing))
    wrong = checkpoint.Checkpoint(dict(ckpt.trainable) | {"fc2.bias": np.zeros(7, np.float32)})
    with pytest.raises(EdgetrainError, match=r"fc2.bias.*float\[7\].*float\[128\]"):
        Module(d / "training_model.onnx", CheckpointState(wrong))


def test_properties_and_save_round_trip(shared, tmp_path):
    _, state, _module = _mlp(shared)
    state.properties["epoch"] = 3
    state.properties["best"] = 0.25
    state.properties["name"] = "mlp"
    with pytest.raises(InputError, match="list"):
        state.properties["bad"] = [1]
    state.parameters["fc3.bias"] = np.arange(10, dtype=np.float32)
    CheckpointState.save_checkpoint(state, tmp_path / "ckpt")
    again = CheckpointState.load_checkpoint(tmp_path / "ckpt")
    assert dict(again.properties) == {"epoch": 3, "best": 0.25, "name": "mlp"}
    np.testing.assert_array_equal(again.parameters["fc3.bias"].data, np.arange(10))
    assert [n for n, _ in again.parameters] == sorted(n for n, _ in state.parameters)


def test_linear_lr_scheduler_follows_the_documented_formula(shared):
    d, _state, module = _mlp(shared)
    opt = Optimizer(d / "optimizer_model.onnx", module)
    sched = LinearLRScheduler(opt, warmup_step_count=2, total_step_count=6, initial_lr=0.1)
    x, y = _batch()
    seen = [opt.get_learning_rate()]
    for _ in range(7):
        module(x, y)
        opt.step()
        sched.step()
        seen.append(opt.get_learning_rate())
    np.testing.assert_allclose(seen, [0.0, 0.05, 0.1, 0.075, 0.05, 0.025, 0.0, 0.0], atol=1e-8)


def _run(module, optimizer, batches):
    losses = []
    for x, y in batches:
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    return losses


def test_save_with_optimizer_state_then_resume_continues_identically(shared, tmp_path):
    d, state, module = _mlp(shared)
    opt = Optimizer(d / "optimizer_model.onnx", module)
    opt.set_learning_rate(2e-3)
    batches = [_batch(k) for k in range(6)]
    _run(module, opt, batches[:3])
    CheckpointState.save_checkpoint(state, tmp_path / "ckpt", include_optimizer_state=True)
    straight = _run(module, opt, batches[3:])

    resumed_state = CheckpointState.load_checkpoint(tmp_path / "ckpt")
    resumed = Module(d / "training_model.onnx", resumed_state, d / "eval_model.onnx")
    resumed_opt = Optimizer(d / "optimizer_model.onnx", resumed)
    assert resumed_opt.get_learning_rate() == pytest.approx(1e-3)   # the stored initial rate, as ORT stores it
    resumed_opt.set_learning_rate(2e-3)
    assert _run(resumed, resumed_opt, batches[3:]) == straight


def _file_backed(a: np.ndarray) -> bool:
    """Whether ``a`` is (a view of) the bytes a checkpoint was read from."""
    while isinstance(a, np.ndarray):
        a = a.base
    return isinstance(a, (bytearray, memoryview))


def test_the_file_bytes_are_let_go_once_the_store_holds_them(shared, tmp_path):
    """A kept view of the checkpoint's bytes keeps the whole file resident next to the store (peak memory)."""
    d, state, module = _mlp(shared)
    opt = Optimizer(d / "optimizer_model.onnx", module)
    _run(module, opt, [_batch(0)])
    CheckpointState.save_checkpoint(state, tmp_path / "ckpt", include_optimizer_state=True)
    saved = checkpoint.load(tmp_path / "ckpt")
    assert all(_file_backed(a) for a in saved.parameters.values())      # the reader gives views

    resumed_state = CheckpointState.load_checkpoint(tmp_path / "ckpt")
    resumed = Module(d / "training_model.onnx", resumed_state)
    ckpt = resumed_state._checkpoint
    assert not any(_file_backed(a) for a in ckpt.parameters.values())
    resumed_opt = Optimizer(d / "optimizer_model.onnx", resumed)
    moments = [m for g in ckpt.optimizer_groups for s in g.states.values() for m in s.values()]
    assert moments and not any(_file_backed(m) for m in moments)
    for name, a in saved.parameters.items():     # what the state reads is still the file's content
        np.testing.assert_array_equal(resumed_state.parameters[name].data, a)
    store = resumed.training_program.store
    for name, kinds in saved.optimizer_groups[0].states.items():
        for k, kind in enumerate(checkpoint.MOMENTUM_NAMES):
            np.testing.assert_array_equal(store.moment(k, name), kinds[kind])
    assert resumed_opt.step_count == 1


BENCH = ["cnn", "digits", "mlp", "mobilenet", "transformer"]


def _flow(folder, name, steps=3, shared=None):
    """3 AdamW steps on one batch, then an eval step: (training losses, eval loss, state). With ``shared``, the
    first loss is checked against the cross-entropy of the bench model's logits at the checkpoint's parameters."""
    import onnx
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    start = {n: np.array(p.data) for n, p in state.parameters}
    module = Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")
    opt = Optimizer(folder / "optimizer_model.onnx", module)
    graph = onnx.load(str(folder / "training_model.onnx")).graph
    first = graph.input[0]
    dims = [d.dim_value or 16 for d in first.type.tensor_type.shape.dim]
    rng = np.random.default_rng(0)
    x = rng.integers(0, 100, dims) if first.type.tensor_type.elem_type == 7 else rng.standard_normal(dims).astype(
        np.float32)
    classes = {"transformer": 4}.get(name, 10)
    y = rng.integers(0, classes, dims[0])
    losses = _run(module, opt, [(x, y)] * steps)
    if shared is not None:    # onnxruntime (on arm64 too) runs the forward model; cross-entropy in numpy
        model = onnx.load(str(shared / "models" / f"{name}.onnx"))
        for t in model.graph.initializer:
            if t.name in start:
                t.CopyFrom(onnx.numpy_helper.from_array(start[t.name], t.name))
        logits = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {model.graph.input[0].name: x})[0].astype(np.float64)
        shifted = logits - logits.max(1, keepdims=True)
        want = -(shifted[np.arange(len(y)), y] - np.log(np.exp(shifted).sum(1))).mean()
        np.testing.assert_allclose(losses[0], want, rtol=1e-5)
    module.eval()
    return losses, float(module(x, y)), state


@pytest.mark.parametrize("name", [pytest.param("digits", marks=pytest.mark.arm64)] + [b for b in BENCH if b != "digits"])
def test_whole_flow_on_ort_artifacts(shared, name):
    """(digits, the small one, is also the emulated arm64 stage's training run)"""
    losses, eval_loss, _ = _flow(shared / "ort_artifacts" / name, name, shared=shared)
    assert losses[-1] < losses[0] and np.isfinite(eval_loss)


@pytest.mark.parametrize("name", BENCH)
def test_whole_flow_on_edgetrain_artifacts_matches_ort_artifacts(shared, tmp_path, name):
    from edgetrain import artifacts
    ckpt = checkpoint.load(shared / "ort_artifacts" / name / "checkpoint")
    artifacts.generate_artifacts(str(shared / "models" / f"{name}.onnx"), requires_grad=list(ckpt.trainable),
                                 frozen_params=list(ckpt.frozen), loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)
    ours, ours_eval, state = _flow(tmp_path, name, shared=shared)
    theirs, theirs_eval, _ = _flow(shared / "ort_artifacts" / name, name)
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ours_eval, theirs_eval, rtol=1e-4, atol=1e-5)
    if name == "mobilenet":   # batch-norm running statistics move while training
        assert not np.allclose(state.parameters["bn1.running_mean"].data, ckpt.frozen["bn1.running_mean"])


SAVE_FOREVER = r'''
import sys, numpy as np
from edgetrain.api import CheckpointState, Module, Optimizer
art, path = sys.argv[1], sys.argv[2]
state = CheckpointState.load_checkpoint(art + "/checkpoint")
module = Module(art + "/training_model.onnx", state)
Optimizer(art + "/optimizer_model.onnx", module)
flat = module.get_contiguous_parameters(trainable_only=True, copy=False)   # live: writes change the state
k = 0
while True:
    flat[:] = k % 2            # the two states a reader may find: all zeros or all ones
    CheckpointState.save_checkpoint(state, path, include_optimizer_state=True)
    if k == 0:
        print("saved", flush=True)
    k += 1
'''


@pytest.mark.native
def test_a_process_killed_while_saving_leaves_a_whole_checkpoint(shared, tmp_path):
    """ORT 1.19.2 left a truncated file in 31 of 100 such kills; every kill here leaves the old or the new file."""
    import signal
    import subprocess
    import sys
    import time

    art, path = shared / "ort_artifacts" / "mlp", tmp_path / "checkpoint"
    script = tmp_path / "save_forever.py"
    script.write_text(SAVE_FOREVER)
    rng = np.random.default_rng(0)
    orphans = 0
    for kills in range(1, 41):         # 12 kills, and more until one lands inside a write (a loaded host's
        if kills > 12 and orphans:     # scheduler can let a dozen land between writes)
            break
        proc = subprocess.Popen([sys.executable, str(script), str(art), str(path)], stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdout.readline().strip() == "saved"
        time.sleep(rng.uniform(0.0, 0.2))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        orphans += len([p for p in tmp_path.iterdir() if p.name.endswith(".tmp")])
        state = CheckpointState.load_checkpoint(path)
        values = np.concatenate([np.asarray(p.data).reshape(-1) for _, p in state.parameters])
        assert np.all(values == values[0]) and values[0] in (0.0, 1.0)
    assert orphans > 0, "no kill landed during a write: the test did not exercise what it claims"
    CheckpointState.save_checkpoint(CheckpointState.load_checkpoint(path), path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint", "save_forever.py"]


ORT_CONTIGUOUS = r'''
d = ARGS["dir"]
state = ort_api.CheckpointState.load_checkpoint(d + "/checkpoint")
m = ort_api.Module(d + "/training_model.onnx", state, d + "/eval_model.onnx")
for trainable_only in (True, False):
    OUT[f"flat{int(trainable_only)}"] = m.get_contiguous_parameters(trainable_only=trainable_only).numpy()
    OUT[f"size{int(trainable_only)}"] = m.get_parameters_size(trainable_only=trainable_only)
'''


@pytest.mark.ort119
@pytest.mark.native
@pytest.mark.parametrize("name", ["cnn", "mobilenet"])
def test_contiguous_parameters_in_orts_order(shared, ort, name):
    art = shared / "ort_artifacts" / name
    out = ort.run(ORT_CONTIGUOUS, args={"dir": str(art)})
    state = CheckpointState.load_checkpoint(art / "checkpoint")
    module = Module(art / "training_model.onnx", state, art / "eval_model.onnx")
    for trainable_only in (True, False):
        ours = module.get_contiguous_parameters(trainable_only=trainable_only)
        assert module.get_parameters_size(trainable_only) == out[f"size{int(trainable_only)}"]
        np.testing.assert_array_equal(ours, out[f"flat{int(trainable_only)}"], err_msg=f"{trainable_only=}")


ORT_SNAPSHOT = r"""
d = ARGS["dir"]
state = ort_api.CheckpointState.load_checkpoint(d + "/checkpoint")
m = ort_api.Module(d + "/training_model.onnx", state, d + "/eval_model.onnx")
opt = ort_api.Optimizer(d + "/optimizer_model.onnx", m)
snapshot = m.get_contiguous_parameters()
OUT["initial"] = snapshot.numpy().copy()
OUT["methods"] = [snapshot.shape(), snapshot.data_type(), snapshot.device_name()]
m.train()
m(ARRAYS["x"], ARRAYS["y"])
opt.step()
OUT["snapshot_after_step"] = snapshot.numpy()
OUT["after_step"] = m.get_contiguous_parameters().numpy()
m.copy_buffer_to_parameters(snapshot)
OUT["rolled_back"] = m.get_contiguous_parameters().numpy()
"""


@pytest.mark.ort119
@pytest.mark.native
def test_contiguous_parameters_are_a_snapshot_with_ortvalue_methods_as_in_ort(shared, ort):
    """ORT hands back a copy in an OrtValue: a snapshot taken before optimizer.step() keeps its values (the
    federated-averaging and rollback pattern), answers .numpy()/.shape()/.data_type()/.device_name(), and
    copy_buffer_to_parameters takes it back. The same script on edgetrain gives the same values."""
    art = shared / "ort_artifacts" / "digits"
    x, y = np.random.default_rng(3).normal(size=(16, 64)).astype(np.float32), np.arange(16) % 10
    out = ort.run(ORT_SNAPSHOT, args={"dir": str(art)}, arrays={"x": x, "y": y})
    state = CheckpointState.load_checkpoint(art / "checkpoint")
    m = Module(art / "training_model.onnx", state, art / "eval_model.onnx")
    opt = Optimizer(art / "optimizer_model.onnx", m)
    snapshot = m.get_contiguous_parameters()
    initial = snapshot.numpy().copy()
    assert [snapshot.shape(), snapshot.data_type(), snapshot.device_name()] == out["methods"]
    assert snapshot.shape == (snapshot.size,) and isinstance(snapshot.numpy(), np.ndarray)
    m.train()
    m(x, y)
    opt.step()
    np.testing.assert_array_equal(initial, out["initial"])
    np.testing.assert_array_equal(snapshot, initial)              # still the values it was taken with
    np.testing.assert_array_equal(out["snapshot_after_step"], out["initial"])
    after = m.get_contiguous_parameters()
    assert np.abs(after - initial).max() > 0
    np.testing.assert_allclose(after, out["after_step"], rtol=1e-5, atol=1e-6)
    m.copy_buffer_to_parameters(snapshot)
    np.testing.assert_array_equal(m.get_contiguous_parameters(), out["rolled_back"])


class _ForeignValue:
    """Stands for ORT's OrtValue: something with .numpy() that is not an ndarray."""

    def __init__(self, array):
        self._array = array

    def numpy(self):
        return self._array


def test_zero_copy_view_is_opt_in_and_buffers_come_in_any_form(shared):
    _, state, module = _mlp(shared)
    view = module.get_contiguous_parameters(copy=False)
    copy = module.get_contiguous_parameters()
    state.parameters["fc3.bias"] = np.full(10, 0.25, np.float32)
    assert (view[-10:] == 0.25).all() and not (copy[-10:] == 0.25).all()
    for form in (copy, _ForeignValue(copy.numpy()), np.asarray(copy), list(copy)):
        module.copy_buffer_to_parameters(np.zeros_like(copy))
        module.copy_buffer_to_parameters(form)
        np.testing.assert_array_equal(module.get_contiguous_parameters(), copy, err_msg=type(form).__name__)
    assert type(copy + 1) is np.ndarray                            # arithmetic gives plain arrays


def test_zero_copy_view_refuses_frozen_parameters(shared):
    d = shared / "ort_artifacts" / "mobilenet"
    module = Module(d / "training_model.onnx", CheckpointState.load_checkpoint(d / "checkpoint"))
    with pytest.raises(InputError, match="trainable_only=True, or copy=True"):
        module.get_contiguous_parameters(copy=False)
    assert module.get_contiguous_parameters(trainable_only=True, copy=False).size == module.get_parameters_size()


def test_train_and_eval_programs_of_every_shape_share_one_arena(shared):
    """The largest plan's arena serves the later, smaller ones (a last partial batch, eval); sharing changes no
    result: the same steps on a module with its own arenas give the same losses."""
    d = shared / "ort_artifacts" / "digits"
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((32, 64)).astype(np.float32), rng.integers(0, 10, 32)
    losses = []
    for share in (True, False):
        module = Module(d / "training_model.onnx", CheckpointState.load_checkpoint(d / "checkpoint"),
                        d / "eval_model.onnx")
        opt = Optimizer(d / "optimizer_model.onnx", module)
        run = []
        for batch in (32, 8, 32):
            for training, n in ((True, batch), (False, batch // 2)):
                if not share:
                    module.training_program.arena = None       # a new shape gets an arena of its own
                module.train(training)
                run.append(float(module(x[:n], y[:n])))
                if training:
                    opt.step()
                    module.lazy_reset_grad()
        arenas = {id(p.arena) for _, p in module.programs()}
        assert len({id(p.plan) for _, p in module.programs()}) == 4 and len(arenas) == (1 if share else 4)
        losses.append(run)
    assert losses[0] == losses[1]


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "edgetrain-made mlp"])
def test_gradients_go_straight_into_the_state(shared, tmp_path, name):
    """Training programs write gradients into their accumulation buffers (no InPlaceAccumulatorV2 copy, no arena
    slot) where a kernel computes them; the gradients equal the literal graph's, with and without accumulation."""
    from edgetrain.plan import make_plan
    from edgetrain.runtime import Program

    art = shared / "ort_artifacts" / name
    if name.startswith("edgetrain-made"):        # its gradients reach the accumulators through Identity views
        name, art = "mlp", tmp_path
        ckpt = checkpoint.load(shared / "ort_artifacts" / "mlp" / "checkpoint")
        artifacts.generate_artifacts(str(shared / "models" / "mlp.onnx"), requires_grad=list(ckpt.trainable),
                                     loss=artifacts.LossType.CrossEntropyLoss, artifact_directory=art)
    module = Module(art / "training_model.onnx", CheckpointState.load_checkpoint(art / "checkpoint"))
    graph, rng = module.graph(), np.random.default_rng(1)
    feeds = {}
    for v in graph.inputs[:2]:
        shape = tuple(d if isinstance(d, int) else 8 for d in v.type.shape)
        high = 100 if name == "transformer" and v.name == "input" else (4 if name == "transformer" else 10)
        feeds[v.name] = (rng.integers(0, high, shape) if v.type.dtype == np.int64 else
                         rng.standard_normal(shape)).astype(v.type.dtype)
    x, y = (feeds[n] for n in module.input_names())
    module(x, y)
    module(x, y)                               # accumulates: the program overwrites, the module adds back
    (bound,) = module.training_program.bound_steps()
    plan = bound.program.plan
    largest = max(module.state_store.names, key=lambda p: module.state_store.grad(p).size)
    assert f"{largest}_grad.accumulation.buffer" in plan.direct_gradients
    if art == tmp_path:
        assert len(plan.direct_gradients) == len(module.state_store.names)
    left = sum(b.node.op_type == "InPlaceAccumulatorV2" for s in plan.steps for b in s.nodes)
    assert left == len(module.state_store.names) - len(plan.direct_gradients)

    store = module.state_store
    literal = {f"{p}_grad.accumulation.buffer": np.zeros_like(store.grad(p)) for p in store.names}
    external = module.training_program.external(True) | literal
    external["lazy_reset_grad"] = np.ones(1, bool)
    types = {v.name: TensorType(external[v.name].dtype, external[v.name].shape) if v.name in external else
             TensorType(feeds[v.name].dtype, feeds[v.name].shape) for v in graph.inputs}
    ref = make_plan(graph, types, [v.name for v in graph.outputs], external=external)
    assert ref.arena_bytes > plan.arena_bytes
    Program(ref, external).run([feeds[n] for n in ref.fed_inputs])
    for p in module.state_store.names:
        np.testing.assert_allclose(module.state_store.grad(p), 2 * literal[f"{p}_grad.accumulation.buffer"],
                                   rtol=1e-5, atol=1e-6, err_msg=p)


def test_batchnorm_statistics_kept_as_constants_train_and_stay(shared, tmp_path):
    """requires_grad names only weights and frozen_params nothing: the running statistics stay constants of
    the training model (as ORT leaves them), so training runs on batch statistics and never updates them."""
    import onnx
    proto = onnx.load(str(shared / "models" / "mobilenet.onnx"))
    stats = {n.input[i] for n in proto.graph.node if n.op_type == "BatchNormalization" for i in (3, 4)}
    weights = [i.name for i in proto.graph.initializer if i.data_type == onnx.TensorProto.FLOAT
               and i.name not in stats and len(i.dims) > 0]
    artifacts.generate_artifacts(proto, requires_grad=weights, loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path)
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    assert not stats & {n for n, _ in state.parameters}
    module = Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx")
    optimizer = Optimizer(tmp_path / "optimizer_model.onnx", module)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((16, 3, 32, 32)).astype(np.float32), np.arange(16) % 10
    losses = []
    for _ in range(3):
        losses.append(float(module(x, y)))
        optimizer.step()
        module.lazy_reset_grad()
    assert np.isfinite(losses).all() and losses[-1] < losses[0]
    written = {i.name: onnx.numpy_helper.to_array(i) for i in
               onnx.load(str(tmp_path / "training_model.onnx")).graph.initializer}
    original = {i.name: onnx.numpy_helper.to_array(i) for i in proto.graph.initializer}
    for s in stats:
        np.testing.assert_array_equal(written[s], original[s], err_msg=s)
