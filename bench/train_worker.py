"""One measurement of bench/train.py: a fresh process trains one model on one system and prints one JSON line.

    python bench/train_worker.py '{"system": "edgetrain", "model": "mlp", "source": DIR, "batch": NPZ,
                                   "steps": 200, "warmup": 20, "t0": <time.time() of the parent at spawn>}'

``system`` is ``edgetrain`` (edgetrain.api on the artifacts in ``source``), ``ort`` (ONNX Runtime 1.19.2's
training API on them; run with the ORT venv's python: torch is kept out of the process) or ``torch``
(PyTorch eager nn.Modules with the initial weights of the .npz ``source``; for ``"workload": NAME`` (and
``"tiny"``) the module bench/workloads.py builds, which the artifacts were exported from). Every system trains
on the one fixed batch in ``batch`` (``x``, ``y``). A step is ORT's ``module.train(); loss = module(x, y);
optimizer.step(); module.lazy_reset_grad()``, or torch's ``zero_grad; forward; loss; backward; step``.

Reports: ``first_s`` (process start -> first step done), ms per step over ``steps`` timed steps after ``warmup``
(median, p10, p90), ``peak_rss_mb`` (VmHWM: the peak resident set of this process's own address space, which,
unlike ru_maxrss, does not inherit the parent's peak across exec), ``import_rss_mb`` (VmRSS once the system's
packages are imported, before any model is loaded), ``built_rss_mb`` (VmRSS with the model and optimizer
built, before the first step) and the loss of the first and last step.
``"threads": N`` sets ORT's intra-op threads (edgetrain's come from EDGETRAIN_NUM_THREADS, set by the parent;
torch always runs on 1). ``"profile": N`` (edgetrain only) then profiles N more steps with
``edgetrain.profiling.profile_artifacts`` (public API, memory runs off): each kernel call of the training and
optimizer programs timed alone, summed by step label.
"""
import itertools
import json
import os
import sys
import time

SPEC = json.loads(sys.argv[1])
BENCH = os.path.dirname(os.path.abspath(__file__))


def status_mb(field: str) -> float:
    """``VmHWM`` (peak resident set) or ``VmRSS`` (resident now) of this process, in MiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


IMPORTED_MB: list[float] = []     # resident set once the system's Python packages are imported


# -- the systems: each returns step() -> loss (a 0-d array or tensor), and extras for the report --------------
def edgetrain_system(source: str, x, y):
    from edgetrain.api import CheckpointState, Module, Optimizer
    IMPORTED_MB.append(status_mb("VmRSS"))
    state = CheckpointState.load_checkpoint(os.path.join(source, "checkpoint"))
    module = Module(os.path.join(source, "training_model.onnx"), state)
    optimizer = Optimizer(os.path.join(source, "optimizer_model.onnx"), module)
    return training_step(module, optimizer, x, y), (module, optimizer)


def training_step(module, optimizer, x, y):
    """ANCHORS.md's step, for edgetrain's and ORT's API alike (same method names)."""
    def step():
        module.train()
        loss = module(x, y)
        optimizer.step()
        module.lazy_reset_grad()
        return loss
    return step


def ort_system(source: str, x, y):
    sys.path.insert(0, os.path.join(os.path.dirname(BENCH), "tests"))
    from ort119 import ORT_WITHOUT_TORCH
    names: dict = {}
    # the prelude tests/ort119.py starts its ORT snippets with: binds ort and ort_api, torch blocked
    exec(ORT_WITHOUT_TORCH, names)  # noqa: S102
    ort, api = names["ort"], names["ort_api"]
    IMPORTED_MB.append(status_mb("VmRSS"))
    options = ort.SessionOptions()
    options.intra_op_num_threads = SPEC.get("threads", 1)
    options.inter_op_num_threads = 1
    state = api.CheckpointState.load_checkpoint(os.path.join(source, "checkpoint"))
    module = api.Module(os.path.join(source, "training_model.onnx"), state, None, "cpu", session_options=options)
    optimizer = api.Optimizer(os.path.join(source, "optimizer_model.onnx"), module)
    return training_step(module, optimizer, x, y), None


def torch_model(name: str):
    """The five bench architectures as a user writes them; parameter names match the exported ONNX."""
    import torch
    from torch import nn

    class MLP(nn.Module):
        def __init__(self, sizes):
            super().__init__()
            for k, (a, b) in enumerate(itertools.pairwise(sizes), 1):
                setattr(self, f"fc{k}", nn.Linear(a, b))
            self.n = len(sizes) - 1

        def forward(self, x):
            for k in range(1, self.n):
                x = torch.relu(getattr(self, f"fc{k}")(x))
            return getattr(self, f"fc{self.n}")(x)

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.conv2 = nn.Conv2d(1, 8, 3, padding=1), nn.Conv2d(8, 16, 3, padding=1)
            self.fc1, self.fc2 = nn.Linear(784, 64), nn.Linear(64, 10)

        def forward(self, x):
            x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
            x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
            return self.fc2(torch.relu(self.fc1(x.flatten(1))))

    class Transformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(100, 64)
            self.pos = nn.Parameter(torch.zeros(1, 32, 64))
            self.block = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, activation="gelu", batch_first=True)
            self.head = nn.Linear(64, 4)

        def forward(self, tokens):
            return self.head(self.block(self.tok(tokens) + self.pos).mean(1))

    class MobileNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 32, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(32)
            self.dw, self.bn2 = nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False), nn.BatchNorm2d(32)
            self.pw, self.fc = nn.Conv2d(32, 64, 1), nn.Linear(64, 10)

        def forward(self, x):
            x = torch.relu(self.bn2(self.dw(nn.functional.relu6(self.bn1(self.conv1(x))))))
            return self.fc(nn.functional.adaptive_avg_pool2d(self.pw(x), 1).flatten(1))

    return {"mlp": lambda: MLP([784, 256, 128, 10]), "digits": lambda: MLP([64, 32, 10]), "cnn": CNN,
            "transformer": Transformer, "mobilenet": MobileNet}[name]()


