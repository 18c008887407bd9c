"""Training side by side: edgetrain, ONNX Runtime 1.19.2 (training) and PyTorch, 1 thread, same batch and weights.

    python bench/train.py [--models mlp cnn ...] [--rounds 5] [--steps 200] [--warmup 20] [--quick]
    python bench/train.py --workloads [gpt resnet18 ...] [--threads 1 2] [--tiny] ...

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

``--workloads`` measures bench/workloads.py's realistic jobs instead (built and exported here, each with
ORT 1.19.2's ``generate_artifacts`` run in its venv for ``ort``): systems edgetrain, ort and torch, and with
``--threads 1 2`` also ``edgetrain x2`` and ``ort x2`` (ratios of an N-thread row are to ``ort`` at N threads).
A workload edgetrain or ORT cannot make artifacts for is reported as ``refused: <reason>``. Their table goes
to its own section of bench/RESULTS.md, which a run over the bench models keeps (and the other way round).
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

import workloads      # bench/workloads.py (this script's folder is on sys.path)

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = Path(os.environ.get("EDGETRAIN_SHARED", REPO.parent / "shared"))
WORKER = HERE / "train_worker.py"
MODELS = ["mlp", "cnn", "digits", "transformer", "mobilenet"]
WORKLOADS = workloads.NAMES
# ANCHORS.md: batch per model; fixed_batch draws x then y from np.random.default_rng(0)
BATCH = {"mlp": (64, 784), "cnn": (32, 1, 28, 28), "digits": (32, 64), "transformer": (8, 32),
         "mobilenet": (16, 3, 32, 32)}
CLASSES = {"transformer": 4}          # the others have 10
TOKENS = {"transformer": 100}         # integer inputs: token ids must be valid rows of the embedding
TARGETS = ("edgetrain ms/step <= 0.8x ORT at 1 and 2 threads (digits <= 0.6x), peak RSS <= 1.2x ORT (warm full "
           "package, default flow: the automatic warm set; bench/warm.py compares it with the JIT-warm process, "
           "bench/trimmed.py the trimmed runtime: <= 0.6x), "
           "warm start <= ORT's, cold start <= 5 s (issue 14)")
SPEED_TARGET = {"digits": 0.6}      # the others: 0.8


@dataclass(frozen=True)
class System:
    name: str
    runtime: str        # edgetrain | ort | torch
    artifacts: str      # edgetrain | ort | weights
    threads: int = 1


SYSTEMS = [System("edgetrain", "edgetrain", "edgetrain"), System("edgetrain@ort", "edgetrain", "ort"),
           System("ort", "ort", "ort"), System("ort@edgetrain", "ort", "edgetrain"),
           System("torch", "torch", "weights")]
BASELINE = "ort"
WORKLOAD_SYSTEMS = [System("edgetrain", "edgetrain", "edgetrain"), System("ort", "ort", "ort"),
                    System("torch", "torch", "weights")]
SECTION = ("<!-- workloads: bench/train.py --workloads writes from here -->",
           "<!-- end of workloads -->")


def with_threads(systems: list[System], counts: list[int]) -> list[System]:
    """The 1-thread systems, then edgetrain and ORT again at each other thread count (torch stays at 1)."""
    out = list(systems) if 1 in counts else [s for s in systems if s.runtime == "torch"]
    for n in (c for c in counts if c != 1):
        out += [System(f"{s.name} x{n}", s.runtime, s.artifacts, n) for s in systems if s.runtime != "torch"]
    return out


def baseline_of(name: str) -> str:
    """The row an N-thread row's ratios are to: ORT on its own artifacts at the same thread count."""
    suffix = name.partition(" ")[2]
    return f"{BASELINE} {suffix}" if suffix else BASELINE


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


def worker_env(threads: int = 1) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    n = str(threads)
    env.update(OMP_NUM_THREADS=n, OPENBLAS_NUM_THREADS=n, MKL_NUM_THREADS=n, EDGETRAIN_NUM_THREADS=n)
    return env


