"""Estimators in the scikit-learn style that train an ONNX graph on plain arrays, the two ways onnxcustom does.

- ``GradientEstimator``: the loss is in the graph (the first API): training artifacts are made with
  ``edgetrain.artifacts`` and trained with ``edgetrain.api``'s ``Module`` and ``Optimizer``, one call a step.
- ``ForwardBackwardEstimator``: the graph is a layer (the second API, ``ForwardBackward``); the loss, the
  learning-rate rule and the penalty are pluggable objects applied outside it: ``SquareLearningLoss``,
  ``AbsoluteLearningLoss``, ``ElasticLearningLoss``, ``NegLogLearningLoss``; ``LearningRateSGD`` (constant or
  inverse-scaling schedule), ``LearningRateSGDNesterov``; ``NoLearningPenalty``, ``ElasticLearningPenalty``.

Both have ``fit``, ``predict``, ``score`` (R^2, or accuracy for a classification loss), ``get_params`` and
``set_params``, so scikit-learn's ``clone``, grid search and pipelines take them; scikit-learn itself is never
imported. ``add_loss_output`` and ``get_train_initializer`` are onnxcustom's helpers.
"""
from __future__ import annotations

import copy
import inspect
import os
import tempfile

import numpy as np

from .errors import EdgetrainError, InputError
from .forward_backward import ForwardBackward, get_train_initializer

__all__ = ["AbsoluteLearningLoss", "ElasticLearningLoss", "ElasticLearningPenalty", "ForwardBackwardEstimator",
           "GradientEstimator", "LearningRateSGD", "LearningRateSGDNesterov", "NegLogLearningLoss",
           "NoLearningPenalty", "SquareLearningLoss", "add_loss_output", "get_train_initializer"]


class _Params:
    """get_params / set_params / repr from the constructor's signature, as scikit-learn's BaseEstimator."""

    @classmethod
    def _param_names(cls) -> list[str]:
        return [p for p in inspect.signature(cls.__init__).parameters if p != "self"]

    def get_params(self, deep: bool = True) -> dict:
        params = {}
        for name in self._param_names():
            value = getattr(self, name)
            params[name] = value
            if deep and hasattr(value, "get_params") and not isinstance(value, type):
                params.update({f"{name}__{k}": v for k, v in value.get_params().items()})
        return params

    def set_params(self, **params):
        nested: dict[str, dict] = {}
        for key, value in params.items():
            name, _, sub = key.partition("__")
            if name not in self._param_names():
                raise InputError(f"{type(self).__name__} has no parameter '{name}'; parameters: "
                                 f"{self._param_names()}")
            if sub:
                nested.setdefault(name, {})[sub] = value
            else:
                setattr(self, name, value)
        for name, sub in nested.items():
            getattr(self, name).set_params(**sub)
        return self

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params(deep=False).items()
                         if not isinstance(v, (bytes, np.ndarray)) and type(v).__name__ != "ModelProto")
        return f"{type(self).__name__}({args})"


# -- losses: (expected, predicted) -> (loss, d loss / d predicted), averaged over the batch -------------------
class SquareLearningLoss(_Params):
    """loss = mean over samples of 1/2 ||predicted - expected||^2 (scikit-learn's squared error)."""

    classifier = False

    def loss_gradient(self, expected: np.ndarray, predicted: np.ndarray) -> tuple[float, np.ndarray]:
        diff = predicted - expected.reshape(predicted.shape)
        n = max(1, predicted.shape[0])
        return float(0.5 * np.sum(diff * diff) / n), (diff / n).astype(predicted.dtype)


class AbsoluteLearningLoss(_Params):
    """loss = mean over samples of ||predicted - expected||_1 (sign(0) = 0 as the subgradient)."""

    classifier = False

    def loss_gradient(self, expected, predicted):
        diff = predicted - expected.reshape(predicted.shape)
        n = max(1, predicted.shape[0])
        return float(np.sum(np.abs(diff)) / n), (np.sign(diff) / n).astype(predicted.dtype)


class ElasticLearningLoss(_Params):
    """loss = l1_weight * absolute loss + l2_weight * square loss."""

    classifier = False

    def __init__(self, l1_weight: float = 0.5, l2_weight: float = 0.5):
        self.l1_weight, self.l2_weight = l1_weight, l2_weight

    def loss_gradient(self, expected, predicted):
        l1, g1 = AbsoluteLearningLoss().loss_gradient(expected, predicted)
        l2, g2 = SquareLearningLoss().loss_gradient(expected, predicted)
        return self.l1_weight * l1 + self.l2_weight * l2, (self.l1_weight * g1 + self.l2_weight * g2).astype(
            predicted.dtype)


