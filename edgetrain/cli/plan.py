"""Print the execution plan (steps, fusion, arena) of a model."""
from __future__ import annotations

import numpy as np


def add_arguments(p):
    p.add_argument("model")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic dimension (default 1)")


def run(args) -> int:
    from ..onnx_io import to_graph
    from ..plan import make_plan
    from ..session import bind_feeds

    graph = to_graph(args.model)
    sizes = dict(s.split("=") for s in args.dim)
    feeds = {}
    for v in graph.inputs:
        shape = tuple(d if isinstance(d, int) else int(sizes.get(str(d), 1)) for d in v.type.shape)
        feeds[v.name] = np.zeros(shape, v.type.dtype)
    plan = make_plan(graph, bind_feeds(graph.inputs, feeds, args.model), [v.name for v in graph.outputs])
    print(plan.describe())
    return 0