def prepare_workload(name: str, work: Path, tiny: bool, ort119) -> dict:
    """A workload's inputs on disk: its ONNX export, the batch, edgetrain's artifacts and ORT 1.19.2's (each
    ``refused`` with the reason if that system cannot make them)."""
    import onnx

    from edgetrain import artifacts
    folder = work / name
    folder.mkdir(parents=True)
    w = workloads.build(name, tiny=tiny)
    model = folder / "model.onnx"
    workloads.export(w, model)
    np.savez(folder / "batch.npz", x=w.x, y=w.y)
    trainable, frozen = workloads.params(w, [i.name for i in onnx.load(str(model)).graph.initializer])
    inputs = {"batch": folder / "batch.npz", "edgetrain": folder / "edgetrain_artifacts",
              "ort": folder / "ort_artifacts", "weights": model, "caches": folder, "refused": {},
              "workload": name, "tiny": tiny, "weights_diff": 0.0}
    t = time.perf_counter()
    try:
        artifacts.generate_artifacts(str(model), requires_grad=trainable, frozen_params=frozen,
                                     loss=artifacts.LossType[w.loss], optimizer=artifacts.OptimType.AdamW,
                                     artifact_directory=inputs["edgetrain"])
    except Exception as e:        # noqa: BLE001 - the refusal is the result (e.g. an op edgetrain lacks)
        inputs["refused"]["edgetrain"] = f"{type(e).__name__}: {e}"
    inputs["generate_s"] = time.perf_counter() - t
    inputs["ort"].mkdir()
    try:
        ort119.run(ORT_GENERATE, {"model": str(ort_ready(model, folder)), "dir": str(inputs["ort"]),
                                  "params": trainable, "frozen": frozen, "loss": w.loss}, timeout=900)
    except RuntimeError as e:
        lines = [ln for ln in str(e).splitlines() if ln.strip()]
        inputs["refused"]["ort"] = lines[-1] if lines else str(e)
    return inputs


# ORT 1.19.2's generate_artifacts in its venv (ANCHORS.md: no torch there; the tools package asks importlib)
ORT_GENERATE = r'''
import onnx
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_NoTorch"]
from onnxruntime.training import artifacts
artifacts.generate_artifacts(onnx.load(ARGS["model"]), requires_grad=ARGS["params"], frozen_params=ARGS["frozen"],
                             loss=getattr(artifacts.LossType, ARGS["loss"]), optimizer=artifacts.OptimType.AdamW,
                             artifact_directory=ARGS["dir"])
'''


def ort_ready(model: Path, folder: Path) -> Path:
    """The export as ORT's gradient builder needs it (ANCHORS.md): LayerNormalization with its optional Mean and
    InvStdDev outputs named. edgetrain trains the export as it is."""
    import onnx
    proto = onnx.load(str(model))
    changed = False
    for k, node in enumerate(proto.graph.node):
        if node.op_type == "LayerNormalization" and len(node.output) == 1:
            node.output.extend([f"ort_ln{k}_mean", f"ort_ln{k}_inv_std"])
            changed = True
    if not changed:
        return model
    onnx.save(proto, str(folder / "model_for_ort.onnx"))
    return folder / "model_for_ort.onnx"


