"""Models of older (and the newest) ai.onnx opsets load: edgetrain.opset's upgrade rules, checked against
onnxruntime running the model at its own opset."""
import numpy as np
import onnx
import pytest
from onnx import helper

import edgetrain
from edgetrain.errors import UnsupportedOpError
from oracle import model, run_edgetrain, run_onnxruntime

rng = np.random.default_rng(0)
X = rng.standard_normal((2, 3, 4)).astype(np.float32)
IMG = rng.standard_normal((1, 2, 3, 3)).astype(np.float32)

CASES = {
    "softmax-11 flattens at axis 1": (helper.make_node("Softmax", ["x"], ["y"], axis=1), 11, {"x": X}),
    "logsoftmax-11 default axis": (helper.make_node("LogSoftmax", ["x"], ["y"]), 11, {"x": X}),
    "slice-9 attributes": (helper.make_node("Slice", ["x"], ["y"], starts=[1, 0], ends=[3, -1], axes=[2, 0]),
                           9, {"x": X}),
    "clip-6 attributes": (helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.25), 6, {"x": X}),
    "dropout-7 ratio": (helper.make_node("Dropout", ["x"], ["y"], ratio=0.3), 7, {"x": X}),
    "topk-1 k": (helper.make_node("TopK", ["x"], ["v", "i"], k=2, axis=1), 1, {"x": X}),
    "split-11 attribute": (helper.make_node("Split", ["x"], ["a", "b"], axis=2, split=[1, 3]), 11, {"x": X}),
    "reducesum-11 axes": (helper.make_node("ReduceSum", ["x"], ["y"], axes=[0, 2], keepdims=0), 11, {"x": X}),
    "unsqueeze-11 axes": (helper.make_node("Unsqueeze", ["x"], ["y"], axes=[0, 3]), 11, {"x": X}),
    "upsample-9 nearest": (helper.make_node("Upsample", ["x", "s"], ["y"], mode="nearest"), 9,
                           {"x": IMG, "s": np.array([1, 1, 2, 3], np.float32)}),
    "resize-10 nearest": (helper.make_node("Resize", ["x", "s"], ["y"], mode="nearest"), 10,
                          {"x": IMG, "s": np.array([1, 1, 2, 2], np.float32)}),
    "batchnorm-7 spatial": (helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], spatial=1), 7,
                            {"x": IMG, **{k: rng.random(2).astype(np.float32) + 0.5 for k in "gbmv"}}),
    "pad-2 attributes": (helper.make_node("Pad", ["x"], ["y"], pads=[0, 1, 0, 1, 0, 2], value=1.5), 2, {"x": X}),
    "pad-2 reflect": (helper.make_node("Pad", ["x"], ["y"], pads=[0, 0, 1, 0, 0, 2], mode="reflect"), 2,
                      {"x": X}),
    "add at the newest opset": (helper.make_node("Add", ["x", "x"], ["y"]), onnx.defs.onnx_opset_version(),
                                {"x": X}),
}
CONST_INPUTS = {"upsample-9 nearest": ["s"], "resize-10 nearest": ["s"], "batchnorm-7 spatial": list("gbmv")}


@pytest.mark.parametrize("name", CASES)
def test_old_opsets_match_onnxruntime(name):
    node, opset, values = CASES[name]
    inits = {k: values[k] for k in CONST_INPUTS.get(name, [])}
    feeds = {k: v for k, v in values.items() if k not in inits}
    m = model([node], feeds, list(node.output), inits, opset=opset)
    want = run_onnxruntime(m, feeds)
    got = run_edgetrain(m, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_old_opset_model_is_stamped_13():
    node, opset, values = CASES["softmax-11 flattens at axis 1"]
    sess = edgetrain.InferenceSession(model([node], values, ["y"], opset=opset).SerializeToString())
    assert sess.graph.opsets[""] == 13
    assert [n.op_type for n in sess.graph.nodes] == ["Flatten", "Softmax", "Shape", "Reshape"]


def test_changed_op_without_rule_is_refused_by_name():
    # MaxUnpool-9 became MaxUnpool-11 (pads semantics spelled out); edgetrain has no rule for it
    m = model([helper.make_node("MaxUnpool", ["x", "i"], ["y"], kernel_shape=[2, 2], name="hm")],
              {"x": IMG, "i": np.zeros(IMG.shape, np.int64)}, ["y"], opset=10)
    with pytest.raises(UnsupportedOpError, match="node 'hm' \\(MaxUnpool\\).*opset 10 and opset 13"):
        edgetrain.InferenceSession(m.SerializeToString())
    bn = helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["y"], spatial=0)
    inits = {k: np.ones(2, np.float32) for k in "gbmv"}
    with pytest.raises(UnsupportedOpError, match="BatchNormalization_0|spatial=0"):
        edgetrain.InferenceSession(model([bn], {"x": IMG}, ["y"], inits, opset=7).SerializeToString())


def test_opset_beyond_installed_onnx_is_refused():
    m = model([helper.make_node("Relu", ["x"], ["y"])], {"x": X}, ["y"], opset=onnx.defs.onnx_opset_version() + 1)
    with pytest.raises(UnsupportedOpError, match="opset"):
        edgetrain.InferenceSession(m.SerializeToString())
