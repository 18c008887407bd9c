"""The trimmed runtime (``edgetrain reduce``, ahead-of-time kernels) against the full package (JIT, warm cache).

    python bench/trimmed.py [--models mlp cnn ...] [--rounds 3] [--steps 200] [--warmup 20] [--work DIR]

Builds one trimmed runtime for ORT's artifacts of every bench model (../shared/ort_artifacts, compacted to
.etm), installs its wheel into a folder and measures, each in a fresh process, alternating the order:

    full      the full package (numba JIT with a warm kernel cache) on the ONNX artifacts
    trimmed   the installed trimmed package on the compact artifacts, in ``python -S`` with numba, llvmlite,
              onnx, protobuf and psutil imports blocked

Reports size on disk (each package with its dependency closure), ``import edgetrain.api`` time and RSS,
process start -> first training step done, ms per step (median) and peak RSS (VmHWM) while training; and the
first/last loss of both, which must agree. ORT 1.19.2's peak RSS is quoted from ANCHORS.md.
"""
from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SHARED = Path(os.environ.get("EDGETRAIN_SHARED", REPO.parent / "shared"))
MODELS = ["mlp", "cnn", "digits", "transformer", "mobilenet"]
BATCH = {"mlp": (64, 784), "cnn": (32, 1, 28, 28), "digits": (32, 64), "transformer": (8, 32),
         "mobilenet": (16, 3, 32, 32)}
CLASSES = {"transformer": 4}
TOKENS = {"transformer": 100}
ORT_PEAK_RSS_MB = {"mlp": 86, "cnn": 85, "digits": 81, "transformer": 85, "mobilenet": 87}   # ANCHORS.md

WORKER = r"""
import json, os, sys, time
t_start = float(sys.argv[1]); spec = json.loads(sys.argv[2])
t0 = time.perf_counter()
import numpy as np
def rss_mb():
    with open("/proc/self/status") as f:
        return {l.split(":")[0]: int(l.split()[1]) / 1024 for l in f if l.startswith(("VmRSS", "VmHWM"))}
base = rss_mb()["VmRSS"]
t1 = time.perf_counter()
from edgetrain.api import CheckpointState, Module, Optimizer
t2 = time.perf_counter()
imported = rss_mb()["VmRSS"]
src, ext = spec["source"], spec["ext"]
rng = np.random.default_rng(0)
shape = tuple(spec["shape"])
x = rng.integers(0, spec["tokens"], shape, dtype=np.int64) if spec["tokens"] else rng.standard_normal(shape, dtype=np.float32)
y = rng.integers(0, spec["classes"], (shape[0],), dtype=np.int64)
state = CheckpointState.load_checkpoint(os.path.join(src, "checkpoint"))
module = Module(os.path.join(src, "training_model" + ext), state)
optimizer = Optimizer(os.path.join(src, "optimizer_model" + ext), module)
def step():
    module.train(); loss = module(x, y); optimizer.step(); module.lazy_reset_grad(); return float(loss)
first = step()
first_s = time.time() - t_start
for _ in range(spec["warmup"]):
    step()
times = []
for _ in range(spec["steps"]):
    s = time.perf_counter(); last = step(); times.append(time.perf_counter() - s)
times.sort()
mods = sorted({m.split(".")[0] for m in sys.modules} & {"numba", "llvmlite", "onnx", "google", "psutil"})
print(json.dumps({"import_s": t2 - t1, "import_rss_mb": imported, "python_numpy_rss_mb": base,
                  "first_s": first_s, "ms_per_step": 1e3 * times[len(times) // 2],
                  "peak_rss_mb": rss_mb()["VmHWM"], "first_loss": first, "last_loss": last, "modules": mods}))
"""

BLOCK = """
import sys
sys.path[:0] = {paths!r}
class _Blocker:
    def find_spec(self, name, path=None, target=None):
        if any(name == b or name.startswith(b + ".") for b in {blocked!r}):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, _Blocker())
"""


def dist_closure(names: list[str]) -> set[str]:
    """The distributions ``names`` need, recursively (no extras)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = re.split(r"[\s;<>=!~\[(]", todo.pop(), maxsplit=1)[0].lower().replace("_", "-")
        if name in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen.add(name)
        todo += [r for r in (dist.requires or []) if "extra ==" not in r]
    return seen


def dist_bytes(name: str) -> int:
    dist = md.distribution(name)
    total = 0
    for f in dist.files or []:
        p = Path(dist.locate_file(f))
        if p.is_file() and "__pycache__" not in p.parts:
            total += p.stat().st_size
    return total


def tree_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def sizes(site: Path) -> dict:
    """Bytes on disk: the full package (its source folders: it is installed editable) plus the closure of its
    dependencies, against the installed trimmed package plus numpy and flatbuffers' closure."""
    full_deps = dist_closure([r for r in md.distribution("edgetrain").requires or [] if "extra ==" not in r])
    full_own = sum(tree_bytes(REPO / d) for d in ("edgetrain", "kernels", "minimal_build"))
    trimmed_deps = dist_closure(["numpy", "flatbuffers"])
    trimmed_own = tree_bytes(site / "edgetrain")
    return {"full_mb": (full_own + sum(map(dist_bytes, full_deps))) / 1e6, "full_deps": sorted(full_deps),
            "full_own_mb": full_own / 1e6,
            "trimmed_mb": (trimmed_own + sum(map(dist_bytes, trimmed_deps))) / 1e6,
            "trimmed_deps": sorted(trimmed_deps), "trimmed_own_mb": trimmed_own / 1e6}


