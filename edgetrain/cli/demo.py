"""Run the bundled digits model and print its plan."""
from __future__ import annotations

import time
from importlib import resources

import numpy as np


def add_arguments(p):
    p.add_argument("--batch-size", type=int, default=32)


def run(args) -> int:
    from .. import InferenceSession
    from ..kernels import _jit

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