LOSSES = {"CrossEntropyLoss": "cross_entropy", "MSELoss": "mse_loss"}     # LossType -> torch.nn.functional


def torch_system(source: str, x, y):
    import numpy as np
    import torch
    IMPORTED_MB.append(status_mb("VmRSS"))
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    if SPEC.get("workload"):
        # the workload's own builder: same seed, same weights as the model its artifacts were made from
        sys.path.insert(0, BENCH)
        import workloads
        w = workloads.build(SPEC["workload"], tiny=SPEC.get("tiny", False))
        model, loss_fn = w.model, LOSSES[w.loss]
    else:
        model, loss_fn = torch_model(SPEC["model"]), LOSSES["CrossEntropyLoss"]
        with np.load(source) as weights:
            state = {k: torch.from_numpy(weights[k].copy()) for k in weights.files}
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or any(not k.endswith("num_batches_tracked") for k in missing):
            raise RuntimeError(f"torch {SPEC['model']}: weights missing {missing}, unexpected {unexpected}")
        model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0)
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def step():
        optimizer.zero_grad()
        loss = getattr(torch.nn.functional, loss_fn)(model(tx), ty)
        loss.backward()
        optimizer.step()
        return loss.detach()
    return step, None


# -- the edgetrain breakdown: time per kernel call, by step label (edgetrain.profiling's public API) -------------
def profile(source: str, x, y, steps: int, input_names: list[str]) -> dict:
    """Medians over ``steps`` steps of each training and optimizer kernel call, timed alone, summed by step
    label; in a fresh Module made by the profiler (the eval model left out: only training is measured)."""
    import tempfile
    from edgetrain.profiling import profile_artifacts
    with tempfile.TemporaryDirectory(prefix="edgetrain-profile-") as folder:
        for name in ("training_model.onnx", "optimizer_model.onnx", "checkpoint"):
            os.symlink(os.path.join(os.path.abspath(source), name), os.path.join(folder, name))
        # no batch size: every input comes from ``data`` (a batch size would cut labels shaped [N*T] to N)
        found = profile_artifacts(folder, steps=max(2, steps),
                                  data=dict(zip(input_names, (x, y))), measure_memory=False)
    by_op = {f"{r.kind} {label}": ms for r in found.reports for label, ms in r.by_op.items()}
    return {"step_ms": sum(r.step_ms for r in found.reports), "kernel_ms": sum(r.kernel_ms for r in found.reports),
            "by_op": dict(sorted(by_op.items(), key=lambda kv: -kv[1])),
            "kernels": {r.kind: r.kernels for r in found.reports}}


def main():
    import numpy as np
    with np.load(SPEC["batch"]) as batch:
        x, y = batch["x"], batch["y"]
    make = {"edgetrain": edgetrain_system, "ort": ort_system, "torch": torch_system}[SPEC["system"]]
    step, handles = make(SPEC["source"], x, y)
    built_mb = status_mb("VmRSS")
    first_loss = float(step())
    first_s = time.time() - SPEC["t0"]
    for _ in range(SPEC["warmup"] - 1):
        step()
    times = []
    clock = time.perf_counter
    for _ in range(SPEC["steps"]):
        t = clock()
        loss = step()
        times.append(clock() - t)
    last_loss = float(loss)
    times.sort()
    n = len(times)
    out = {"first_s": first_s, "ms": 1e3 * times[n // 2], "p10": 1e3 * times[n // 10],
           "p90": 1e3 * times[(9 * n) // 10], "peak_rss_mb": status_mb("VmHWM"), "import_rss_mb": IMPORTED_MB[0],
           "built_rss_mb": built_mb,
           "loss_first": first_loss,
           "loss_last": last_loss, "steps": SPEC["warmup"] + SPEC["steps"]}
    if SPEC["system"] == "edgetrain":
        from edgetrain.kernels._jit import compile_stats
        out["compiled"] = compile_stats()
        out["numba_imported"] = "numba" in sys.modules      # False on the warm path (bench/warm.py)
        if SPEC.get("profile"):
            module = handles[0]
            out["profile"] = profile(SPEC["source"], x, y, SPEC["profile"], module.input_names())
    print(json.dumps(out))


if __name__ == "__main__":
    main()
