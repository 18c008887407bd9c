"""Estimators: fitted coefficients against scikit-learn's closed forms and solvers for the linear cases,
losses and learning-rate rules against torch, ``add_loss_output`` against the ONNX reference evaluator."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from edgetrain.errors import InputError
from edgetrain.estimators import (
    AbsoluteLearningLoss,
    ElasticLearningLoss,
    ElasticLearningPenalty,
    ForwardBackwardEstimator,
    GradientEstimator,
    LearningRateSGD,
    LearningRateSGDNesterov,
    NegLogLearningLoss,
    NoLearningPenalty,
    SquareLearningLoss,
    add_loss_output,
    get_train_initializer,
)

sklearn = pytest.importorskip("sklearn")
from sklearn.base import clone
from sklearn.linear_model import LinearRegression, LogisticRegression, Ridge


def linear_model(n_in: int, n_out: int = 1, seed: int = 0):
    rng = np.random.default_rng(seed)
    inits = {"W": (rng.standard_normal((n_in, n_out)) * 0.1).astype(np.float32), "b": np.zeros(n_out, np.float32)}
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["X", "W", "b"], ["y"])], "linear",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", n_out])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def regression_data(n=64, d=3, seed=0, noise=0.1):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    y = (X @ np.array([1.5, -2.0, 0.5][:d]) + 0.7 + noise * rng.standard_normal(n)).astype(np.float32)
    return X, y


def test_square_loss_full_batch_matches_linear_regression():
    X, y = regression_data()
    est = ForwardBackwardEstimator(linear_model(3), learning_rate=LearningRateSGD(0.5, "constant"),
                                   epochs=300, batch_size=len(X), shuffle=False).fit(X, y)
    ref = LinearRegression().fit(X, y)
    np.testing.assert_allclose(est.weights_["W"][:, 0], ref.coef_, atol=1e-4)
    np.testing.assert_allclose(est.weights_["b"][0], ref.intercept_, atol=1e-4)
    assert est.score(X, y) == pytest.approx(ref.score(X, y), abs=1e-5)
    assert est.train_losses_[-1] < est.train_losses_[0]


def test_l2_penalty_matches_ridge():
    """mean 1/2 (p - y)^2 + l2 ||W||^2 has Ridge's minimizer at alpha = 2 n l2 (the bias is not penalized)."""
    X, y = regression_data(seed=1)
    l2 = 0.05
    est = ForwardBackwardEstimator(linear_model(3), learning_rate=LearningRateSGD(0.5, "constant"),
                                   learning_penalty=ElasticLearningPenalty(l1=0.0, l2=l2), epochs=300,
                                   batch_size=len(X), shuffle=False).fit(X, y)
    ref = Ridge(alpha=2 * len(X) * l2).fit(X, y)
    np.testing.assert_allclose(est.weights_["W"][:, 0], ref.coef_, atol=1e-4)
    np.testing.assert_allclose(est.weights_["b"][0], ref.intercept_, atol=1e-4)


def test_nesterov_minibatch_converges_to_linear_regression():
    X, y = regression_data(n=96, seed=2, noise=0.0)
    est = ForwardBackwardEstimator(linear_model(3), learning_rate=LearningRateSGDNesterov(0.05, momentum=0.9),
                                   epochs=60, batch_size=16, random_state=0).fit(X, y)
    ref = LinearRegression().fit(X, y)
    np.testing.assert_allclose(est.weights_["W"][:, 0], ref.coef_, atol=1e-3)


def test_neglog_binary_matches_unpenalized_logistic_regression():
    rng = np.random.default_rng(3)
    X = rng.standard_normal((80, 2)).astype(np.float32)
    y = (X @ [1.0, -1.0] + 0.3 + rng.standard_normal(80) > 0).astype(np.int64)     # not separable
    est = ForwardBackwardEstimator(linear_model(2), loss=NegLogLearningLoss(),
                                   learning_rate=LearningRateSGD(1.0, "constant"), epochs=1500,
                                   batch_size=len(X), shuffle=False).fit(X, y)
    ref = LogisticRegression(C=np.inf, tol=1e-10, max_iter=10000).fit(X, y)
    np.testing.assert_allclose(est.weights_["W"][:, 0], ref.coef_[0], atol=2e-3)
    np.testing.assert_allclose(est.predict_proba(X), ref.predict_proba(X), atol=1e-3)
    assert est.score(X, y) == pytest.approx(ref.score(X, y))


