"""Train the bundled MLP (64-32-10) on scikit-learn's 8x8 digits, shipped inside the package; no arguments needed.

Makes the artifacts, trains with AdamW, prints the test accuracy and the memory of each kind of step, exports an
inference model and checks it with edgetrain.InferenceSession against a plain numpy forward pass.
"""
from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np


def add_arguments(p):
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0, help="seed of the train/test split and of the batch order")
    p.add_argument("-o", "--output", help="folder to keep the artifacts and the exported model in (default: a "
                                          "temporary folder, removed at the end)")
    p.add_argument("--no-progress", action="store_true")


def _mb(n: int) -> str:
    return f"{n / 2**20:.2f} MB" if n >= 2**20 else f"{n / 2**10:.1f} KB"


def memory_report(module, optimizer) -> list[str]:
    """Planned arena per kind of step and input shape, state bytes by kind, the process's peak RSS."""
    import resource

    import psutil

    store = module.state_store
    lines = []
    # a training step's two programs (one per gradient slot) share one plan: one line for both
    for kind, prog in {id(p.plan): (k, p) for k, p in module.programs()}.values():
        shapes = ", ".join(f"{n}{list(prog.plan.spec.types[n].shape)}" for n in prog.plan.fed_inputs)
        lines.append(f"  {kind:9s} step: arena {_mb(prog.plan.arena_bytes)} (naive {_mb(prog.plan.naive_bytes)}) "
                     f"for {shapes}")
    lines.append(f"  optimizer step: arena {_mb(optimizer.program.plan.arena_bytes)}")
    moments = sum(m.nbytes for m in store.moments)
    lines.append(f"  state: parameters {_mb(store.params.nbytes)}, gradients {_mb(store.grads.nbytes)} x 2 slots, "
                 f"optimizer moments {_mb(moments)}, frozen {_mb(sum(a.nbytes for a in store.frozen.values()))}")
    rss = psutil.Process().memory_info().rss
    # Linux reports ru_maxrss in KiB, sampled by the kernel less often than psutil reads RSS: never below now
    peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, rss)
    lines.append(f"  process: RSS {_mb(rss)} now, peak {_mb(peak)}")
    return lines


def run(args) -> int:
    if args.output:
        return _demo(args, Path(args.output))
    with tempfile.TemporaryDirectory(prefix="edgetrain-demo-") as folder:     # nothing left behind
        return _demo(args, Path(folder))


def _demo(args, folder: Path) -> int:
    from .. import InferenceSession, artifacts, config
    from ..data import digits_model, digits_split
    from ..kernels import _jit
    from ..trainer import evaluate, open_artifacts, train_epoch
    from .progress import Progress

    start = time.perf_counter()
    config.set_seed(args.seed)
    (x_train, y_train), (x_test, y_test) = digits_split(seed=args.seed)
    print(f"edgetrain demo: digits MLP 64-32-10, {len(y_train)} training and {len(y_test)} test images; "
          f"artifacts in {folder}")
    artifacts.generate_artifacts(digits_model(), requires_grad=["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"],
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=folder)
    state, module, optimizer = open_artifacts(folder)
    optimizer.set_learning_rate(args.lr)
    progress = Progress(args.epochs, enabled=not args.no_progress)
    first_step = None
    for epoch in range(args.epochs):
        t0 = time.perf_counter()
        loss = train_epoch(module, optimizer, [x_train, y_train], args.batch_size, epoch,
                           np.random.default_rng([args.seed, epoch]), on_step=progress.step)
        first_step = first_step or time.perf_counter() - start
        seconds = time.perf_counter() - t0
        test_loss = evaluate(module, [x_test, y_test], 360)
        progress.epoch(epoch, f"train loss {loss:.4f}, test loss {test_loss:.4f}, "
                              f"{len(y_train) / seconds:,.0f} samples/s")
    model_path = folder / "digits_inference.onnx"
    module.export_model_for_inferencing(model_path, ["output"])
    (logits,) = InferenceSession(str(model_path)).run(None, {"input": x_test})
    accuracy = float((logits.argmax(axis=1) == y_test).mean())
    p = {n: np.asarray(state.parameters[n].data) for n in ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")}
    reference = np.maximum(x_test @ p["fc1.weight"].T + p["fc1.bias"], 0) @ p["fc2.weight"].T + p["fc2.bias"]
    agree = bool(np.allclose(logits, reference, rtol=1e-4, atol=1e-4))
    print(f"test accuracy {accuracy:.4f} ({round(accuracy * len(y_test))}/{len(y_test)})")
    print("memory per step (planned before step 1; nothing is allocated per step):")
    print("\n".join(memory_report(module, optimizer)))
    stats = _jit.compile_stats()
    print(f"kernels: {stats['misses']} compiled, {stats['hits']} from the cache; first epoch done "
          f"{first_step:.2f} s after start")
    print(f"exported {model_path}{'' if args.output else ' (removed at exit: -o DIR keeps it)'}; "
          f"edgetrain.InferenceSession logits {'match' if agree else 'DO NOT match'} a numpy forward pass with the "
          "trained parameters")
    return 0 if agree else 1