class NegLogLearningLoss(_Params):
    """Negative log-likelihood of the expected classes given the predicted scores (logits): a sigmoid for one
    column (binary, expected in {0, 1}), a softmax otherwise (expected class indices); mean over samples.
    ``eps`` keeps the logarithm finite."""

    classifier = True

    def __init__(self, eps: float = 1e-7):
        self.eps = eps

    def probabilities(self, predicted: np.ndarray) -> np.ndarray:
        if predicted.shape[-1] == 1:
            p = 1.0 / (1.0 + np.exp(-predicted))
            return np.concatenate([1 - p, p], axis=-1)
        z = np.exp(predicted - predicted.max(axis=-1, keepdims=True))
        return z / z.sum(axis=-1, keepdims=True)

    def loss_gradient(self, expected, predicted):
        labels = np.asarray(expected).reshape(-1).astype(np.int64)
        n = max(1, predicted.shape[0])
        prob = self.probabilities(predicted)
        if labels.size and (labels.min() < 0 or labels.max() >= prob.shape[-1]):
            raise InputError(f"class labels must be in [0, {prob.shape[-1]}), got {labels.min()}..{labels.max()}")
        loss = -np.sum(np.log(np.clip(prob[np.arange(labels.size), labels], self.eps, 1.0))) / n
        if predicted.shape[-1] == 1:
            grad = (prob[:, 1:] - labels[:, None]) / n
        else:
            grad = prob.copy()
            grad[np.arange(labels.size), labels] -= 1
            grad /= n
        return float(loss), grad.astype(predicted.dtype)


# -- learning rates: the update of one weight from its gradient --------------------------------------------------
class LearningRateSGD(_Params):
    """w <- w - eta * g, with scikit-learn's schedules: ``constant`` eta = eta0, ``invscaling``
    eta = eta0 / t^power_t (t: the update count, from 1)."""

    SCHEDULES = ("constant", "invscaling")

    def __init__(self, eta0: float = 0.01, learning_rate: str = "invscaling", power_t: float = 0.25):
        self.eta0, self.learning_rate, self.power_t = eta0, learning_rate, power_t

    def init_learning_rate(self):
        if self.learning_rate not in self.SCHEDULES:
            raise InputError(f"learning_rate schedule '{self.learning_rate}' is not one of {self.SCHEDULES}")
        self.value = self.eta0
        self.t = 0
        return self

    def update_learning_rate(self, t: int):
        """Called before update ``t`` (from 1)."""
        self.t = t
        self.value = self.eta0 if self.learning_rate == "constant" else self.eta0 / t ** self.power_t
        return self

    def update_weights(self, name: str, weight: np.ndarray, gradient: np.ndarray) -> None:
        weight -= (self.value * gradient).astype(weight.dtype)


class LearningRateSGDNesterov(LearningRateSGD):
    """SGD with momentum, Nesterov's form by default (scikit-learn's MLP optimizer):
    v <- momentum v - eta g; w <- w + momentum v - eta g (``nesterov=False``: w <- w + v)."""

    def __init__(self, eta0: float = 0.01, learning_rate: str = "constant", power_t: float = 0.25,
                 momentum: float = 0.9, nesterov: bool = True):
        super().__init__(eta0, learning_rate, power_t)
        self.momentum, self.nesterov = momentum, nesterov

    def init_learning_rate(self):
        super().init_learning_rate()
        self.velocities: dict[str, np.ndarray] = {}
        return self

    def update_weights(self, name, weight, gradient):
        v = self.velocities.setdefault(name, np.zeros_like(weight))
        v *= self.momentum
        v -= self.value * gradient
        if self.nesterov:
            weight += (self.momentum * v - self.value * gradient).astype(weight.dtype)
        else:
            weight += v


# -- penalties: a loss term on the weights and its gradient ------------------------------------------------------
class NoLearningPenalty(_Params):
    def penalty_loss(self, weights: dict[str, np.ndarray]) -> float:
        return 0.0

    def gradient(self, name: str, weight: np.ndarray) -> np.ndarray | None:
        return None