def run(kind: str, model: str, art: dict, site: Path, cache: Path, steps: int, warmup: int) -> dict:
    import flatbuffers
    import numpy as np
    spec = {"source": str(art[kind][model]), "ext": ".etm" if kind == "trimmed" else ".onnx",
            "shape": BATCH[model], "tokens": TOKENS.get(model, 0), "classes": CLASSES.get(model, 10),
            "steps": steps, "warmup": warmup}
    env = dict(os.environ, EDGETRAIN_CACHE_DIR=str(cache), EDGETRAIN_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    if kind == "trimmed":
        sites = sorted({str(Path(m.__file__).resolve().parents[1]) for m in (np, flatbuffers)})
        code = BLOCK.format(paths=[str(site)] + sites,
                            blocked=("numba", "llvmlite", "onnx", "google.protobuf", "psutil")) + WORKER
        cmd = [sys.executable, "-S", "-c", code]
    else:
        cmd = [sys.executable, "-c", WORKER]
    t = time.time()
    out = subprocess.run(cmd + [repr(t), json.dumps(spec)], capture_output=True, text=True, env=env,
                         check=False)
    if out.returncode != 0:
        raise SystemExit(f"{kind} {model} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=MODELS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--work", type=Path, default=None, help="keep the build here (default: a temporary folder)")
    args = p.parse_args()
    from edgetrain.minimal_build.reduce import compact_artifacts
    from edgetrain.minimal_build.runtime import build

    work = args.work or Path(tempfile.mkdtemp(prefix="edgetrain-trimmed-bench-"))
    ort = {m: SHARED / "ort_artifacts" / m for m in args.models}
    compact = {}
    for m, folder in ort.items():
        compact[m] = work / "artifacts" / m
        compact_artifacts(folder, compact[m])
    t = time.perf_counter()
    b = build(list(ort.values()), work / "out", log=lambda s: print(s, file=sys.stderr))
    build_s = time.perf_counter() - t
    site = work / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(site),
                    str(b.wheel)], check=True)
    cache = work / "cache"
    art = {"full": ort, "trimmed": compact}
    for m in args.models:       # warm the full package's kernel cache
        run("full", m, art, site, cache, 1, 0)
    results: dict = {m: {"full": [], "trimmed": []} for m in args.models}
    for r in range(args.rounds):
        for m in args.models:
            for kind in (("full", "trimmed") if r % 2 == 0 else ("trimmed", "full")):
                results[m][kind].append(run(kind, m, art, site, cache, args.steps, args.warmup))
    size = sizes(site)
    print(f"build: {build_s:.1f} s; {b.summary()}")
    print(f"size on disk: full {size['full_mb']:.1f} MB (own {size['full_own_mb']:.1f} MB + "
          f"{', '.join(size['full_deps'])}); trimmed {size['trimmed_mb']:.1f} MB (own {size['trimmed_own_mb']:.2f} "
          f"MB + {', '.join(size['trimmed_deps'])})")
    med = statistics.median
    head = (f"{'model':12s} {'':8s} {'import s':>9s} {'import MB':>10s} {'start->1st s':>13s} {'ms/step':>8s} "
            f"{'peak MB':>8s} {'ORT peak':>9s}  loss first/last")
    print(head)
    for m in args.models:
        for kind in ("full", "trimmed"):
            rs = results[m][kind]
            print(f"{m:12s} {kind:8s} {med(x['import_s'] for x in rs):9.3f} {med(x['import_rss_mb'] for x in rs):10.1f} "
                  f"{med(x['first_s'] for x in rs):13.3f} {med(x['ms_per_step'] for x in rs):8.3f} "
                  f"{med(x['peak_rss_mb'] for x in rs):8.1f} {ORT_PEAK_RSS_MB.get(m, float('nan')):9.0f}  "
                  f"{rs[0]['first_loss']:.6f}/{rs[0]['last_loss']:.6f} {rs[0]['modules'] or ''}")
    (work / "results.json").write_text(json.dumps({"results": results, "size": size, "build_s": build_s}, indent=1))
    print(f"raw results: {work / 'results.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