def test_gradient_estimator_loss_in_graph_matches_linear_regression():
    X, y = regression_data(seed=4)
    est = GradientEstimator(linear_model(3), learning_rate=0.3, epochs=300, batch_size=len(X),
                            shuffle=False).fit(X, y)
    ref = LinearRegression().fit(X, y)
    np.testing.assert_allclose(est.weights_["W"][:, 0], ref.coef_, atol=1e-4)
    np.testing.assert_allclose(est.weights_["b"][0], ref.intercept_, atol=1e-4)
    assert est.score(X, y) == pytest.approx(ref.score(X, y), abs=1e-5)


def test_gradient_estimator_classifies():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((90, 2)).astype(np.float32)
    labels = np.array(["a", "b", "c"])
    y = labels[np.argmax(X @ np.array([[2, -1, 0], [0, 1, -2]]), axis=1)]
    est = GradientEstimator(linear_model(2, 3), loss="log", optimizer="adamw", learning_rate=0.05, epochs=40,
                            batch_size=16, random_state=0).fit(X, y)
    assert set(est.predict(X)) <= set(labels) and est.score(X, y) > 0.9
    assert est.train_losses_[-1] < est.train_losses_[0]


@pytest.mark.parametrize("loss, torch_loss", [
    (SquareLearningLoss(), lambda p, y: 0.5 * ((p - y) ** 2).sum() / len(p)),
    (AbsoluteLearningLoss(), lambda p, y: (p - y).abs().sum() / len(p)),
    (ElasticLearningLoss(0.3, 0.7),
     lambda p, y: (0.3 * (p - y).abs().sum() + 0.35 * ((p - y) ** 2).sum()) / len(p)),
])
def test_regression_losses_match_torch(loss, torch_loss):
    rng = np.random.default_rng(6)
    p, y = rng.standard_normal((5, 2)), rng.standard_normal((5, 2))
    value, grad = loss.loss_gradient(y, p)
    pt = torch.tensor(p, requires_grad=True)
    want = torch_loss(pt, torch.tensor(y))
    want.backward()
    assert value == pytest.approx(want.item())
    np.testing.assert_allclose(grad, pt.grad.numpy(), rtol=1e-12)


@pytest.mark.parametrize("columns", [1, 4])
def test_neglog_loss_matches_torch(columns):
    rng = np.random.default_rng(7)
    p = rng.standard_normal((6, columns))
    labels = rng.integers(0, max(2, columns), 6)
    value, grad = NegLogLearningLoss().loss_gradient(labels, p)
    pt = torch.tensor(p, requires_grad=True)
    if columns == 1:
        want = torch.nn.functional.binary_cross_entropy_with_logits(pt[:, 0], torch.tensor(labels, dtype=pt.dtype))
    else:
        want = torch.nn.functional.cross_entropy(pt, torch.tensor(labels))
    want.backward()
    assert value == pytest.approx(want.item())
    np.testing.assert_allclose(grad, pt.grad.numpy(), rtol=1e-10, atol=1e-12)


def _torch_sgd(w, grads, lr, momentum=0.0, nesterov=False):
    """torch.optim.SGD's documented update (b = m b + g; w -= lr (g + m b) with Nesterov, lr b without), in
    its parameterization, not scikit-learn's: torch.optim itself costs seconds to import."""
    b = None
    for g in grads:
        b = g.copy() if b is None else momentum * b + g
        step = g + momentum * b if nesterov else (b if momentum else g)
        w = w - lr * step
    return w