def measure(system: System, model: str, inputs: dict, python: dict, steps: int, warmup: int,
            cache: Path | None = None, profile: int = 0) -> dict:
    """One fresh worker process; its JSON result, or {"error": ...} if it failed."""
    spec = {"system": system.runtime, "model": model, "source": str(inputs[system.artifacts]),
            "batch": str(inputs["batch"]), "steps": steps, "warmup": warmup, "profile": profile,
            "threads": system.threads, "workload": inputs.get("workload"), "tiny": inputs.get("tiny", False)}
    env = worker_env(system.threads)
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
        last = lines[-1] if lines else "(no message)"
        # ORT prefixes its message with the C++ source location and signature: keep what it says
        last = "ORT: " + last.split("[ONNXRuntimeError] :", 1)[1].strip() if "[ONNXRuntimeError] :" in last else last
        return {"error": f"exit {out.returncode}: {last}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def bench_model(model: str, systems: list[System], inputs: dict, python: dict, args) -> dict:
    """Cold starts first (empty kernel caches), then ``rounds`` rounds over all systems, rotating the order."""
    # one kernel cache per artifacts set, shared across thread counts (threads change no kernel)
    caches = {s.name: inputs["caches"] / f"cache-{s.artifacts}" for s in systems if s.runtime == "edgetrain"}
    results: dict[str, dict] = {s.name: {"runs": []} for s in systems}
    for s in systems:
        refused = inputs.get("refused", {}).get(s.artifacts)
        if refused:
            results[s.name]["error"] = f"refused: {refused}"
            log(f"{model} {s.name}: refused: {refused}")
    for s in systems:
        if s.runtime == "edgetrain" and s.threads == 1 and "error" not in results[s.name]:
            # a fresh EDGETRAIN_CACHE_DIR: compiles every kernel it needs
            cold = measure(s, model, inputs, python, steps=5, warmup=1, cache=caches[s.name])
            results[s.name]["cold"] = cold
            log(f"{model} {s.name} cold: " + (cold.get("error") or f"{cold['first_s']:.2f} s to the first step, "
                                              + cold_compiles(cold["compiled"])))
            # the default flow: the cold run started the warm set's build on its way out; the timed runs come
            # after it, as a user's later processes would (while it runs, it would share the cores with them)
            results[s.name]["autowarm"] = autowarm_build(caches[s.name])
            log(f"{model} {s.name} automatic warm set: {autowarm_text(results[s.name]['autowarm'])}")
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
            run["round"] = r
            res["runs"].append(run)
            log(f"{model} round {r + 1}/{args.rounds} {s.name}: {run['ms']:.3f} ms/step, "
                f"{run['peak_rss_mb']:.0f} MB, start {run['first_s']:.2f} s, loss {run['loss_last']:.6g}")
    # per-kernel breakdown of edgetrain on its own artifacts at every thread count (which split kernels gain)
    for own in systems if args.profile else []:
        if own.runtime == own.artifacts == "edgetrain" and "error" not in results[own.name]:
            prof = measure(own, model, inputs, python, min(args.steps, 20), min(args.warmup, 5),
                           cache=caches[own.name], profile=args.profile)
            results[own.name]["profile"] = prof.get("profile") or prof.get("error")
    return summarize(results)


def cold_compiles(stats: dict) -> str:
    """A cold run's kernel signatures: compiled in its process (Numba's misses) and by the compile helper
    (edgetrain/codegen/parallel_compile.py), which the process then loads from the cache (its hits: the cache
    was empty when it started, so every entry it loads was written during its run)."""
    return (f"{stats['misses'] + stats['hits']} compiled ({stats['misses']} in the process, {stats['hits']} by "
            "the compile helper)")


def autowarm_build(cache: Path, appear_s: float = 30, timeout_s: float = 1800) -> dict:
    """Wait for the automatic warm-set build a cold run started in ``cache`` (minimal_build/autowarm.py); its
    status: state done / failed (with seconds, error) or none (with why)."""
    from edgetrain.minimal_build import autowarm

    why = ("EDGETRAIN_NO_AUTOWARM is set" if os.environ.get(autowarm.OPT_OUT, "") not in ("", "0")
           else autowarm.compiler_missing())
    if why:
        return {"state": "none", "why": why}
    path, t0 = cache / "aot" / autowarm.STATUS, time.monotonic()
    while True:
        status = autowarm.read_status(path)
        waited = time.monotonic() - t0
        if status is not None and status.get("state") != "running":
            return status
        if status is not None and not _alive(status.get("pid")):
            status = autowarm.read_status(path)          # it may have written its end and exited since
            return status if status and status.get("state") != "running" else {
                "state": "none", "why": "the build's process died"}
        if status is None and waited > appear_s:
            return {"state": "none", "why": f"no build started within {appear_s:.0f} s of the cold run"}
        if waited > timeout_s:
            return {"state": "none", "why": f"still building after {timeout_s:.0f} s"}
        time.sleep(0.5)


def _alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except (OSError, TypeError, ValueError):
        return False
    return True


def autowarm_text(status: dict | None) -> str:
    if not status:
        return "-"
    if status["state"] == "done":
        return f"built in {status['seconds']:.0f} s"
    if status["state"] == "failed":
        return f"failed after {status.get('seconds', 0):.0f} s: {str(status.get('error'))[-120:]}"
    return f"none: {status.get('why')}"


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
            "by_round": {r["round"]: r["ms"] for r in runs}, "error": res.get("error")}
        cold = res.get("cold")
        if cold is not None:
            row["cold"] = cold.get("first_s")
            row["cold_error"] = cold.get("error")
        if "autowarm" in res:
            row["autowarm"] = res["autowarm"]
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
        for name, row in rows.items():
            base = rows.get(baseline_of(name), {})
            if "ms" not in row:
                lines.append(f"| {model} | {name} | failed: {row.get('error', '?').replace('|', '/')[:240]} |"
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


def paired_ratios(et: dict, base: dict) -> list[float]:
    """edgetrain's ms/step over ORT's in each round both ran in (the two processes minutes apart at most, so a
    drift in the machine's speed that moves the medians moves both)."""
    ours, theirs = et.get("by_round", {}), base.get("by_round", {})
    return sorted(ours[r] / theirs[r] for r in ours if r in theirs)


def targets_table(table: dict) -> list[str]:
    head = ("| model | edgetrain / ORT ms/step (<= 0.8; digits <= 0.6) | same round: median (range) "
            "| edgetrain / ORT peak RSS (<= 1.2) | edgetrain / ORT start (<= 1) | cold start s (<= 5) "
            "| automatic warm set (after the cold run) | met |")
    lines = [head, "|" + "---|" * 8]
    for model, rows in table.items():
        for name in [n for n in rows if n.partition(" ")[0] == "edgetrain"]:
            et, base = rows[name], rows.get(baseline_of(name), {})
            label = model + name[len("edgetrain"):]
            if "ms" not in et or "ms" not in base:
                why = et.get("error") or base.get("error") or "no baseline or no edgetrain run"
                lines.append(f"| {label} | - | - | - | - | - | - | {why.replace('|', '/')[:240]} |")
                continue
            ms, rss, start = et["ms"] / base["ms"], et["rss"] / base["rss"], et["start"] / base["start"]
            cold = et.get("cold")
            met = [k for k, ok in (("speed", ms <= SPEED_TARGET.get(model, 0.8)), ("memory", rss <= 1.2),
                                   ("start", start <= 1), ("cold", cold is not None and cold <= 5)) if ok]
            cold_s = f"{cold:.2f}" if cold is not None else "-"
            auto = autowarm_text(et.get("autowarm") or rows.get(name.partition(" ")[0], {}).get("autowarm"))
            paired = paired_ratios(et, base)
            same_round = "-" if not paired else \
                f"{statistics.median(paired):.2f} ({paired[0]:.2f}-{paired[-1]:.2f})"
            lines.append(f"| {label} | {ms:.2f} | {same_round} | {rss:.2f} | {start:.2f} | {cold_s} | "
                         f"{auto.replace('|', '/')} | "
                         f"{', '.join(met) or 'none'} |")
    return lines


def profile_lines(table: dict) -> list[str]:
    lines = []
    for (model, rows), name in ((mr, name) for mr in table.items() for name in mr[1]):
        prof = rows[name].get("profile") if isinstance(rows[name], dict) else None
        if not isinstance(prof, dict):
            continue
        by_op = prof["by_op"]
        total = prof["kernel_ms"] or 1.0
        top = ", ".join(f"{k} {v:.3f} ({100 * v / total:.0f}%)" for k, v in list(by_op.items())[:8])
        rest = prof["step_ms"] - prof["kernel_ms"]
        title = model if name == "edgetrain" else f"{model} {name.partition(' ')[2]}"
        lines.append(f"- **{title}** ({prof['kernels'].get('train', 0)} + {prof['kernels'].get('optimizer', 0)} "
                     f"calls; kernels timed alone {prof['kernel_ms']:.3f} ms of a {prof['step_ms']:.3f} ms step, "
                     f"{rows[name]['ms']:.3f} in the timed runs): {top}; outside kernel calls (API, "
                     f"feed copies, caches cooled by the other calls) {rest:.3f} ms")
    return lines


def loss_lines(table: dict) -> list[str]:
    lines = []
    for model, rows in table.items():
        ran = {n: r for n, r in rows.items() if "ms" in r and " " not in n}     # threads change no loss
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
           f"steps, threads {' and '.join(map(str, args.threads))} (torch 1)")
    if args.workloads is not None:
        write_section(path, workload_section(table, args, python, notes, started, minutes, load, cmd, run))
        return
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
    kept = kept_section(path)
    path.write_text("\n".join(text) + "\n" + (f"\n{kept}\n" if kept else ""))


