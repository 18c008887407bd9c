"""Training side by side: edgetrain, ONNX Runtime 1.19.2 (training) and PyTorch, 1 thread, same batch and weights.

    python bench/train.py [--models mlp cnn ...] [--rounds 5] [--steps 200] [--warmup 20] [--quick]

Sets up (or reuses) ORT 1.19.2's venv (tests/ort119.py), then for each bench model makes edgetrain's artifacts
with the call the tests use (CrossEntropy, AdamW, labels ``labels``) and measures, each in a fresh process
(bench/train_worker.py), alternating the order every round:

    edgetrain         edgetrain.api on edgetrain's artifacts
    edgetrain@ort     edgetrain.api on ORT's artifacts (../shared/ort_artifacts)
    ort               ORT 1.19.2 on its own artifacts: the baseline of every ratio
    ort@edgetrain     ORT 1.19.2 on edgetrain's artifacts (if it cannot load them, the error is recorded)
    torch             PyTorch eager nn.Modules, torch.optim.AdamW, initial weights from ORT's checkpoint

ms per step (median, p10/p90 within a process, range across processes), peak RSS, start (process start ->
first step done; edgetrain also with an empty kernel cache: "cold") and the first and last loss. Prints the
tables and writes bench/RESULTS.md (``--quick``: a short smoke run that writes only to ``--out`` if given).
"""
from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = Path(os.environ.get("EDGETRAIN_SHARED", REPO.parent / "shared"))
WORKER = HERE / "train_worker.py"
MODELS = ["mlp", "cnn", "digits", "transformer", "mobilenet"]
# ANCHORS.md: batch per model; fixed_batch draws x then y from np.random.default_rng(0)
BATCH = {"mlp": (64, 784), "cnn": (32, 1, 28, 28), "digits": (32, 64), "transformer": (8, 32),
         "mobilenet": (16, 3, 32, 32)}
CLASSES = {"transformer": 4}          # the others have 10
TOKENS = {"transformer": 100}         # integer inputs: token ids must be valid rows of the embedding
TARGETS = "edgetrain ms/step <= 0.8x ORT, peak RSS <= ORT, warm start <= 1 s"


@dataclass(frozen=True)
class System:
    name: str
    runtime: str        # edgetrain | ort | torch
    artifacts: str      # edgetrain | ort | weights


SYSTEMS = [System("edgetrain", "edgetrain", "edgetrain"), System("edgetrain@ort", "edgetrain", "ort"),
           System("ort", "ort", "ort"), System("ort@edgetrain", "ort", "edgetrain"),
           System("torch", "torch", "weights")]
BASELINE = "ort"


