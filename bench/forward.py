"""Forward pass of each bench model: edgetrain vs onnxruntime's InferenceSession, 1 thread, same inputs.

Each measurement runs in its own process, alternating between the two runtimes; prints medians and ratios.
    python bench/forward.py [--models mlp cnn ...] [--rounds 3] [--runs 300]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHARED = Path(os.environ.get("EDGETRAIN_SHARED", HERE.parents[1] / "shared"))
MODELS = ["mlp", "cnn", "digits", "transformer", "mobilenet"]

WORKER = r"""
import json, os, sys, time
t_start = time.time()
import numpy as np
runtime, path, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
if runtime == "edgetrain":
    import edgetrain
    sess = edgetrain.InferenceSession(path)
else:
    import onnxruntime as ort
    o = ort.SessionOptions(); o.intra_op_num_threads = 1; o.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, o, providers=["CPUExecutionProvider"])
rng = np.random.default_rng(0)
feeds = {}
for i in sess.get_inputs():
    shape = [d if isinstance(d, int) else 32 for d in i.shape]
    feeds[i.name] = (rng.integers(0, 100, shape) if "int64" in i.type else rng.standard_normal(shape)).astype(
        np.int64 if "int64" in i.type else np.float32)
sess.run(None, feeds)
import psutil
first = time.time() - psutil.Process().create_time()
extra = {}
if runtime == "edgetrain":
    prog = sess.program(feeds)
    run = lambda: prog.run([feeds[i.name] for i in sess.get_inputs()])
    extra = {"arena": prog.plan.arena_bytes, "naive": prog.plan.naive_bytes, "kernels": prog.plan.n_kernels}
else:
    run = lambda: sess.run(None, feeds)
for _ in range(20):
    run()
times = []
for _ in range(runs):
    t = time.perf_counter(); run(); times.append(time.perf_counter() - t)
times.sort()
print(json.dumps(dict(ms=1e3 * times[len(times) // 2], p90=1e3 * times[int(len(times) * 0.9)],
                      first_s=first, rss_mb=psutil.Process().memory_info().rss / 1e6, **extra)))
"""


def measure(runtime: str, model: Path, runs: int, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", WORKER, runtime, str(model), str(runs)], env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{runtime} on {model.name} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=300)
    args = ap.parse_args()
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", EDGETRAIN_NUM_THREADS="1")
    rows = []
    for name in args.models:
        model = SHARED / "models" / f"{name}.onnx"
        with tempfile.TemporaryDirectory() as cache:
            env_e = dict(env, EDGETRAIN_CACHE_DIR=cache)
            cold = measure("edgetrain", model, 10, env_e)        # empty kernel cache: compiles
            et, ort = [], []
            for _ in range(args.rounds):
                et.append(measure("edgetrain", model, args.runs, env_e))
                ort.append(measure("ort", model, args.runs, env))
        ms_e = statistics.median(r["ms"] for r in et)
        ms_o = statistics.median(r["ms"] for r in ort)
        rows.append((name, ms_e, ms_o, ms_e / ms_o, et[0]["arena"], et[0]["naive"], et[0]["kernels"],
                     cold["first_s"], statistics.median(r["first_s"] for r in et),
                     statistics.median(r["first_s"] for r in ort),
                     statistics.median(r["rss_mb"] for r in et), statistics.median(r["rss_mb"] for r in ort)))
    head = ("| model | edgetrain ms | ORT ms | ratio | arena KB | naive KB | kernels | cold start s | "
            "warm start s | ORT start s | RSS MB | ORT RSS MB |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in rows:
        print(f"| {r[0]} | {r[1]:.3f} | {r[2]:.3f} | {r[3]:.2f} | {r[4] / 1e3:.1f} | {r[5] / 1e3:.1f} | {r[6]} | "
              f"{r[7]:.2f} | {r[8]:.2f} | {r[9]:.2f} | {r[10]:.0f} | {r[11]:.0f} |")


if __name__ == "__main__":
    main()
