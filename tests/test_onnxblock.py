"""onnxblock's losses and blocks: loss values and parameter gradients against PyTorch."""
import numpy as np
import onnx
import pytest
import torch
from onnx import helper, numpy_helper
from trainrun import train_step

import edgetrain.onnxblock as onnxblock
from edgetrain.errors import EdgetrainError

RNG = np.random.default_rng(0)
W = RNG.standard_normal((3, 5)).astype(np.float32)
B = RNG.standard_normal(3).astype(np.float32)


def linear_model(out_features=3):
    """x[N, 5] -> Gemm -> output[N, out]: a model whose weights torch can mirror."""
    inits = [numpy_helper.from_array(W[:out_features], "w"), numpy_helper.from_array(B[:out_features], "b")]
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["output"], transB=1)], "lin",
                          [helper.make_tensor_value_info("x", 1, ["N", 5])],
                          [helper.make_tensor_value_info("output", 1, ["N", out_features])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class _Train(onnxblock.TrainingBlock):
    def __init__(self, loss):
        super().__init__()
        self._loss = loss

    def build(self, output):
        return self._loss(output)


def training_model(loss_block, out_features=3):
    block = _Train(loss_block)
    block.requires_grad("w")
    block.requires_grad("b")
    with onnxblock.base(linear_model(out_features)):
        block("output")
        train, _ = block.to_model_proto()
    onnx.checker.check_model(train)
    return train


def torch_reference(loss_fn, x, target, out_features=3):
    w = torch.tensor(W[:out_features], requires_grad=True)
    b = torch.tensor(B[:out_features], requires_grad=True)
    loss = loss_fn(torch.nn.functional.linear(torch.tensor(x), w, b), torch.tensor(target))
    loss.sum().backward()
    return loss.detach().numpy(), {"w": w.grad.numpy(), "b": b.grad.numpy()}


def compare(train, feeds, expected_loss, expected_grads, out_features=3):
    loss, grads = train_step(train, feeds, {"w": W[:out_features], "b": B[:out_features]})
    np.testing.assert_allclose(loss.reshape(np.shape(expected_loss)), expected_loss, rtol=1e-5, atol=1e-6)
    for p in ("w", "b"):
        np.testing.assert_allclose(grads[p], expected_grads[p], rtol=1e-4, atol=1e-6)


X = RNG.standard_normal((6, 5)).astype(np.float32)
T = RNG.standard_normal((6, 3)).astype(np.float32)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("name", ["MSELoss", "L1Loss"])
def test_regression_losses_match_torch(name, reduction):
    ours = getattr(onnxblock.loss, name)(reduction=reduction)
    theirs = {"MSELoss": torch.nn.MSELoss, "L1Loss": torch.nn.L1Loss}[name](reduction=reduction)
    train = training_model(ours)
    assert "target" in [i.name for i in train.graph.input]
    compare(train, {"x": X, "target": T}, *torch_reference(theirs, X, T))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("pos_weighted", [False, True])
def test_bce_with_logits_matches_torch(reduction, weighted, pos_weighted):
    weight = np.array([0.5, 1.0, 2.0], np.float32) if weighted else None
    pos_weight = np.array([3.0, 1.0, 0.25], np.float32) if pos_weighted else None
    target = (RNG.random((6, 3)) > 0.5).astype(np.float32)
    ours = onnxblock.loss.BCEWithLogitsLoss(weight=weight, reduction=reduction, pos_weight=pos_weight)
    theirs = torch.nn.BCEWithLogitsLoss(weight=None if weight is None else torch.tensor(weight),
                                        reduction=reduction,
                                        pos_weight=None if pos_weight is None else torch.tensor(pos_weight))
    compare(training_model(ours), {"x": X, "target": target}, *torch_reference(theirs, X, target))


def test_bce_with_logits_is_stable_for_large_logits():
    x = (X * 1000).astype(np.float32)
    target = (RNG.random((6, 3)) > 0.5).astype(np.float32)
    loss, grads = train_step(training_model(onnxblock.loss.BCEWithLogitsLoss()), {"x": x, "target": target},
                             {"w": W, "b": B})
    assert np.isfinite(loss).all() and all(np.isfinite(g).all() for g in grads.values())
    expected, _ = torch_reference(torch.nn.BCEWithLogitsLoss(), x, target)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted,ignore_index", [(False, None), (True, None), (True, 1), (False, 2)])
def test_cross_entropy_matches_torch(reduction, weighted, ignore_index):
    weight = np.array([0.2, 1.0, 3.0], np.float32) if weighted else None
    labels = np.array([0, 1, 2, 1, 2, 0], np.int64)
    ours = onnxblock.loss.CrossEntropyLoss(weight=weight, reduction=reduction, ignore_index=ignore_index)
    theirs = torch.nn.CrossEntropyLoss(weight=None if weight is None else torch.tensor(weight),
                                       reduction=reduction, ignore_index=-100 if ignore_index is None else ignore_index)
    train = training_model(ours)
    labels_input = next(i for i in train.graph.input if i.name == "labels")
    assert labels_input.type.tensor_type.elem_type == onnx.TensorProto.INT64
    compare(train, {"x": X, "labels": labels}, *torch_reference(theirs, X, labels))


def test_documented_weighted_average_custom_loss():
    """onnxruntime's documented custom-loss example, as written (only the import changed)."""
    class WeightedAverageLoss(onnxblock.Block):
        def __init__(self):
            self._loss1 = onnxblock.loss.MSELoss()
            self._loss2 = onnxblock.loss.MSELoss()
            self._w1 = onnxblock.blocks.Constant(0.4)
            self._w2 = onnxblock.blocks.Constant(0.6)
            self._add = onnxblock.blocks.Add()
            self._mul = onnxblock.blocks.Mul()

        def build(self, loss_input_name1, loss_input_name2):
            return self._add(
                self._mul(self._w1(), self._loss1(loss_input_name1, target_name="target1")),
                self._mul(self._w2(), self._loss2(loss_input_name2, target_name="target2"))
            )

    class Train(onnxblock.TrainingBlock):
        def __init__(self):
            super().__init__()
            self.loss = WeightedAverageLoss()

        def build(self, out1, out2):
            return self.loss(out1, out2)

    inits = [numpy_helper.from_array(W, "w"), numpy_helper.from_array(B, "b"),
             numpy_helper.from_array(W[:2] * 2, "w3"), numpy_helper.from_array(B[:2], "b3")]
    g = helper.make_graph([helper.make_node("Gemm", ["x", "w", "b"], ["out1"], transB=1),
                           helper.make_node("Gemm", ["x", "w3", "b3"], ["out2"], transB=1)], "two",
                          [helper.make_tensor_value_info("x", 1, ["N", 5])],
                          [helper.make_tensor_value_info("out1", 1, ["N", 3]),
                           helper.make_tensor_value_info("out2", 1, ["N", 2])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    block = Train()
    for p in ("w", "b"):
        block.requires_grad(p)
    for p in ("w3", "b3"):
        block.requires_grad(p, False)
    with onnxblock.base(model):
        block("out1", "out2")
        train, evaluation = block.to_model_proto()
    t1, t2 = T, RNG.standard_normal((6, 2)).astype(np.float32)
    loss, grads = train_step(train, {"x": X, "target1": t1, "target2": t2, "w3": W[:2] * 2, "b3": B[:2]},
                             {"w": W, "b": B})
    w, b = torch.tensor(W, requires_grad=True), torch.tensor(B, requires_grad=True)
    out2 = torch.nn.functional.linear(torch.tensor(X), torch.tensor(W[:2] * 2), torch.tensor(B[:2]))
    expected = 0.4 * torch.nn.functional.mse_loss(torch.nn.functional.linear(torch.tensor(X), w, b),
                                                  torch.tensor(t1)) + 0.6 * torch.nn.functional.mse_loss(
        out2, torch.tensor(t2))
    expected.backward()
    np.testing.assert_allclose(loss.reshape(()), expected.detach().numpy(), rtol=1e-5)
    np.testing.assert_allclose(grads["w"], w.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert [i.name for i in evaluation.graph.input] == ["x", "target1", "target2", "w", "b", "w3", "b3"]


def test_blocks_outside_a_base_say_so():
    with pytest.raises(EdgetrainError, match="onnxblock.base"):
        onnxblock.blocks.Add()("a", "b")


def test_bad_reduction_is_named():
    with pytest.raises(EdgetrainError, match="reduction 'avg'"):
        onnxblock.loss.MSELoss(reduction="avg")


@pytest.mark.parametrize("make,expected", [
    (lambda: onnxblock.blocks.Sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
    (lambda: onnxblock.blocks.Neg(), lambda x: -x),
    (lambda: onnxblock.blocks.Abs(), np.abs),
    (lambda: onnxblock.blocks.Log(), lambda x: np.log(np.abs(x) + 0) if False else None),
    (lambda: onnxblock.blocks.Clip(-0.5, 0.25), lambda x: np.clip(x, -0.5, 0.25)),
    (lambda: onnxblock.blocks.Pow(3.0), lambda x: x ** 3),
    (lambda: onnxblock.blocks.ReduceSum(keepdims=False), lambda x: np.array(x.sum())),
    (lambda: onnxblock.blocks.ReduceMean(keepdims=True), lambda x: x.mean(keepdims=True)),
    (lambda: onnxblock.blocks.ReduceAllL2(), lambda x: np.array(np.sqrt((x.astype(np.float64) ** 2).sum()))),
    (lambda: onnxblock.blocks.Cast(onnx.TensorProto.DOUBLE), lambda x: x.astype(np.float64)),
], ids=["Sigmoid", "Neg", "Abs", "Log", "Clip", "Pow", "ReduceSum", "ReduceMean", "ReduceAllL2", "Cast"])
def test_blocks_compute_what_their_names_say(make, expected):
    import edgetrain
    x = RNG.standard_normal((4, 3)).astype(np.float32)
    if expected(x) is None:      # Log: positive inputs
        x, expected = np.abs(x) + 0.1, np.log

    class Fwd(onnxblock.ForwardBlock):
        def build(self, name):
            return make()(name)

    g = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "id",
                          [helper.make_tensor_value_info("x", 1, [4, 3])], [helper.make_tensor_value_info("y", 1, [4, 3])])
    block = Fwd()
    with onnxblock.base(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)):
        block("y")
        model = block.to_model_proto()
    (out,) = edgetrain.InferenceSession(model.SerializeToString()).run(None, {"x": x})
    np.testing.assert_allclose(out, expected(x).astype(out.dtype), rtol=1e-5, atol=1e-6)


def test_linear_block_and_sequence_construct_build():
    class Fwd(onnxblock.ForwardBlock):
        def build(self, name):
            return onnxblock.blocks.Linear(3, 2)(name)

    block = Fwd()
    with onnxblock.base(linear_model()):
        block("output")
        model = block.to_model_proto()
    gemm = model.graph.node[-1]
    assert gemm.op_type == "Gemm" and [d for d in model.graph.output[0].type.tensor_type.shape.dim][1].dim_value == 2
    with onnxblock.base(linear_model()) as b:
        seq = onnxblock.blocks.SequenceConstruct()("output", "x")
        assert b.model.graph.node[-1].op_type == "SequenceConstruct" and seq == b.model.graph.node[-1].output[0]
