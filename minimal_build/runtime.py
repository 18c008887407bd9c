"""The trimmed runtime: ``build(artifact_folders, out_dir)`` writes an installable ``edgetrain`` that trains the
given artifacts with kernels compiled ahead of time, and depends on numpy and flatbuffers only.

Steps: (1) a fresh process runs every artifact folder under the JIT at each batch size and compiles every
kernel signature it used into one extension module (``aot.py``); (2) the device-side modules, the kernel
families used and that module become ``out_dir/edgetrain`` with a ``pyproject.toml``, plus a wheel in
``out_dir/dist`` (``package.py``); (3) a process that cannot import numba, llvmlite, onnx, protobuf or psutil
imports every module of the result, so a build that would fail on the device fails here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .. import atomic
from ..errors import EdgetrainError
from . import package
from .aot import MANIFEST

DEFAULT_BATCH_SIZES = (1, 32)   # 1 and any other size cover both broadcast patterns of a symbolic batch dim


@dataclass
class Build:
    package_dir: Path      # out_dir/edgetrain
    wheel: Path            # out_dir/dist/edgetrain-<version>+trimmed-<tag>.whl
    manifest: dict         # what the build holds (edgetrain/kernels/aot_kernels.json)

    def summary(self) -> str:
        m = self.manifest
        n_sigs = sum(len(e) for e in m["kernels"].values())
        so = self.package_dir / "kernels" / m["file"]
        return (f"trimmed runtime: {len(m['ops'])} ops, {len(m['kernels'])} kernels / {n_sigs} signatures "
                f"compiled for {m['target_cpu']} ({so.stat().st_size / 1e6:.1f} MB), families "
                f"{', '.join(m['families'])}; package {self.package_dir}, wheel {self.wheel.name}")


def build(artifact_folders, out_dir, batch_sizes=DEFAULT_BATCH_SIZES, target_cpu: str | None = None,
          rebuild_command: str | None = None, log=None) -> Build:
    """Build the trimmed runtime for ``artifact_folders`` into ``out_dir`` (its ``edgetrain/``, ``pyproject.toml``
    and ``dist/`` are replaced; other content, such as ``artifacts/``, is left alone).

    ``batch_sizes``: sizes for symbolic batch dims (models with fixed input shapes run once);
    ``target_cpu``: an LLVM CPU name, default this machine's CPU with its features;
    ``rebuild_command``: what errors on the device tell the user to run (default: an ``edgetrain reduce`` line).
    """
    folders = [Path(f).resolve() for f in artifact_folders]
    out = Path(out_dir).resolve()
    sizes = sorted({int(b) for b in batch_sizes})
    if not folders:
        raise EdgetrainError("the trimmed runtime needs at least one artifact folder")
    if not sizes or min(sizes) < 1:
        raise EdgetrainError(f"batch sizes must be positive integers, got {list(batch_sizes)}")
    log = log or (lambda msg: None)
    package.check_replaceable(out)     # before minutes of compiling, not after
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="edgetrain-aot-") as tmp:
        tmp = Path(tmp)
        log(f"compiling the kernels of {len(folders)} artifact folder(s) at batch sizes {sizes}")
        cmd = [sys.executable, "-m", "edgetrain.minimal_build.aot", str(tmp), *map(str, folders),
               "--batch-size", ",".join(map(str, sizes))]
        if target_cpu:
            cmd += ["--target-cpu", target_cpu]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise EdgetrainError("compiling the trimmed runtime's kernels failed:\n" + proc.stderr.strip()[-4000:])
        log(proc.stderr.strip())
        manifest = json.loads((tmp / MANIFEST).read_text())
        sizes_option = "" if sizes == sorted(DEFAULT_BATCH_SIZES) else f" --batch-size {','.join(map(str, sizes))}"
        manifest["rebuild"] = rebuild_command or f"edgetrain reduce {' '.join(map(str, folders))} -o {out}{sizes_option}"
        atomic.write_text(tmp / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
        target = package.assemble(out, tmp / manifest["file"], tmp / MANIFEST, manifest["families"])
    wheel = package.write_wheel(target, out / "dist")
    check_imports(out)
    log("training each artifact folder once with the trimmed runtime (numba and onnx blocked)")
    check_training(out, manifest["batch_sizes"])
    result = Build(target, wheel, manifest)
    log(result.summary())
    return result


def blocked_python(paths: list[Path], code: str, env: dict | None = None, timeout: float = 600):
    """Run ``code`` in a Python that sees only ``paths`` and numpy/flatbuffers' site folder, and cannot import
    the modules in ``package.BLOCKED`` (a ``sys.meta_path`` finder refuses them). Returns the CompletedProcess."""
    import flatbuffers
    import numpy

    sites = sorted({str(Path(m.__file__).resolve().parents[1]) for m in (numpy, flatbuffers)})
    prelude = (
        "import sys\n"
        f"sys.path[:0] = {[str(p) for p in paths] + sites!r}\n"
        f"_BLOCKED = {package.BLOCKED!r}\n"
        "class _Blocker:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if any(name == b or name.startswith(b + '.') for b in _BLOCKED):\n"
        "            raise ImportError(f'import of {name} is blocked: the trimmed runtime must not need it')\n"
        "sys.meta_path.insert(0, _Blocker())\n")
    run_env = dict(os.environ if env is None else env)
    run_env.pop("PYTHONPATH", None)
    # -S: no site-packages and no .pth files, so an editable install of the full edgetrain cannot shadow it
    return subprocess.run([sys.executable, "-S", "-c", prelude + code], capture_output=True, text=True,
                          env=run_env, timeout=timeout, check=False)


def check_imports(root: Path) -> None:
    """Import every module of the trimmed package under ``root`` with numba, onnx and friends blocked."""
    target = root / "edgetrain"
    modules = sorted(".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
                     for p in target.rglob("*.py"))
    code = ("import importlib, edgetrain\n"
            "assert edgetrain.__file__.startswith(sys.path[0]), edgetrain.__file__\n"
            f"for m in {modules!r}:\n"
            "    importlib.import_module(m)\n"
            "import edgetrain.kernels._jit as j\n"
            "j._module()\n")
    proc = blocked_python([root], code)
    if proc.returncode != 0:
        raise EdgetrainError(f"the trimmed runtime in {target} does not import without numba/onnx:\n"
                             + proc.stderr.strip()[-3000:])


def check_training(root: Path, batch_sizes: dict[str, list[int]]) -> None:
    """Run each artifact folder (in compact form, as a device gets it) at each recorded batch size with the
    trimmed package under ``root``."""
    from .reduce import compact_artifacts

    source = (Path(__file__).parent / "exercise.py").read_text()
    with tempfile.TemporaryDirectory(prefix="edgetrain-check-") as tmp:
        runs = {}
        for k, (folder, sizes) in enumerate(batch_sizes.items()):
            compact_artifacts(folder, Path(tmp) / str(k))
            runs[str(Path(tmp) / str(k))] = sizes
        code = (f"ns = {{'__name__': 'exercise'}}\nexec(compile({source!r}, 'exercise.py', 'exec'), ns)\n"
                f"for folder, sizes in {runs!r}.items():\n"
                "    for batch in sizes or [1]:\n"
                "        ns['exercise'](folder, batch)\n")
        proc = blocked_python([root], code)
    if proc.returncode != 0:
        compacted = ", ".join(f"{k}: {folder}" for k, folder in enumerate(batch_sizes))
        raise EdgetrainError(f"the trimmed runtime in {root / 'edgetrain'} could not train its own artifacts "
                             f"(compacted to numbered folders: {compacted}):\n" + proc.stderr.strip()[-3000:])
