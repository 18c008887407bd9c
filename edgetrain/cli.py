"""The ``edgetrain`` command line."""
from __future__ import annotations

import argparse
import sys
import time
from importlib import resources

import numpy as np


def _demo(args) -> int:
    from . import InferenceSession
    from .kernels import _jit

    path = resources.files("edgetrain.data") / "digits_mlp.onnx"
    sess = InferenceSession(path.read_bytes())
    x = np.random.default_rng(0).standard_normal((args.batch_size, 64)).astype(np.float32)
    t0 = time.perf_counter()
    (logits,) = sess.run(None, {"input": x})
    first = time.perf_counter() - t0
    prog = sess.program({"input": x})
    runs = 2000
    t0 = time.perf_counter()
    for _ in range(runs):
        prog.run([x])
    per = (time.perf_counter() - t0) / runs
    print("edgetrain demo: forward pass of the bundled digits MLP (64-32-10)")
    print(prog.plan.describe())
    stats = _jit.compile_stats()
    print(f"first run {first * 1e3:.1f} ms (kernels: {stats['misses']} compiled, {stats['hits']} from cache); "
          f"steady state {per * 1e6:.1f} us per forward at batch {args.batch_size}")
    print("predicted classes:", logits.argmax(axis=1)[:16].tolist())
    return 0


def _plan(args) -> int:
    from .onnx_io import to_graph
    from .plan import make_plan
    from .session import bind_feeds

    graph = to_graph(args.model)
    sizes = dict(s.split("=") for s in args.dim)
    feeds = {}
    for v in graph.inputs:
        shape = tuple(d if isinstance(d, int) else int(sizes.get(str(d), 1)) for d in v.type.shape)
        feeds[v.name] = np.zeros(shape, v.type.dtype)
    plan = make_plan(graph, bind_feeds(graph.inputs, feeds, args.model), [v.name for v in graph.outputs])
    print(plan.describe())
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="edgetrain", description="On-device training of ONNX models")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="run the bundled digits model and print its plan")
    demo.add_argument("--batch-size", type=int, default=32)
    demo.set_defaults(fn=_demo)
    plan = sub.add_parser("plan", help="print the execution plan of a model")
    plan.add_argument("model")
    plan.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                      help="size of a symbolic dimension (default 1)")
    plan.set_defaults(fn=_plan)
    args = parser.parse_args(argv)
    from .errors import EdgetrainError
    try:
        return args.fn(args)
    except EdgetrainError as e:
        print(f"edgetrain: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
