"""Files ONNX Runtime 1.19.2 wrote (tests/golden/ort119, made by tools/make_ort_golden.py), read and trained on
by edgetrain on every Python: ORT's checkpoints (with optimizer state and properties), ORT's artifacts and the
losses and parameters ORT reported while training them. The live cross-checks with ORT itself stay in
test_checkpoint.py and test_api.py (marked ort119)."""
import json
from pathlib import Path

import numpy as np
import pytest

from edgetrain import checkpoint as C
from edgetrain.api import CheckpointState, Module, Optimizer

pytestmark = pytest.mark.arm64   # small: also on the emulated arm64 stage

GOLDEN = Path(__file__).parent / "golden" / "ort119"
TRAINABLE = ["fc1.bias", "fc1.weight", "fc2.bias", "fc2.weight"]      # sorted, as ORT saves a state
MODEL_ORDER = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]    # as generate_artifacts writes them


@pytest.fixture(scope="module")
def ort():
    """What ORT reported while it trained (tools/make_ort_golden.py)."""
    with np.load(GOLDEN / "trajectory.npz") as npz:
        return {k: npz[k] for k in npz.files}


def _bitwise(a: np.ndarray, b: np.ndarray, what: str):
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), what


def test_orts_checkpoints_read_as_ort_reported_them(ort):
    for name, tag, order in (("checkpoint", "initial", MODEL_ORDER), ("checkpoint_trained", "trained", TRAINABLE)):
        c = C.load(GOLDEN / name)
        assert list(c.trainable) == order and list(c.frozen) == ["scale"] and not c.is_nominal, name
        for n, value in c.parameters.items():
            _bitwise(np.asarray(value), ort[f"{tag}:{n}"], f"{name}: {n}")
    plain, trained = C.load(GOLDEN / "checkpoint"), C.load(GOLDEN / "checkpoint_trained")
    assert plain.optimizer_groups == [] and plain.properties == {}
    f32 = lambda v: float(np.float32(v))     # noqa: E731  (float properties are float32 in the file)
    want = json.loads((GOLDEN / "properties.json").read_text())
    assert trained.properties == {k: f32(v) if isinstance(v, float) else v for k, v in want.items()}
    (group,) = trained.optimizer_groups
    assert (group.name, group.step, group.initial_learning_rate) == ("group0", 4, f32(1e-3))
    assert list(group.states) == TRAINABLE
    for p, moments in group.states.items():
        assert list(moments) == list(C.MOMENTUM_NAMES)
        for m in moments.values():
            assert m.dtype == np.float32 and m.shape == trained.trainable[p].shape
        assert np.abs(moments["momentum0"]).sum() > 0 and (moments["momentum1"] > 0).any()


def test_rewritten_orts_checkpoints_keep_every_field(tmp_path):
    for name in ("checkpoint", "checkpoint_trained"):
        original = (GOLDEN / name).read_bytes()
        ours = C.dumps(C.loads(original))
        if name == "checkpoint":
            assert ours == original       # parameters only: the same builder calls as ORT, the same bytes
        a, b = C.loads(original), C.loads(ours)
        assert (a.properties, a.is_nominal) == (b.properties, b.is_nominal)
        for x, y in ((a.trainable, b.trainable), (a.frozen, b.frozen)):
            assert list(x) == list(y) and all(x[n].tobytes() == y[n].tobytes() for n in x)
        for g, h in zip(a.optimizer_groups, b.optimizer_groups, strict=True):
            assert (g.name, g.step, g.initial_learning_rate) == (h.name, h.step, h.initial_learning_rate)
            assert {(p, k, v.tobytes()) for p, s in g.states.items() for k, v in s.items()} == {
                (p, k, v.tobytes()) for p, s in h.states.items() for k, v in s.items()}


def _session(checkpoint, lr):
    state = CheckpointState.load_checkpoint(checkpoint)
    module = Module(GOLDEN / "training_model.onnx", state, GOLDEN / "eval_model.onnx")
    opt = Optimizer(GOLDEN / "optimizer_model.onnx", module)
    opt.set_learning_rate(lr)
    return state, module, opt


def _train(module, opt, ort, steps):
    losses = []
    for k in steps:
        losses.append(float(module(ort[f"x{k}"], ort[f"y{k}"])))
        opt.step()
        module.lazy_reset_grad()
    return losses


def test_orts_artifacts_train_along_orts_trajectory(tmp_path, ort):
    """ORT's training, eval and optimizer models from ORT's checkpoint: 4 AdamW steps give ORT's losses, eval loss
    and parameters; saved with optimizer state and resumed in a new session, 2 more steps give ORT's, which it
    computed resuming from its own file (so the moments and the step count survive both formats)."""
    lr = float(ort["lr"])
    state, module, opt = _session(GOLDEN / "checkpoint", lr)
    losses = _train(module, opt, ort, range(4))
    np.testing.assert_allclose(losses, ort["losses"][:4], rtol=1e-5)
    module.eval()
    np.testing.assert_allclose(module(ort["x0"], ort["y0"]), ort["eval_loss"], rtol=1e-5)
    for n, p in state.parameters:
        np.testing.assert_allclose(p.data, ort[f"trained:{n}"], rtol=1e-5, atol=1e-6, err_msg=n)
    CheckpointState.save_checkpoint(state, tmp_path / "ours", include_optimizer_state=True)
    for source in (tmp_path / "ours", GOLDEN / "checkpoint_trained"):
        state, module, opt = _session(source, lr)
        losses = _train(module, opt, ort, range(4, 6))
        np.testing.assert_allclose(losses, ort["losses"][4:], rtol=1e-5, err_msg=source.name)
        for n, p in state.parameters:
            np.testing.assert_allclose(p.data, ort[f"resumed:{n}"], rtol=1e-5, atol=1e-6, err_msg=f"{source.name}: {n}")