def test_learning_rates_match_torch_sgd():
    rng = np.random.default_rng(8)
    w0, grads = rng.standard_normal(4), [rng.standard_normal(4) for _ in range(5)]
    for rule, opt in [(LearningRateSGDNesterov(0.1, momentum=0.9), {"momentum": 0.9, "nesterov": True}),
                      (LearningRateSGDNesterov(0.1, momentum=0.5, nesterov=False), {"momentum": 0.5}),
                      (LearningRateSGD(0.1, "constant"), {})]:
        rule.init_learning_rate()
        w = w0.copy()
        for t, g in enumerate(grads, start=1):
            rule.update_learning_rate(t)
            rule.update_weights("w", w, g)
        np.testing.assert_allclose(w, _torch_sgd(w0, grads, 0.1, **opt), rtol=1e-12)
    inv = LearningRateSGD(0.1, "invscaling", power_t=0.5).init_learning_rate()
    assert inv.update_learning_rate(4).value == pytest.approx(0.05)
    with pytest.raises(InputError, match="'cosine'"):
        LearningRateSGD(learning_rate="cosine").init_learning_rate()


def test_penalties():
    w = {"W": np.array([[1.0, -2.0]]), "b": np.array([3.0])}
    pen = ElasticLearningPenalty(l1=0.1, l2=0.2)
    assert pen.penalty_loss(w) == pytest.approx(0.1 * 3 + 0.2 * 5)
    np.testing.assert_allclose(pen.gradient("W", w["W"]), [[0.1 + 0.4, -0.1 - 0.8]])
    assert pen.gradient("b", w["b"]) is None
    assert NoLearningPenalty().penalty_loss(w) == 0 and NoLearningPenalty().gradient("W", w["W"]) is None


def test_params_and_sklearn_clone():
    est = ForwardBackwardEstimator(linear_model(3), learning_rate=LearningRateSGD(0.2), epochs=3)
    params = est.get_params()
    assert params["epochs"] == 3 and params["learning_rate__eta0"] == 0.2
    est.set_params(epochs=5, learning_rate__eta0=0.3)
    assert est.epochs == 5 and est.learning_rate.eta0 == 0.3
    other = clone(est)
    assert other.get_params(deep=False)["epochs"] == 5 and other.learning_rate is not est.learning_rate
    with pytest.raises(InputError, match="no parameter 'lr'"):
        est.set_params(lr=1)
    assert "GradientEstimator(" in repr(GradientEstimator(linear_model(3)))


def test_fit_refusals():
    X, y = regression_data()
    with pytest.raises(InputError, match="64 samples but y has 10"):
        ForwardBackwardEstimator(linear_model(3)).fit(X, y[:10])
    with pytest.raises(InputError, match="'X' has shape"):
        ForwardBackwardEstimator(linear_model(4)).fit(X, y)
    with pytest.raises(InputError, match="loss must be one of"):
        GradientEstimator(linear_model(3), loss="hinge").fit(X, y)


@pytest.mark.parametrize("score_name", ["squared_error", "absolute_error", "elastic"])
def test_add_loss_output_regression(score_name):
    rng = np.random.default_rng(9)
    m = add_loss_output(linear_model(3, 2), score_name=score_name, penalty={"W": {"l1": 0.1, "l2": 0.2}})
    X = rng.standard_normal((5, 3)).astype(np.float32)
    label = rng.standard_normal((5, 2)).astype(np.float32)
    y, loss = ReferenceEvaluator(m).run(None, {"X": X, "label": label})
    W = get_train_initializer(m)["W"]
    d = y - label
    want = {"squared_error": (d ** 2).sum(), "absolute_error": np.abs(d).sum(),
            "elastic": 0.5 * np.abs(d).sum() + 0.5 * (d ** 2).sum()}[score_name]
    want += 0.1 * np.abs(W).sum() + 0.2 * (W ** 2).sum()
    assert loss.shape == (1, 1) and loss[0, 0] == pytest.approx(want, rel=1e-5)


def test_add_loss_output_log():
    rng = np.random.default_rng(10)
    graph = helper.make_graph([helper.make_node("Softmax", ["X"], ["p"], axis=1)], "s",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 3])])
    m = add_loss_output(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
                        score_name="log")
    X = rng.standard_normal((4, 3)).astype(np.float32)
    labels = np.array([0, 2, 1, 2])
    _, loss = ReferenceEvaluator(m).run(None, {"X": X, "label": labels})
    want = torch.nn.functional.cross_entropy(torch.tensor(X), torch.tensor(labels), reduction="sum")
    assert loss[0, 0] == pytest.approx(want.item(), rel=1e-5)
    with pytest.raises(InputError, match="'p'"):
        add_loss_output(m, label_name="p")