class ElasticLearningPenalty(_Params):
    """l1 * sum |w| + l2 * sum w^2 over the penalized weights (gradient l1 sign(w) + 2 l2 w): L1 with l2=0,
    L2 with l1=0, elastic net with both. ``exclude_bias``: one-dimensional weights (biases) are not
    penalized, as scikit-learn leaves the intercept alone."""

    def __init__(self, l1: float = 0.5, l2: float = 0.5, exclude_bias: bool = True):
        self.l1, self.l2, self.exclude_bias = l1, l2, exclude_bias

    def _penalized(self, weight: np.ndarray) -> bool:
        return not (self.exclude_bias and weight.ndim <= 1)

    def penalty_loss(self, weights):
        return float(sum(self.l1 * np.abs(w).sum() + self.l2 * (w * w).sum()
                         for w in weights.values() if self._penalized(w)))

    def gradient(self, name, weight):
        if not self._penalized(weight):
            return None
        return (self.l1 * np.sign(weight) + 2 * self.l2 * weight).astype(weight.dtype)


# -- shared by both estimators -----------------------------------------------------------------------------------
def _r2(y: np.ndarray, p: np.ndarray) -> float:
    y, p = y.reshape(p.shape).astype(np.float64), p.astype(np.float64)
    ss_res = ((y - p) ** 2).sum(axis=0)
    ss_tot = ((y - y.mean(axis=0)) ** 2).sum(axis=0)
    return float(np.mean(np.where(ss_tot > 0, 1 - ss_res / np.where(ss_tot > 0, ss_tot, 1), 0.0)))


def _copy_or(value, default):
    """A fresh copy of a user-given rule (fit never changes the estimator's parameters), or the default."""
    return copy.deepcopy(value) if value is not None else default()


def _batches(n: int, batch_size: int, rng: np.random.Generator | None):
    order = rng.permutation(n) if rng is not None else np.arange(n)
    for start in range(0, n, batch_size):
        yield order[start:start + batch_size]


def _check_fit_args(X, y, epochs, batch_size) -> tuple[np.ndarray, np.ndarray]:
    X, y = np.asarray(X), np.asarray(y)
    if X.shape[0] != y.shape[0]:
        raise InputError(f"X has {X.shape[0]} samples but y has {y.shape[0]}")
    if X.shape[0] == 0:
        raise InputError("fit needs at least one sample")
    if not (isinstance(epochs, int) and epochs >= 1) or not (isinstance(batch_size, int) and batch_size >= 1):
        raise InputError(f"epochs and batch_size must be integers >= 1, got {epochs!r}, {batch_size!r}")
    return X, y