def kept_section(path: Path) -> str:
    """The workloads section of an existing report (markers included), or ''."""
    text = path.read_text() if path.exists() else ""
    start, end = text.find(SECTION[0]), text.find(SECTION[1])
    return text[start:end + len(SECTION[1])] if 0 <= start < end else ""


def write_section(path: Path, lines: list[str]) -> None:
    """Put the workloads section into ``path`` in place of the one there, or after the rest."""
    block = "\n".join([SECTION[0], *lines, SECTION[1]])
    text = path.read_text() if path.exists() else ""
    kept = kept_section(path)
    text = text.replace(kept, block) if kept else (text.rstrip("\n") + "\n\n" if text else "") + block
    path.write_text(text.rstrip("\n") + "\n")


def workload_section(table, args, python, notes, started, minutes, load, cmd, run) -> list[str]:
    return [
        "",
        "# Realistic workloads (issue 14, item 4): edgetrain vs ONNX Runtime 1.19.2 vs PyTorch",
        "",
        f"- date: {started} ({minutes:.1f} min); load average at start / end: {load[0]:.2f} / {load[1]:.2f}",
        f"- machine: {machine()}",
        f"- versions: {versions(python)}",
        f"- command: `{cmd.strip()}` ({run})",
        "- **caveat**: few processes and steps per row, on a shared 2-core machine (the load averages above): "
        "absolute times are noisy; the ratios come from the same rotating rounds.",
        f"- targets (reported, not asserted): {TARGETS}",
        "",
        "## Workloads per system (ratios vs ORT 1.19.2 on its own artifacts at the same thread count)",
        "",
        *results_table(table),
        "",
        "## Workload targets",
        "",
        *targets_table(table),
        "",
        "## Workload notes",
        "",
        *notes,
    ]


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
  rotating order each round, so drifts in machine load spread over all of them. Targets' "same round": the
  ratio of edgetrain's and ORT's processes in each round, median and range over rounds (its spread is how far
  one pair of processes can be trusted on this machine).
