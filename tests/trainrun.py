"""Run one step of a training model on edgetrain's runtime and read back the accumulated gradients."""
from __future__ import annotations

import numpy as np

from edgetrain.onnx_io import to_graph
from edgetrain.plan import make_plan
from edgetrain.runtime import Program
from edgetrain.session import bind_feeds

BUFFER = "_grad.accumulation.buffer"


def train_step(model, feeds: dict[str, np.ndarray], params: dict[str, np.ndarray]):
    """(loss, {param: gradient}) of one step with lazy_reset_grad set, from a training ModelProto.

    Parameters and gradient buffers are bound as external arrays, as the training runtime binds its state."""
    graph = to_graph(model)
    names = [v.name for v in graph.inputs]
    trainable = [n[: -len(BUFFER)] for n in names if n.endswith(BUFFER)]
    state = {p: np.ascontiguousarray(a) for p, a in params.items()}
    state |= {f"{p}{BUFFER}": np.zeros_like(params[p]) for p in trainable}
    fed = dict(feeds) | {"lazy_reset_grad": np.ones(1, bool)}
    plan = make_plan(graph, bind_feeds(graph.inputs, fed | state, "training model"),
                     [v.name for v in graph.outputs], external=state)
    prog = Program(plan, state)
    outs = prog.run([fed[n] for n in plan.fed_inputs])
    return np.array(outs[0]), {p: state[f"{p}{BUFFER}"] for p in trainable}