class ForwardBackwardEstimator(_Params):
    """Train an ONNX graph with forward/backward calls; loss, learning rate and penalty applied in numpy.

    Parameters
    ----------
    model : path, bytes or ModelProto
        Forward-only model, one input (the features) and its first output the prediction (scores for a
        classification loss).
    loss, learning_rate, learning_penalty : objects of this module
        Default ``SquareLearningLoss()``, ``LearningRateSGD()``, ``NoLearningPenalty()``; copied by ``fit``.
    weights : list of str, optional
        Initializers to train (default as ``ForwardBackward``).
    epochs, batch_size, shuffle, random_state
        The loop: ``epochs`` passes over the data in batches, reshuffled each epoch when ``shuffle``.

    After ``fit``: ``weights_`` (name -> trained array), ``train_losses_`` (mean loss per epoch, penalty
    included), ``classes_`` for a classification loss, ``fb_`` (the ForwardBackward).
    """

    def __init__(self, model, loss=None, learning_rate=None, learning_penalty=None, weights=None, epochs: int = 10,
                 batch_size: int = 32, shuffle: bool = True, random_state=None):
        self.model, self.loss, self.learning_rate = model, loss, learning_rate
        self.learning_penalty = learning_penalty
        self.weights, self.epochs, self.batch_size = weights, epochs, batch_size
        self.shuffle, self.random_state = shuffle, random_state

    def _dtype(self, X):
        x = self.fb_.graph.inputs[0]
        return np.ascontiguousarray(X, dtype=x.type.dtype)

    def fit(self, X, y):
        X, y = _check_fit_args(X, y, self.epochs, self.batch_size)
        self.loss_ = _copy_or(self.loss, SquareLearningLoss)
        self.learning_rate_ = _copy_or(self.learning_rate, LearningRateSGD)
        self.penalty_ = _copy_or(self.learning_penalty, NoLearningPenalty)
        self.fb_ = ForwardBackward(self.model, weights=self.weights)
        if len(self.fb_.input_names) != 1:
            raise InputError(f"the model takes inputs {self.fb_.input_names}; the estimator feeds one (X)")
        X = self._dtype(X)
        if self.loss_.classifier:
            self.classes_, y = np.unique(y, return_inverse=True)
        else:
            y = np.asarray(y, dtype=X.dtype)
        rng = np.random.default_rng(self.random_state) if self.shuffle else None
        self.learning_rate_.init_learning_rate()
        weights = self.fb_.weights
        self.train_losses_, t = [], 0
        for _ in range(self.epochs):
            total = 0.0
            for idx in _batches(len(X), self.batch_size, rng):
                t += 1
                outs, ctx = self.fb_.forward([X[idx]])
                loss, grad = self.loss_.loss_gradient(y[idx], outs[0])
                grad_outputs = [grad] + [None] * (len(outs) - 1)
                grads = self.fb_.backward(ctx, grad_outputs)
                self.learning_rate_.update_learning_rate(t)
                for name, w in weights.items():
                    g = grads[name]
                    extra = self.penalty_.gradient(name, w)
                    self.learning_rate_.update_weights(name, w, g if extra is None else g + extra)
                total += (loss + self.penalty_.penalty_loss(weights)) * len(idx)
            if not np.isfinite(total):
                raise EdgetrainError(f"the training loss is {total} (not finite) after "
                                     f"{len(self.train_losses_) + 1} epoch(s): lower the learning rate")
            self.train_losses_.append(total / len(X))
        self.weights_ = {n: w.copy() for n, w in weights.items()}
        self.n_iter_ = t
        return self

    def decision_function(self, X) -> np.ndarray:
        if not hasattr(self, "fb_"):
            raise EdgetrainError(f"this {type(self).__name__} is not fitted yet: call fit(X, y) first")
        return self.fb_.forward([self._dtype(X)], training=False)[0][0]

    def predict_proba(self, X) -> np.ndarray:
        if not self.loss_.classifier:
            raise EdgetrainError("predict_proba needs a classification loss (NegLogLearningLoss)")
        return self.loss_.probabilities(self.decision_function(X))

    def predict(self, X) -> np.ndarray:
        scores = self.decision_function(X)
        if self.loss_.classifier:
            return self.classes_[self.predict_proba(X).argmax(axis=-1)]
        return scores[:, 0] if scores.ndim == 2 and scores.shape[1] == 1 else scores

    def score(self, X, y) -> float:
        """Accuracy for a classification loss, else the coefficient of determination R^2."""
        p = self.predict(X)
        if self.loss_.classifier:
            return float(np.mean(p == np.asarray(y)))
        return _r2(np.asarray(y), p)


_LOSS_TYPES = {"squared_error": "MSELoss", "absolute_error": "L1Loss", "log": "CrossEntropyLoss"}
_OPTIM_TYPES = {"sgd": "SGD", "adamw": "AdamW"}


