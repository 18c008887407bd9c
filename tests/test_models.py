"""Every bench model and every ORT-generated eval model runs forward and matches onnxruntime."""
import numpy as np
import pytest
from conftest import BENCH_MODELS, random_feed
from oracle import run_onnxruntime

import edgetrain

pytestmark = pytest.mark.arm64   # also on the emulated arm64 stage (.ci/run, README "Platforms")

EVAL_MODELS = ["cnn", "digits", "mlp", "mlp_sgd", "mobilenet", "transformer"]


def _compare(path, rng, rtol=1e-4, atol=1e-5):
    import onnx
    sess = edgetrain.InferenceSession(str(path))
    feeds = {i.name: random_feed(i, rng) for i in sess.get_inputs()}
    if "labels" in feeds:
        feeds = {k: (v * 0.1 if v.dtype == np.float32 and k != "input" else v) for k, v in feeds.items()}
    ours = sess.run(None, feeds)
    ref = run_onnxruntime(onnx.load(str(path)), feeds)
    for a, b in zip(ours, ref):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)
    return sess, feeds, ours


@pytest.mark.parametrize("name", BENCH_MODELS)
def test_bench_model_matches_onnxruntime(shared, name):
    sess, feeds, ours = _compare(shared / "models" / f"{name}.onnx", np.random.default_rng(1))
    again = sess.run(None, feeds)            # a second run through the same arena gives the same answer
    np.testing.assert_array_equal(again[0], ours[0])


@pytest.mark.parametrize("name", EVAL_MODELS)
def test_ort_eval_model_matches_onnxruntime(shared, name):
    _compare(shared / "ort_artifacts" / name / "eval_model.onnx", np.random.default_rng(2))


def test_dynamic_batch_gets_its_own_plan(shared):
    sess = edgetrain.InferenceSession(str(shared / "models" / "digits.onnx"))
    rng = np.random.default_rng(3)
    for n in (32, 5, 32, 1):
        x = rng.standard_normal((n, 64)).astype(np.float32)
        (y,) = sess.run(None, {"input": x})
        assert y.shape == (n, 10)
        import onnx
        np.testing.assert_allclose(y, run_onnxruntime(onnx.load(str(shared / "models" / "digits.onnx")),
                                                      {"input": x})[0], rtol=1e-5, atol=1e-6)
    assert len(sess._programs) == 3
