"""Run one step of a training model on edgetrain's runtime and read back the accumulated gradients."""
from __future__ import annotations

import numpy as np

from edgetrain.onnx_io import to_graph
from edgetrain.plan import make_plan
from edgetrain.runtime import Program
from edgetrain.session import bind_feeds


def train_step(model, feeds: dict[str, np.ndarray], params: dict[str, np.ndarray]):
    """(loss, {param: gradient}) of one step with lazy_reset_grad set, from a training ModelProto."""
    graph = to_graph(model)
    names = [v.name for v in graph.inputs]
    trainable = [n[: -len("_grad.accumulation.buffer")] for n in names if n.endswith("_grad.accumulation.buffer")]
    all_feeds = dict(feeds) | dict(params) | {"lazy_reset_grad": np.ones(1, bool)}
    all_feeds |= {f"{p}_grad.accumulation.buffer": np.zeros_like(params[p]) for p in trainable}
    plan = make_plan(graph, bind_feeds(graph.inputs, all_feeds, "training model"), [v.name for v in graph.outputs])
    prog = Program(plan)
    outs = prog.run([all_feeds[n] for n in names])
    grads = {p: prog.values[f"{p}_grad.accumulation.buffer"].copy() for p in trainable}
    return np.array(outs[0]), grads