class GradientEstimator(_Params):
    """Train an ONNX graph with its loss in the graph: ``edgetrain.artifacts`` adds the loss (``loss``:
    ``squared_error`` = mean squared error, ``absolute_error``, ``log`` = softmax cross-entropy) and the optimizer
    (``sgd`` or ``adamw``), and ``edgetrain.api`` runs one training step per batch, then one optimizer step.

    The model takes one input (the features) and its first output is the prediction (the loss's input).
    After ``fit``: ``weights_``, ``train_losses_`` (mean loss per epoch), ``classes_`` for ``log``.
    """

    def __init__(self, model, loss: str = "squared_error", optimizer: str = "sgd", learning_rate: float = 0.01,
                 weights=None, epochs: int = 10, batch_size: int = 32, shuffle: bool = True, random_state=None):
        self.model, self.loss, self.optimizer, self.learning_rate = model, loss, optimizer, learning_rate
        self.weights, self.epochs, self.batch_size = weights, epochs, batch_size
        self.shuffle, self.random_state = shuffle, random_state

    def fit(self, X, y):
        from . import artifacts
        from .api import CheckpointState, Module, Optimizer
        from .onnx_io import load_model

        X, y = _check_fit_args(X, y, self.epochs, self.batch_size)
        if self.loss not in _LOSS_TYPES or self.optimizer not in _OPTIM_TYPES:
            raise InputError(f"loss must be one of {sorted(_LOSS_TYPES)} and optimizer one of "
                             f"{sorted(_OPTIM_TYPES)}, got {self.loss!r}, {self.optimizer!r}")
        proto = load_model(self.model)
        fb = ForwardBackward(proto, weights=self.weights)        # the weights, and the inference program
        names = [v.name for v in fb.graph.outputs]
        X = np.ascontiguousarray(X, dtype=fb.graph.inputs[0].type.dtype)
        if self.loss == "log":
            self.classes_, y = np.unique(y, return_inverse=True)
            y = y.astype(np.int64)
        else:
            y = np.asarray(y, dtype=X.dtype)
        with tempfile.TemporaryDirectory(prefix="edgetrain-estimator-") as folder:
            artifacts.generate_artifacts(
                proto, requires_grad=fb.weight_names, loss=getattr(artifacts.LossType, _LOSS_TYPES[self.loss]),
                optimizer=getattr(artifacts.OptimType, _OPTIM_TYPES[self.optimizer]), artifact_directory=folder,
                loss_input_names=names[:1])
            state = CheckpointState.load_checkpoint(os.path.join(folder, "checkpoint"))
            module = Module(os.path.join(folder, "training_model.onnx"), state)
            optimizer = Optimizer(os.path.join(folder, "optimizer_model.onnx"), module)
        optimizer.set_learning_rate(self.learning_rate)
        target_shape = None
        rng = np.random.default_rng(self.random_state) if self.shuffle else None
        module.train()
        self.train_losses_ = []
        for _ in range(self.epochs):
            total = 0.0
            for idx in _batches(len(X), self.batch_size, rng):
                xb, yb = X[idx], y[idx]
                if self.loss != "log" and yb.ndim == 1:
                    if target_shape is None:
                        target_shape = fb.forward([xb[:1]], training=False)[0][0].shape[1:]
                    yb = yb.reshape((len(idx),) + target_shape)
                loss = module(xb, np.ascontiguousarray(yb))
                optimizer.step()
                module.lazy_reset_grad()
                total += float(np.asarray(loss).reshape(-1)[0]) * len(idx)
            self.train_losses_.append(total / len(X))
        self.weights_ = {n: np.array(state.parameters[n].data) for n in fb.weight_names}
        for n, w in self.weights_.items():
            np.copyto(fb.weights[n], w)
        self.fb_ = fb
        return self

    def decision_function(self, X) -> np.ndarray:
        if not hasattr(self, "fb_"):
            raise EdgetrainError(f"this {type(self).__name__} is not fitted yet: call fit(X, y) first")
        x = self.fb_.graph.inputs[0]
        return self.fb_.forward([np.ascontiguousarray(X, dtype=x.type.dtype)], training=False)[0][0]

    def predict(self, X) -> np.ndarray:
        scores = self.decision_function(X)
        if self.loss == "log":
            return self.classes_[scores.argmax(axis=-1)]
        return scores[:, 0] if scores.ndim == 2 and scores.shape[1] == 1 else scores

    def score(self, X, y) -> float:
        p = self.predict(X)
        if self.loss == "log":
            return float(np.mean(p == np.asarray(y)))
        return _r2(np.asarray(y), p)


# -- onnxcustom's helpers ----------------------------------------------------------------------------------------
_LOSS_NODES = ("squared_error", "absolute_error", "elastic", "log")