def load_ort119():
    """tests/ort119.py, which builds and finds ORT 1.19.2's venv (imported by path: tests/ is not a package)."""
    spec = importlib.util.spec_from_file_location("ort119", REPO / "tests" / "ort119.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def fixed_batch(model: str) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    shape = BATCH[model]
    if model in TOKENS:
        x = rng.integers(0, TOKENS[model], shape, dtype=np.int64)
    else:
        x = rng.standard_normal(shape, dtype=np.float32)
    y = rng.integers(0, CLASSES.get(model, 10), (shape[0],), dtype=np.int64)
    return x, y


def prepare(model: str, work: Path) -> dict:
    """The model's inputs on disk: the batch, edgetrain's artifacts and the initial weights for torch."""
    from edgetrain import artifacts, checkpoint
    ort_dir = SHARED / "ort_artifacts" / model
    if not (ort_dir / "checkpoint").exists():
        raise SystemExit(f"ORT's artifacts for '{model}' are missing at {ort_dir} (set EDGETRAIN_SHARED)")
    folder = work / model
    folder.mkdir(parents=True)
    x, y = fixed_batch(model)
    np.savez(folder / "batch.npz", x=x, y=y)
    ckpt = checkpoint.load(ort_dir / "checkpoint")
    np.savez(folder / "weights.npz", **ckpt.trainable, **ckpt.frozen)
    own = folder / "edgetrain_artifacts"
    t = time.perf_counter()
    artifacts.generate_artifacts(str(SHARED / "models" / f"{model}.onnx"), requires_grad=list(ckpt.trainable),
                                 frozen_params=list(ckpt.frozen), loss=artifacts.LossType.CrossEntropyLoss,
                                 optimizer=artifacts.OptimType.AdamW, artifact_directory=own)
    generate_s = time.perf_counter() - t
    mine = checkpoint.load(own / "checkpoint")
    theirs = ckpt.trainable | ckpt.frozen
    weights_diff = max(float(np.abs(a - theirs[n]).max()) for n, a in (mine.trainable | mine.frozen).items())
    return {"batch": folder / "batch.npz", "ort": ort_dir, "edgetrain": own, "weights": folder / "weights.npz",
            "generate_s": generate_s, "weights_diff": weights_diff, "caches": folder}


def worker_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1", EDGETRAIN_NUM_THREADS="1")
    return env


def measure(system: System, model: str, inputs: dict, python: dict, steps: int, warmup: int,
            cache: Path | None = None, profile: int = 0) -> dict:
    """One fresh worker process; its JSON result, or {"error": ...} if it failed."""
    spec = {"system": system.runtime, "model": model, "source": str(inputs[system.artifacts]),
            "batch": str(inputs["batch"]), "steps": steps, "warmup": warmup, "profile": profile}
    env = worker_env()
    if cache is not None:
        env["EDGETRAIN_CACHE_DIR"] = str(cache)
    spec["t0"] = time.time()
    try:
        out = subprocess.run([python[system.runtime], str(WORKER), json.dumps(spec)], check=False,
                             env=env, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return {"error": "no result after 900 s"}
    if out.returncode:
        lines = [ln for ln in out.stderr.strip().splitlines() if ln.strip()]
        return {"error": f"exit {out.returncode}: " + (lines[-1] if lines else "(no message)")}
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_model(model: str, systems: list[System], inputs: dict, python: dict, args) -> dict:
    """Cold starts first (empty kernel caches), then ``rounds`` rounds over all systems, rotating the order."""
    caches = {s.name: inputs["caches"] / f"cache-{s.artifacts}" for s in systems if s.runtime == "edgetrain"}
    results: dict[str, dict] = {s.name: {"runs": []} for s in systems}
    for s in systems:
        if s.runtime == "edgetrain":       # a fresh EDGETRAIN_CACHE_DIR: compiles every kernel it needs
            cold = measure(s, model, inputs, python, steps=5, warmup=1, cache=caches[s.name])
            results[s.name]["cold"] = cold
            log(f"{model} {s.name} cold: " + (cold.get("error") or f"{cold['first_s']:.2f} s to the first step, "
                                              f"{cold['compiled']['misses']} compiled"))
    for r in range(args.rounds):
        order = systems[r % len(systems):] + systems[:r % len(systems)]
        for s in order:
            res = results[s.name]
            if "error" in res:
                continue                    # a system that failed once fails the same way again
            run = measure(s, model, inputs, python, args.steps, args.warmup, cache=caches.get(s.name))
            if "error" in run:
                res["error"] = run["error"]
                log(f"{model} round {r + 1} {s.name}: FAILED {run['error']}")
                continue
            res["runs"].append(run)
            log(f"{model} round {r + 1}/{args.rounds} {s.name}: {run['ms']:.3f} ms/step, "
                f"{run['peak_rss_mb']:.0f} MB, start {run['first_s']:.2f} s, loss {run['loss_last']:.6g}")
    if args.profile and "edgetrain" in results and "error" not in results["edgetrain"]:
        prof = measure(systems[0], model, inputs, python, 20, args.warmup, cache=caches["edgetrain"],
                       profile=args.profile)
        results["edgetrain"]["profile"] = prof.get("profile") or prof.get("error")
    return summarize(results)


def summarize(results: dict) -> dict:
    rows = {}
    for name, res in results.items():
        runs = res["runs"]
        row = {"error": res.get("error")} if not runs else {
            "ms": statistics.median(r["ms"] for r in runs), "p10": statistics.median(r["p10"] for r in runs),
            "p90": statistics.median(r["p90"] for r in runs), "ms_min": min(r["ms"] for r in runs),
            "ms_max": max(r["ms"] for r in runs), "rss": statistics.median(r["peak_rss_mb"] for r in runs),
            "import_rss": statistics.median(r["import_rss_mb"] for r in runs),
            "built_rss": statistics.median(r["built_rss_mb"] for r in runs),
            "start": statistics.median(r["first_s"] for r in runs), "loss_first": runs[0]["loss_first"],
            "loss_last": runs[0]["loss_last"], "steps": runs[0]["steps"], "n": len(runs),
            "error": res.get("error")}
        cold = res.get("cold")
        if cold is not None:
            row["cold"] = cold.get("first_s")
            row["cold_error"] = cold.get("error")
        if "profile" in res:
            row["profile"] = res["profile"]
        rows[name] = row
    return rows


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- report -----------------------------------------------------------------------------------------------------
def fmt_ratio(value, base) -> str:
    return f"{value / base:.2f}" if value is not None and base else "-"


def results_table(table: dict) -> list[str]:
    head = ("| model | system | ms/step | p10-p90 | process range | x ORT | peak RSS MB | x ORT | RSS MB: import, built "
            "| start s | cold start s | loss first | loss last |")
    lines = [head, "|" + "---|" * 13]
    for model, rows in table.items():
        base = rows.get(BASELINE, {})
        for name, row in rows.items():
            if "ms" not in row:
                lines.append(f"| {model} | {name} | failed: {row.get('error', '?').replace('|', '/')[:160]} |"
                             + " |" * 10)
                continue
            cold = f"{row['cold']:.2f}" if row.get("cold") is not None else "-"
            lines.append(
                f"| {model} | {name} | {row['ms']:.3f} | {row['p10']:.3f}-{row['p90']:.3f} | "
                f"{row['ms_min']:.3f}-{row['ms_max']:.3f} | {fmt_ratio(row['ms'], base.get('ms'))} | "
                f"{row['rss']:.0f} | {fmt_ratio(row['rss'], base.get('rss'))} | {row['import_rss']:.0f}, {row['built_rss']:.0f} | "
                f"{row['start']:.2f} | {cold} | "
                f"{row['loss_first']:.6f} | {row['loss_last']:.6g} |")
    return lines


def targets_table(table: dict) -> list[str]:
    head = ("| model | edgetrain / ORT ms/step (<= 0.8) | edgetrain / ORT peak RSS (<= 1) | warm start s (<= 1) "
            "| cold start s | met |")
    lines = [head, "|" + "---|" * 6]
    for model, rows in table.items():
        et, base = rows.get("edgetrain", {}), rows.get(BASELINE, {})
        if "ms" not in et or "ms" not in base:
            lines.append(f"| {model} | - | - | - | - | no baseline or no edgetrain run |")
            continue
        ms, rss = et["ms"] / base["ms"], et["rss"] / base["rss"]
        met = [k for k, ok in (("speed", ms <= 0.8), ("memory", rss <= 1), ("start", et["start"] <= 1)) if ok]
        cold = f"{et['cold']:.2f}" if et.get("cold") is not None else "-"
        lines.append(f"| {model} | {ms:.2f} | {rss:.2f} | {et['start']:.2f} | {cold} | "
                     f"{', '.join(met) or 'none'} |")
    return lines


def profile_lines(table: dict) -> list[str]:
    lines = []
    for model, rows in table.items():
        prof = rows.get("edgetrain", {}).get("profile")
        if not isinstance(prof, dict):
            continue
        calls = prof["calls_ms"]
        rest = prof["step_ms"] - sum(calls.values())
        top = ", ".join(f"{k} {v:.3f}" for k, v in list(calls.items())[:6])
        lines.append(f"- **{model}** ({prof['kernels']['train']} + {prof['kernels']['optimizer']} calls; "
                     f"{prof['step_ms']:.3f} ms/step with the timers, {rows['edgetrain']['ms']:.3f} without): "
                     f"{top}; outside kernel calls (API, feed copies, timers) {rest:.3f} ms")
    return lines


def loss_lines(table: dict) -> list[str]:
    lines = []
    for model, rows in table.items():
        ran = {n: r for n, r in rows.items() if "ms" in r}
        if BASELINE not in ran:
            continue
        base = ran[BASELINE]
        diffs = ", ".join(f"{n} {abs(r['loss_first'] - base['loss_first']):.1e} / "
                          f"{abs(r['loss_last'] - base['loss_last']):.1e}" for n, r in ran.items() if n != BASELINE)
        lines.append(f"- {model}: |loss - ORT's| at the first / last of {base['steps']} steps: {diffs}")
    return lines


def versions(python: dict) -> str:
    def ver(dist):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "not installed"
    ort = "unavailable"
    if "ort" in python:
        code = ("import importlib.metadata as m; "
                "print(m.version('onnxruntime-training-cpu'), m.version('onnx'), m.version('numpy'))")
        r = subprocess.run([python["ort"], "-c", code], check=False, capture_output=True, text=True)
        ort = "onnxruntime-training-cpu {} (onnx {}, numpy {})".format(*r.stdout.split()) if r.returncode == 0 \
            else "unknown"
    return (f"Python {platform.python_version()}; edgetrain {ver('edgetrain')}, numpy {ver('numpy')}, numba "
            f"{ver('numba')}, onnx {ver('onnx')}; torch {ver('torch')}; ORT venv: {ort}")


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{cpu}, {os.cpu_count()} logical CPUs, {mem:.0f} GiB, {platform.system()} {platform.release()}"


def write_results(path: Path, table: dict, args, python: dict, notes: list[str], started: str, minutes: float,
                  load: tuple) -> None:
    cmd = "python bench/train.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    run = (f"{args.rounds} processes per system and model, {args.steps} timed steps after {args.warmup} warm-up "
           "steps, 1 thread everywhere")
    text = [
        "# Training benchmark: edgetrain vs ONNX Runtime 1.19.2 vs PyTorch",
        "",
        f"- date: {started} ({minutes:.1f} min); load average at start / end: {load[0]:.2f} / {load[1]:.2f}",
        f"- machine: {machine()}",
        f"- versions: {versions(python)}",
        f"- command: `{cmd.strip()}` ({run})",
        f"- targets (reported, not asserted): {TARGETS}",
        "",
        "## Per system (ratios vs ORT 1.19.2 on its own artifacts, `ort`)",
        "",
        *results_table(table),
        "",
        "## Targets",
        "",
        *targets_table(table),
        "",
        "## Notes",
        "",
        *notes,
    ]
    path.write_text("\n".join(text) + "\n")


NOTES = """\
- Systems: `edgetrain` = edgetrain.api on edgetrain's own artifacts (`generate_artifacts` as the tests call it:
  CrossEntropyLoss, AdamW, labels `labels`); `edgetrain@ort` = edgetrain.api on ORT's artifacts
  (`../shared/ort_artifacts`); `ort` = ORT 1.19.2's training API on its own artifacts (torch blocked out of the
  process, `onnxruntime.training.api` imported without the package `__init__`, intra/inter-op threads 1);
  `ort@edgetrain` = ORT 1.19.2 on edgetrain's artifacts; `torch` = PyTorch eager `nn.Module`s written for the
  five architectures (same parameter names; weights loaded from ORT's checkpoint), `F.cross_entropy`,
  `torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0)`, 1 intra/inter-op thread.
  The torch modules are what a user writes, so this is the number a user gets; an ONNX->torch interpreter
  (tests/torch_ref.py) would add per-op Python dispatch that is not torch's.
- A step: `module.train(); loss = module(x, y); optimizer.step(); module.lazy_reset_grad()` (edgetrain, ORT);
  `zero_grad(); loss = cross_entropy(model(x), y); loss.backward(); optimizer.step()` (torch). One fixed batch
  (np.random.default_rng(0): x, then y; transformer tokens in [0, 100)), the same initial weights everywhere.
  The Modules are made without an eval model: only training is measured.
- ms/step: median over processes of each process's median step; p10-p90: the same for the in-process
  percentiles; process range: lowest and highest per-process median. Each process is fresh; systems run in a
  rotating order each round, so drifts in machine load spread over all of them.
- peak RSS: VmHWM of the worker (its own address space's peak resident set, read at the end); RSS import, built:
  VmRSS right after importing the system's packages (edgetrain.api / onnxruntime.training.api / torch), and
  with the model and optimizer built, before the first step (edgetrain imports Numba while building).
- start: process start (the parent's clock just before spawning) -> first step done, median over processes;
  for edgetrain this is with a warm kernel cache (the cold run filled it). cold start: edgetrain with an empty
  `EDGETRAIN_CACHE_DIR` (a fresh directory per artifacts set), so it includes compiling every kernel. The OS
  file cache is warm in both.
- loss: the loss returned by the first and the last step (computed before that step's update). ORT's AdamW is
  the Hugging Face form (eps added to sqrt(v) before bias correction); torch.optim.AdamW's form differs, so
  torch's last loss differs more than the others (ANCHORS.md: up to 4e-3 after 50 steps on mlp)."""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="*", default=MODELS, choices=MODELS)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--profile", type=int, default=100,
                    help="steps of per-kernel-call timing of edgetrain on its own artifacts (0: none)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 round of 20 steps, writes no file unless "
                    "--out is given")
    ap.add_argument("--out", type=Path, help="report file (default bench/RESULTS.md; --quick: none)")
    ap.add_argument("--json", type=Path, help="also write the summarized results as JSON here")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.steps, args.warmup, args.profile = 1, 20, 5, 10
    out = args.out or (None if args.quick else HERE / "RESULTS.md")

    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    t_start, load_start = time.time(), os.getloadavg()[0]
    python = {"edgetrain": sys.executable, "torch": sys.executable}
    systems = list(SYSTEMS)
    notes = []
    ort119 = load_ort119()
    try:
        python["ort"] = str(ort119.ensure())
    except ort119.Unavailable as e:
        systems = [s for s in systems if s.runtime != "ort"]
        notes.append(f"- ORT 1.19.2 is not available here ({e}): no baseline, no ratios.")
        log(f"ORT 1.19.2 unavailable: {e}")
    if importlib.util.find_spec("torch") is None:
        systems = [s for s in systems if s.runtime != "torch"]
        notes.append("- torch is not installed in this Python: no torch column.")

    table = {}
    with tempfile.TemporaryDirectory(prefix="edgetrain-bench-") as work:
        for model in args.models:
            inputs = prepare(model, Path(work))
            log(f"{model}: edgetrain's artifacts made in {inputs['generate_s']:.1f} s; initial weights differ "
                f"from ORT's checkpoint by at most {inputs['weights_diff']:.1e}")
            if inputs["weights_diff"]:
                notes.append(f"- {model}: edgetrain's checkpoint differs from ORT's by up to "
                             f"{inputs['weights_diff']:.1e}")
            table[model] = bench_model(model, systems, inputs, python, args)

    lines = results_table(table) + [""] + targets_table(table)
    print("\n".join(lines))
    found = loss_lines(table) + profile_lines(table)
    if args.json is not None:
        args.json.write_text(json.dumps({"systems": [s.name for s in systems], "table": table}, indent=1))
    if found:
        print("\n".join([""] + found))
    if out is not None:
        minutes = (time.time() - t_start) / 60
        extra = ["", "### Loss agreement (sanity)", "", *loss_lines(table)]
        prof = profile_lines(table)
        if prof:
            title = (f"### Where edgetrain's step goes (ms per step: medians over {args.profile} steps of each "
                     "step label's kernel calls in the training and optimizer programs, timed one call at a time)")
            extra += ["", title, "", *prof]
        write_results(out, table, args, python, [NOTES, *notes, *extra], started, minutes,
                      (load_start, os.getloadavg()[0]))
        log(f"wrote {out}")


if __name__ == "__main__":
    main()
