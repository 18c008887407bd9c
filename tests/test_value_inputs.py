"""Small inputs a shape rule needs as values (a Reshape's shape, Range's limit fed at run time) are planned per
value, as input shapes are; compared with onnxruntime."""
import numpy as np
import pytest
from onnx import helper

import edgetrain
from edgetrain.errors import ShapeError
from oracle import model, run_onnxruntime


def test_reshape_shape_and_range_limit_fed_at_run_time():
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"]),
             helper.make_node("Range", ["start", "limit", "delta"], ["r"])]
    feeds = {"x": np.arange(12, dtype=np.float32), "shape": np.array([3, 4], np.int64),
             "start": np.array(1, np.int64), "limit": np.array(7, np.int64), "delta": np.array(2, np.int64)}
    m = model(nodes, feeds, ["y", "r"])
    sess = edgetrain.InferenceSession(m.SerializeToString())
    for shape, limit in (([3, 4], 7), ([2, 6], 7), ([3, 4], 4)):
        feeds["shape"], feeds["limit"] = np.array(shape, np.int64), np.int64(limit)   # a numpy scalar feed too
        for g, w in zip(sess.run(None, feeds), run_onnxruntime(m, {k: np.asarray(v) for k, v in feeds.items()})):
            np.testing.assert_array_equal(g, w)
    assert len(sess._programs) == 3       # one plan per distinct (shape, limit)


def test_large_inputs_are_not_planned_per_value():
    node = helper.make_node("Reshape", ["x", "shape"], ["y"])
    feeds = {"x": np.zeros(65, np.float32), "shape": np.ones(65, np.int64)}
    sess = edgetrain.InferenceSession(model([node], feeds, ["y"]).SerializeToString())
    with pytest.raises(ShapeError, match="'shape'.*must be a constant"):
        sess.run(None, feeds)