- peak RSS: VmHWM of the worker (its own address space's peak resident set, read at the end); RSS import, built:
  VmRSS right after importing the system's packages (edgetrain.api / onnxruntime.training.api / torch), and
  with the model and optimizer built, before the first step (edgetrain imports Numba while building).
- start: process start (the parent's clock just before spawning) -> first step done, median over processes;
  for edgetrain this is the default flow's warm start: the cold run filled Numba's cache and, on its way out,
  started the automatic warm set's build (minimal_build/autowarm.py), which the timed runs wait for (its time
  is the targets table's "automatic warm set" column); they then load it and import no Numba.
  cold start: edgetrain with an empty `EDGETRAIN_CACHE_DIR` (a fresh directory per artifacts set), so it
  includes compiling every kernel. The OS file cache is warm in both.
- loss: the loss returned by the first and the last step (computed before that step's update). ORT's AdamW is
  the Hugging Face form (eps added to sqrt(v) before bias correction); torch.optim.AdamW's form differs, so
  torch's last loss differs more than the others (ANCHORS.md: up to 4e-3 after 50 steps on mlp)."""


WORKLOAD_NOTES = """\
- Workloads: bench/workloads.py builds each in torch (seed 0; BatchNorm statistics drawn as a trained network
  has them), exports it with torch's TorchScript exporter (opset 17, each module in its own mode: a frozen
  backbone's BatchNorm in inference mode), and both edgetrain's and ORT 1.19.2's `generate_artifacts` make
  artifacts from that file (trainable: the parameters that require a gradient; frozen: the other float
  initializers; loss CrossEntropyLoss, or MSELoss for the autoencoder; AdamW). ORT gets the export with
  LayerNormalization's Mean/InvStdDev outputs named (its gradient needs them, ANCHORS.md). `torch` trains the
  same module (same weights) with `torch.optim.AdamW` over the parameters that require a gradient.
- `refused: <reason>`: the system could not make artifacts for the workload (the reason is its own error).
- ORT 1.19.2's `generate_artifacts` turns every BatchNormalization of the training model into training mode
  (`BatchNormInternal`, training_mode=1), also those exported in inference mode: on `mobilenetv2_*` ORT's frozen
  backbone normalises with batch statistics and updates its running statistics, so its loss differs from
  edgetrain's and torch's (which keep the export's mode) and its step does that extra work.
- `x2` rows: edgetrain with EDGETRAIN_NUM_THREADS=2 (its intra-op pool, BLAS at one thread), ORT with intra_op_num_threads=2;
  their ratios are to `ort x2`. The edgetrain x2 rows share the 1-thread rows' kernel cache (no cold start).
- The protocol is the bench models' (below): fresh processes, rotating order, the same fixed batch everywhere,
  ms/step = median over processes of each process's median step, peak RSS = VmHWM, start = process start ->
  first step done (after the automatic warm set the cold run started was built), cold start = empty kernel cache.
- The per-kernel breakdown comes from `edgetrain.profiling.profile_artifacts(..., measure_memory=False)` run in
  its own worker: each kernel call of the training and optimizer programs timed alone, summed by step label."""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="*", choices=MODELS, help="bench models (default: all five, or none with "
                    "--workloads)")
    ap.add_argument("--workloads", nargs="*", choices=WORKLOADS, help="measure bench/workloads.py's jobs (no "
                    "names: all)")
    ap.add_argument("--tiny", action="store_true", help="the workloads at their test size (smoke runs)")
    ap.add_argument("--threads", nargs="+", type=int, default=[1], help="thread counts for edgetrain and ORT "
                    "(e.g. 1 2; torch always 1)")
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
    if args.workloads is not None and not args.workloads:
        args.workloads = list(WORKLOADS)
    if args.models is None:
        args.models = [] if args.workloads is not None else list(MODELS)
    if args.workloads is not None and args.models:
        ap.error("--models and --workloads write different report sections: run them one at a time")
    if args.quick:
        args.rounds, args.steps, args.warmup, args.profile = 1, 20, 5, 10
    out = args.out or (None if args.quick else HERE / "RESULTS.md")

    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    t_start, load_start = time.time(), os.getloadavg()[0]
    python = {"edgetrain": sys.executable, "torch": sys.executable}
    systems = with_threads(WORKLOAD_SYSTEMS if args.workloads is not None else SYSTEMS, args.threads)
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

    # edgetrain's .pyc files, as pip writes them for an installed wheel (and ORT's venv has them): an editable
    # install run with PYTHONDONTWRITEBYTECODE would compile its modules from source in every worker
    from edgetrain.minimal_build.warm import compile_bytecode
    compile_bytecode()
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
        for name in args.workloads or []:
            inputs = prepare_workload(name, Path(work), args.tiny, ort119)
            log(f"{name}: exported; edgetrain's artifacts in {inputs['generate_s']:.1f} s; refused: "
                f"{inputs['refused'] or 'nothing'}")
            table[name] = bench_model(name, systems, inputs, python, args)

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
        base = WORKLOAD_NOTES if args.workloads is not None else NOTES
        write_results(out, table, args, python, [base, *notes, *extra], started, minutes,
                      (load_start, os.getloadavg()[0]))
        log(f"wrote {out}")


if __name__ == "__main__":
    main()
