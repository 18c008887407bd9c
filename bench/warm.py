"""Warm start of the full package: the JIT with a warm Numba cache against the ahead-of-time kernel set that
``edgetrain warm`` builds (no Numba in the process), with ORT 1.19.2 as the baseline.

    python bench/warm.py [--models mlp cnn ...] [--rounds 3] [--steps 20] [--warmup 5] [--work DIR]

For each bench model, ORT's artifacts (../shared/ort_artifacts) on ``bench/train.py``'s fixed batch; each run is
a fresh process (``bench/train_worker.py``, 1 thread), the order rotating per round:

    jit-warm   edgetrain, EDGETRAIN_NO_AOT=1, Numba's disk cache filled by an earlier run
    aot-warm   edgetrain after ``edgetrain warm`` of all the models (at batch sizes 1 and the bench batch)
    ort        ORT 1.19.2 in its venv (tests/ort119.py)

Reports medians of process start -> first training step done, peak RSS (VmHWM) and ms/step, whether Numba was
imported, the ratios to ORT, the first JIT run (cold: empty caches) and the time ``edgetrain warm`` took.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import train      # bench/train.py (this script's folder is on sys.path)

SYSTEMS = ("jit-warm", "aot-warm", "ort")


def run(name: str, model: str, inputs: dict, python: dict, cache: Path, steps: int, warmup: int) -> dict:
    system = train.System("edgetrain@ort", "edgetrain" if name != "ort" else "ort", "ort")
    saved = os.environ.pop("EDGETRAIN_NO_AOT", None)
    if name == "jit-warm":
        os.environ["EDGETRAIN_NO_AOT"] = "1"
    try:
        out = train.measure(system, model, inputs, python, steps, warmup, cache=cache if name != "ort" else None)
    finally:
        os.environ.pop("EDGETRAIN_NO_AOT", None)
        if saved is not None:
            os.environ["EDGETRAIN_NO_AOT"] = saved
    if "error" in out:
        raise SystemExit(f"{name} {model}: {out['error']}")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=list(train.BATCH))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--work", type=Path, default=None)
    args = p.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="edgetrain-warm-bench-"))
    cache = work / "cache"
    python = {"edgetrain": sys.executable, "ort": str(train.load_ort119().ensure())}
    inputs = {m: train.prepare(m, work / "inputs") for m in args.models}
    from edgetrain.minimal_build.warm import compile_bytecode
    compile_bytecode()        # as bench/train.py: the .pyc files a pip-installed package has
    cold = {}
    for m in args.models:     # fills Numba's disk cache (the jit-warm condition)
        cold[m] = run("jit-warm", m, inputs[m], python, cache, 1, 1)["first_s"]
        train.log(f"{m}: cold JIT start {cold[m]:.2f} s")
    sizes = sorted({1} | {train.BATCH[m][0] for m in args.models})
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "edgetrain", "warm", *(str(inputs[m]["ort"]) for m in args.models),
                    "--batch-size", *map(str, sizes)], check=True, env=dict(os.environ, EDGETRAIN_CACHE_DIR=str(cache)))
    warm_build_s = time.perf_counter() - t
    results = {m: {s: [] for s in SYSTEMS} for m in args.models}
    for r in range(args.rounds):
        for m in args.models:
            order = SYSTEMS[r % 3:] + SYSTEMS[:r % 3]
            for s in order:
                out = run(s, m, inputs[m], python, cache, args.steps, args.warmup)
                results[m][s].append(out)
                train.log(f"round {r + 1} {m} {s}: start {out['first_s']:.3f} s, {out['peak_rss_mb']:.0f} MB, "
                          f"{out['ms']:.3f} ms/step, numba {out.get('numba_imported', '-')}")
    med = statistics.median
    print(f"edgetrain warm of {len(args.models)} models at batch sizes {sizes}: {warm_build_s:.1f} s")
    print("| model | system | start -> 1st step s | x ORT | peak RSS MB | x ORT | ms/step | numba imported | "
          "cold JIT start s | loss first |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m in args.models:
        base = results[m]["ort"]
        b_start, b_rss = med(x["first_s"] for x in base), med(x["peak_rss_mb"] for x in base)
        for s in SYSTEMS:
            rs = results[m][s]
            start, rss = med(x["first_s"] for x in rs), med(x["peak_rss_mb"] for x in rs)
            cold_s = f"{cold[m]:.2f}" if s == "jit-warm" else ""
            print(f"| {m} | {s} | {start:.3f} | {start / b_start:.2f} | {rss:.0f} | {rss / b_rss:.2f} | "
                  f"{med(x['ms'] for x in rs):.3f} | {rs[0].get('numba_imported', '-')} | {cold_s} | "
                  f"{rs[0]['loss_first']:.6f} |")
    (work / "warm_results.json").write_text(json.dumps({"results": results, "cold": cold,
                                                         "warm_build_s": warm_build_s}, indent=1))
    print(f"raw results: {work / 'warm_results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