def add_loss_output(model, score_name: str = "squared_error", loss_name: str = "loss", label_name: str = "label",
                    output_index: int = 0, penalty: dict | None = None, l1_weight: float = 0.5,
                    l2_weight: float = 0.5):
    """A copy of ``model`` (ModelProto or path) with an input ``label_name`` and an output ``loss_name``:
    the loss of output ``output_index`` against the label, as a scalar of shape [1, 1] (onnxcustom's form).

    ``score_name``: ``squared_error`` sum (p - y)^2, ``absolute_error`` sum |p - y|, ``elastic``
    l1_weight * absolute + l2_weight * squared, ``log`` -sum log p[label] of a probability output (one
    column: the probability of class 1); sums over the whole batch, as onnxcustom writes them. ``penalty``:
    {initializer name: {"l1": a, "l2": b}} adds a * sum |w| + b * sum w^2 per named weight.
    """
    from onnx import TensorProto, helper, numpy_helper

    from .onnx_io import load_model

    if score_name not in _LOSS_NODES:
        raise InputError(f"score_name must be one of {_LOSS_NODES}, got {score_name!r}")
    proto = copy.deepcopy(load_model(model))
    graph = proto.graph
    if not 0 <= output_index < len(graph.output):
        raise InputError(f"output_index {output_index} is out of range: the model has {len(graph.output)} "
                         "output(s)")
    out = graph.output[output_index]
    names = {v.name for v in graph.input} | {v.name for v in graph.output} | {t.name for t in graph.initializer}
    clash = [n for n in (loss_name, label_name) if n in names]
    if clash:
        raise InputError(f"{clash} already name values of the model: choose other loss_name/label_name")
    elem = out.type.tensor_type.elem_type
    dims = [d.dim_param or d.dim_value or None for d in out.type.tensor_type.shape.dim]
    if score_name == "log":
        graph.input.append(helper.make_tensor_value_info(label_name, TensorProto.INT64, dims[:1]))
    else:
        graph.input.append(helper.make_tensor_value_info(label_name, elem, dims))
    dtype = helper.tensor_dtype_to_np_dtype(elem)
    p = f"{loss_name}_"
    nodes, terms = [], []

    def const(name, value, of=dtype):
        graph.initializer.append(numpy_helper.from_array(np.asarray(value, of), p + name))
        return p + name

    def total(name, x):
        nodes.append(helper.make_node("ReduceSum", [x], [p + name], keepdims=0))
        return p + name

    if score_name == "log":
        onehot_cols = dims[-1] if len(dims) > 1 and isinstance(dims[-1], int) else None
        prob = out.name
        if onehot_cols == 1:
            nodes.append(helper.make_node("Sub", [const("one", 1.0), out.name], [p + "p0"]))
            nodes.append(helper.make_node("Concat", [p + "p0", out.name], [p + "prob"], axis=-1))
            prob = p + "prob"
        nodes.append(helper.make_node("Clip", [prob, const("eps", 1e-7), const("max", 1.0)], [p + "clipped"]))
        nodes.append(helper.make_node("Log", [p + "clipped"], [p + "log"]))
        nodes.append(helper.make_node("Unsqueeze", [label_name, const("axis", [1], np.int64)], [p + "idx"]))
        nodes.append(helper.make_node("GatherElements", [p + "log", p + "idx"], [p + "picked"], axis=1))
        nodes.append(helper.make_node("Neg", [total("nll", p + "picked")], [p + "score"]))
        terms.append(p + "score")
    else:
        nodes.append(helper.make_node("Sub", [out.name, label_name], [p + "diff"]))
        if score_name in ("absolute_error", "elastic"):
            nodes.append(helper.make_node("Abs", [p + "diff"], [p + "abs"]))
            terms.append(total("l1", p + "abs"))
        if score_name in ("squared_error", "elastic"):
            nodes.append(helper.make_node("Mul", [p + "diff", p + "diff"], [p + "sq"]))
            terms.append(total("l2", p + "sq"))
        if score_name == "elastic":
            nodes.append(helper.make_node("Mul", [terms[0], const("w1", l1_weight)], [p + "l1w"]))
            nodes.append(helper.make_node("Mul", [terms[1], const("w2", l2_weight)], [p + "l2w"]))
            terms = [p + "l1w", p + "l2w"]
    inits = {t.name for t in graph.initializer}
    for k, (weight, coefs) in enumerate((penalty or {}).items()):
        if weight not in inits:
            raise InputError(f"penalty names '{weight}', which is not an initializer of the model")
        unknown = set(coefs) - {"l1", "l2"}
        if unknown:
            raise InputError(f"penalty of '{weight}' has unknown keys {sorted(unknown)}; use 'l1' and 'l2'")
        if coefs.get("l1"):
            nodes.append(helper.make_node("Abs", [weight], [f"{p}pabs{k}"]))
            nodes.append(helper.make_node("Mul", [total(f"pl1_{k}", f"{p}pabs{k}"), const(f"a{k}", coefs["l1"])],
                                          [f"{p}pen1_{k}"]))
            terms.append(f"{p}pen1_{k}")
        if coefs.get("l2"):
            nodes.append(helper.make_node("Mul", [weight, weight], [f"{p}psq{k}"]))
            nodes.append(helper.make_node("Mul", [total(f"pl2_{k}", f"{p}psq{k}"), const(f"b{k}", coefs["l2"])],
                                          [f"{p}pen2_{k}"]))
            terms.append(f"{p}pen2_{k}")
    nodes.append(helper.make_node("Sum", terms, [p + "sum"]) if len(terms) > 1 else
                 helper.make_node("Identity", terms, [p + "sum"]))
    nodes.append(helper.make_node("Reshape", [p + "sum", const("shape", [1, 1], np.int64)], [loss_name]))
    graph.node.extend(nodes)
    graph.output.append(helper.make_tensor_value_info(loss_name, elem, [1, 1]))
    return proto
