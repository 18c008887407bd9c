"""The second training API measured: edgetrain's estimators against scikit-learn, its forward/backward layer
against PyTorch. One process, 1 thread everywhere; the same data, epochs and batch size on both sides.

    python bench/estimators.py [--epochs 10] [--steps 300]

Estimators: each fit runs twice and the second is timed (the first plans and loads kernels; its time is
printed too). Scores are on held-out data: R^2 for regressors, accuracy for classifiers.
Layer: ms per forward+backward of an MLP at batch 64, median over ``--steps`` after 20 warm-up steps: the
layer written in torch (autograd), the ONNX model as ``edgetrain.torch.ONNXLayer`` inside torch, and
``ForwardBackward`` called directly on numpy arrays.
"""
from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import itertools
import statistics
import time
import warnings

import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import SGDRegressor
from sklearn.neural_network import MLPClassifier, MLPRegressor

from edgetrain.data import digits_split
from edgetrain.estimators import (
    ForwardBackwardEstimator,
    GradientEstimator,
    LearningRateSGD,
    LearningRateSGDNesterov,
    NegLogLearningLoss,
)
from edgetrain.forward_backward import ForwardBackward
from edgetrain.torch import ONNXLayer


def mlp_model(sizes: list[int], seed: int = 0):
    """Gemm/Relu layers with Glorot-uniform weights (scikit-learn's MLP initialization), dynamic batch."""
    rng = np.random.default_rng(seed)
    nodes, inits, x = [], {}, "X"
    for k, (a, b) in enumerate(itertools.pairwise(sizes)):
        bound = np.sqrt(6 / (a + b))
        inits[f"W{k}"] = rng.uniform(-bound, bound, (a, b)).astype(np.float32)
        inits[f"b{k}"] = rng.uniform(-bound, bound, b).astype(np.float32)
        nodes.append(helper.make_node("Gemm", [x, f"W{k}", f"b{k}"], [f"h{k}"]))
        x = f"h{k}"
        if k < len(sizes) - 2:
            nodes.append(helper.make_node("Relu", [x], [f"r{k}"]))
            x = f"r{k}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "mlp",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["N", sizes[0]])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", sizes[-1]])],
                              [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), inits


def regression_data(n: int, d: int, nonlinear: bool, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n, d)).astype(np.float32)
    w = rng.standard_normal(d)
    y = X @ w + 0.5
    if nonlinear:
        y = np.sin(X[:, 0]) * 2 + X[:, 1] * X[:, 2] + np.tanh(X @ w / 3)
    y = (y + 0.1 * rng.standard_normal(n)).astype(np.float32)
    cut = int(0.8 * n)
    return (X[:cut], y[:cut]), (X[cut:], y[cut:])


def timed_fit(make, train, test):
    first = time.perf_counter()
    make().fit(*train)
    first = time.perf_counter() - first
    est = make()
    t = time.perf_counter()
    est.fit(*train)
    return time.perf_counter() - t, first, est.score(*test)


