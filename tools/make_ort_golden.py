"""Regenerate tests/golden/ort119/: files written by ONNX Runtime 1.19.2 (training), checked into the repository
so that format compatibility is tested on every Python, without ORT (tests/test_golden.py).

    python tools/make_ort_golden.py        # needs python3.11 (tests/ort119.py builds ORT's venv once)

A tiny model (x[N, 4] -> Gemm 4x6 -> Relu -> Mul by a frozen scale -> Gemm 6x3) goes through ORT's
artifacts.generate_artifacts (CrossEntropyLoss, AdamW); ORT then trains it on fixed batches and records:
- artifacts: training_model.onnx, eval_model.onnx, optimizer_model.onnx, checkpoint (as generated);
- checkpoint_trained: after 4 steps, with optimizer state and three properties (int, float, str);
- trajectory.npz: the batches, the learning rate, the parameters ORT reports before training and after steps
  4 and 6, the training losses of steps 1-6 (steps 5-6 resumed from checkpoint_trained in a fresh session) and
  the eval loss after step 4.
"""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "golden" / "ort119"
sys.path.insert(0, str(ROOT / "tests"))
import ort119  # noqa: E402

LR, STEPS, RESUMED, BATCH = 0.05, 4, 2, 8
PROPERTIES = {"epoch": 3, "best_loss": 0.8125, "run": "tiny-\u00e9"}


def tiny_model() -> onnx.ModelProto:
    rng = np.random.default_rng(18)
    inits = {"fc1.weight": rng.standard_normal((6, 4)) * 0.5, "fc1.bias": rng.standard_normal(6) * 0.1,
             "scale": np.full(6, 1.5), "fc2.weight": rng.standard_normal((3, 6)) * 0.5,
             "fc2.bias": rng.standard_normal(3) * 0.1}
    nodes = [helper.make_node("Gemm", ["input", "fc1.weight", "fc1.bias"], ["h"], transB=1, name="fc1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "scale"], ["s"], name="scale_mul"),
             helper.make_node("Gemm", ["s", "fc2.weight", "fc2.bias"], ["output"], transB=1, name="fc2")]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("input", 1, ["N", 4])],
                              [helper.make_tensor_value_info("output", 1, ["N", 3])],
                              [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


SNIPPET = r'''
# onnxruntime.tools asks find_spec("torch"), which the prelude's blocker answers with an error; the venv has no
# torch, so without the blocker the answer is None
sys.meta_path = [f for f in sys.meta_path if type(f).__name__ != "_NoTorch"]
from onnxruntime.training import artifacts
import onnx
d = ARGS["out"]
artifacts.generate_artifacts(onnx.load(ARGS["model"]), requires_grad=ARGS["trainable"], frozen_params=["scale"],
                             loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                             artifact_directory=d)
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1

def session(ckpt):
    state = ort_api.CheckpointState.load_checkpoint(ckpt)
    m = ort_api.Module(d + "/training_model.onnx", state, d + "/eval_model.onnx", session_options=so)
    opt = ort_api.Optimizer(d + "/optimizer_model.onnx", m)
    opt.set_learning_rate(ARGS["lr"])
    m.train()
    return state, m, opt

def params(state, tag):
    for n, p in state.parameters:
        OUT[f"{tag}:{n}"] = np.array(p.data, copy=True)

state, m, opt = session(d + "/checkpoint")
params(state, "initial")
losses = []
for k in range(ARGS["steps"]):
    losses.append(float(m(ARRAYS[f"x{k}"], ARRAYS[f"y{k}"]))); opt.step(); m.lazy_reset_grad()
m.eval()
OUT["eval_loss"] = np.asarray(m(ARRAYS["x0"], ARRAYS["y0"]), np.float32)
params(state, "trained")
for k, v in ARGS["properties"].items():
    state.properties[k] = v
ort_api.CheckpointState.save_checkpoint(state, d + "/checkpoint_trained", include_optimizer_state=True)
state, m, opt = session(d + "/checkpoint_trained")
for k in range(ARGS["steps"], ARGS["steps"] + ARGS["resumed"]):
    losses.append(float(m(ARRAYS[f"x{k}"], ARRAYS[f"y{k}"]))); opt.step(); m.lazy_reset_grad()
params(state, "resumed")
OUT["losses"] = np.array(losses, np.float32)
'''


def main() -> None:
    model = tiny_model()
    shutil.rmtree(OUT, ignore_errors=True)
    OUT.mkdir(parents=True)
    model_path = OUT / "tiny.onnx"
    onnx.save(model, model_path)
    rng = np.random.default_rng(19)
    batches = {}
    for k in range(STEPS + RESUMED):
        batches[f"x{k}"] = rng.standard_normal((BATCH, 4)).astype(np.float32)
        batches[f"y{k}"] = rng.integers(0, 3, BATCH).astype(np.int64)
    trainable = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
    got = ort119.run(SNIPPET, {"out": str(OUT), "model": str(model_path), "trainable": trainable, "lr": LR,
                               "steps": STEPS, "resumed": RESUMED, "properties": PROPERTIES}, batches)
    np.savez(OUT / "trajectory.npz", lr=np.float32(LR), **batches, **got)
    (OUT / "properties.json").write_text(json.dumps(PROPERTIES, ensure_ascii=True) + "\n")
    for f in sorted(OUT.iterdir()):
        print(f"{f.stat().st_size:8d}  {f.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