def estimators(epochs: int) -> list[str]:
    ours = {"epochs": epochs, "batch_size": 32, "random_state": 0}
    sk_mlp = {"solver": "sgd", "momentum": 0.9, "nesterovs_momentum": True, "batch_size": 32, "max_iter": epochs,
              "alpha": 0.0, "tol": 0.0, "n_iter_no_change": epochs + 1, "random_state": 0}
    rows = []
    lin = regression_data(5000, 20, False)
    linear, _ = mlp_model([20, 1])
    rows += [
        ("linear regression, 4000x20", "scikit-learn SGDRegressor (per sample, invscaling 0.01)",
         timed_fit(lambda: SGDRegressor(max_iter=epochs, tol=None, penalty=None, eta0=0.01, random_state=0),
                   *lin)),
        ("", "edgetrain ForwardBackwardEstimator (batch 32, SGD 0.05)",
         timed_fit(lambda: ForwardBackwardEstimator(linear, learning_rate=LearningRateSGD(0.05, "constant"),
                                                    **ours), *lin)),
        ("", "edgetrain GradientEstimator (loss in graph, batch 32, SGD 0.05)",
         timed_fit(lambda: GradientEstimator(linear, learning_rate=0.05, **ours), *lin))]
    nonlin = regression_data(5000, 20, True)
    mlp, _ = mlp_model([20, 64, 1])
    # scikit-learn's squared loss is mean((p - y)^2) / 2, as SquareLearningLoss
    rows += [
        ("MLP regression 20-64-1, 4000x20", "scikit-learn MLPRegressor (sgd, Nesterov 0.9, lr 0.01)",
         timed_fit(lambda: MLPRegressor(hidden_layer_sizes=(64,), learning_rate_init=0.01, **sk_mlp), *nonlin)),
        ("", "edgetrain ForwardBackwardEstimator (Nesterov 0.9, lr 0.01)",
         timed_fit(lambda: ForwardBackwardEstimator(mlp, learning_rate=LearningRateSGDNesterov(0.01), **ours),
                   *nonlin))]
    digits = digits_split()
    clf, _ = mlp_model([64, 32, 10])
    rows += [
        ("MLP classifier 64-32-10, digits 1437/360", "scikit-learn MLPClassifier (sgd, Nesterov 0.9, lr 0.1)",
         timed_fit(lambda: MLPClassifier(hidden_layer_sizes=(32,), learning_rate_init=0.1, **sk_mlp), *digits)),
        ("", "edgetrain ForwardBackwardEstimator (NegLog, Nesterov 0.9, lr 0.1)",
         timed_fit(lambda: ForwardBackwardEstimator(clf, loss=NegLogLearningLoss(),
                                                    learning_rate=LearningRateSGDNesterov(0.1), **ours), *digits)),
        ("", "edgetrain GradientEstimator (cross-entropy in graph, SGD 0.1)",
         timed_fit(lambda: GradientEstimator(clf, loss="log", learning_rate=0.1, **ours), *digits))]
    lines = [f"Estimators, {epochs} epochs (fit s: second fit; first fit in brackets)", "",
             "| task | estimator | fit s | score (R^2 / accuracy) |", "|---|---|---|---|"]
    for task, name, (t, first, score) in rows:
        lines.append(f"| {task} | {name} | {t:.3f} ({first:.2f}) | {score:.4f} |")
    return lines


def layer(steps: int, sizes: list[int], batch: int = 64) -> str:
    model, inits = mlp_model(sizes)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    gy = rng.standard_normal((batch, sizes[-1])).astype(np.float32)
    xt, gyt = torch.tensor(x), torch.tensor(gy)
    torch_layers = []
    for k in range(len(sizes) - 1):
        lin = torch.nn.Linear(sizes[k], sizes[k + 1])
        with torch.no_grad():
            lin.weight.copy_(torch.tensor(inits[f"W{k}"].T))
            lin.bias.copy_(torch.tensor(inits[f"b{k}"]))
        torch_layers += [lin, torch.nn.ReLU()]
    net = torch.nn.Sequential(*torch_layers[:-1])
    onnx_layer = ONNXLayer(model, input_grads=[])
    fb = ForwardBackward(model)

    def run_torch(m):
        m.zero_grad(set_to_none=True)
        m(xt).backward(gyt)

    def run_fb():
        _, ctx = fb.forward([x])
        fb.backward(ctx, [gy])

    results = {}
    systems = [("torch autograd", lambda: run_torch(net)), ("ONNXLayer in torch", lambda: run_torch(onnx_layer)),
               ("ForwardBackward (numpy)", run_fb)]
    for name, step in systems:
        for _ in range(20):
            step()
        times = []
        for _ in range(steps):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
        results[name] = statistics.median(times) * 1e3
    cells = " | ".join(f"{v:.3f}" for v in results.values())
    ratio = results["ONNXLayer in torch"] / results["torch autograd"]
    return f"| {'-'.join(map(str, sizes))}, batch {batch} | {cells} | {ratio:.2f} |"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=ConvergenceWarning)
    lines = estimators(args.epochs)
    lines += ["", f"Forward+backward of one layer, ms (median of {args.steps})", "",
              "| MLP | torch autograd | ONNXLayer in torch | ForwardBackward (numpy) | ONNXLayer / torch |",
              "|---|---|---|---|---|"]
    lines += [layer(args.steps, [64, 32, 10]), layer(args.steps, [784, 256, 10])]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
