"""Assemble the trimmed ``edgetrain`` package: the device-side modules of the full package, the kernel families
the build uses, and the ahead-of-time kernel module, as an installable folder and a wheel.

How the trimmed package differs from the full one (everything else is copied byte for byte):

- only the modules ``edgetrain.api``, ``compact``, ``trainer`` and the package's ``__init__`` import at module
  level are copied (``import_closure``): host-side ones (ONNX import/export, autodiff, onnxblock, artifact
  generation, the CLI, bundled data, the minimal build itself) are left out, and so are the kernel families
  no artifact used;
- ``kernels/_jit.py`` is ``device_jit.py`` (ahead-of-time lookups instead of ``numba.njit``), and
  ``edgetrain/trimmed.py`` is ``device_build.py`` (what the build holds, and its errors);
- in the kernel modules, Numba-only code is cut: ``numba`` imports and the functions decorated with what they
  imported (``@intrinsic``, ``@overload``: already compiled into the kernels that use them);
- two definitions are replaced: ``codegen.load`` (write a generated source file, import it under Numba's
  cache) by ``_jit.load_generated`` (fused loops come from the build), and ``ops.lookup`` by a wrapper that
  refuses ops outside the build, naming the op and how to rebuild.
"""
from __future__ import annotations

import ast
import base64
import hashlib
import importlib.util
import io
import shutil
import sys
import sysconfig
import zipfile
from pathlib import Path

import numpy as np

from .. import __version__, atomic
from ..errors import EdgetrainError

# The device side: these modules of ``edgetrain`` and everything they import at module level (import_closure).
DEVICE_ROOTS = ("__init__.py", "__main__.py", "api.py", "compact.py", "trainer.py")
# the command line's device commands (train, eval): `edgetrain` on the board; the host commands stay behind
DEVICE_CLI = ("__init__.py", "train.py", "eval.py", "progress.py")
BLOCKED = ("numba", "llvmlite", "onnx", "google.protobuf", "psutil")   # the trimmed runtime imports none of them

# module -> (top-level names whose definitions are cut, code appended in their place)
REPLACED = {
    "codegen/__init__.py": (("_LOADED", "load", "_load_jit"), (
        "\n\n# trimmed runtime: fused loops were compiled ahead of time when the build ran them\n"
        "from ..kernels._jit import load_generated as load  # noqa: E402\n")),
    "cli/__init__.py": (("COMMANDS",), (
        "\n\n# trimmed runtime: the device commands (the host's make artifacts, reduce, profile, export, ...)\n"
        "COMMANDS = (\"eval\", \"train\")\n")),
    "ops/__init__.py": ((), (
        "\n\n# trimmed runtime: only the ops of the artifacts the build was made from\n"
        "from ..trimmed import guard_lookup as _guard_lookup  # noqa: E402\n"
        "lookup = _guard_lookup(lookup)\n")),
}


def _source_dirs() -> tuple[Path, Path]:
    """The full package's folder and its kernels folder, found without importing the kernels (Numba)."""
    package = Path(importlib.util.find_spec("edgetrain").origin).parent
    kernels = Path(importlib.util.find_spec("edgetrain.kernels").submodule_search_locations[0])
    return package, kernels


def _cut(source: str, spans: list[tuple[int, int]]) -> str:
    """``source`` without the given 1-based inclusive line spans."""
    lines = source.splitlines(keepends=True)
    for start, end in sorted(spans, reverse=True):
        del lines[start - 1:end]
    return "".join(lines)


def drop_definitions(source: str, names, where: str) -> str:
    """Cut the top-level functions, classes and assignments named ``names``; each must exist."""
    tree = ast.parse(source)
    spans, found = [], set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)):
            defined = {stmt.name}
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            defined = {t.id for t in targets if isinstance(t, ast.Name)}
        else:
            continue
        if defined & set(names):
            found |= defined
            first = stmt.decorator_list[0].lineno if getattr(stmt, "decorator_list", None) else stmt.lineno
            spans.append((first, stmt.end_lineno))
    missing = sorted(set(names) - found)
    if missing:
        raise EdgetrainError(f"{where} no longer defines {missing}: update minimal_build/package.py's REPLACED")
    return _cut(source, spans)


def strip_numba(source: str, where: str) -> str:
    """Remove ``numba`` imports and top-level functions decorated with a name they imported."""
    tree = ast.parse(source)
    numba_names: set[str] = set()
    cut: list[tuple[int, int]] = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Import) and any(a.name.split(".")[0] == "numba" for a in stmt.names):
            numba_names |= {(a.asname or a.name).split(".")[0] for a in stmt.names}
            cut.append((stmt.lineno, stmt.end_lineno))
        elif isinstance(stmt, ast.ImportFrom) and (stmt.module or "").split(".")[0] == "numba":
            numba_names |= {a.asname or a.name for a in stmt.names}
            cut.append((stmt.lineno, stmt.end_lineno))
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.ClassDef)) and any(
                isinstance(n, ast.Name) and n.id in numba_names for d in stmt.decorator_list for n in ast.walk(d)):
            cut.append((stmt.decorator_list[0].lineno, stmt.end_lineno))
    out = _cut(source, cut)
    kept = ast.parse(out)
    top_level = [n.id for stmt in kept.body if not isinstance(stmt, (ast.FunctionDef, ast.ClassDef))
                 for n in ast.walk(stmt) if isinstance(n, ast.Name)]
    left = sorted(set(top_level) & numba_names)
    if left:
        raise EdgetrainError(f"{where}: module-level code still uses {left} from numba after the cut; the trimmed "
                             "runtime cannot import it (move that code into a jitted function)")
    return out


def _imports(path: Path, package: Path) -> set[str]:
    """``edgetrain``-relative dotted names a module imports at module level (not inside functions: those are
    lazy, like the ONNX export of ``api``, and stay host-only)."""
    rel = path.relative_to(package).with_suffix("").parts
    here = list(rel[:-1])   # the module's package (for __init__.py: the package itself), relative imports' base
    found: set[str] = set()
    stack = list(ast.parse(path.read_text()).body)
    while stack:
        stmt = stack.pop()
        if isinstance(stmt, (ast.If, ast.Try)):
            stack += stmt.body + stmt.orelse + getattr(stmt, "finalbody", []) + [
                s for h in getattr(stmt, "handlers", []) for s in h.body]
        elif isinstance(stmt, ast.Import):
            found |= {a.name.removeprefix("edgetrain.") for a in stmt.names if a.name.startswith("edgetrain.")}
        elif isinstance(stmt, ast.ImportFrom):
            if stmt.level:
                base = here[:len(here) - stmt.level + 1] + (stmt.module.split(".") if stmt.module else [])
            elif (stmt.module or "").split(".")[0] == "edgetrain":
                base = stmt.module.split(".")[1:]
            else:
                continue
            found |= {".".join(base + [a.name]) for a in stmt.names} | ({".".join(base)} if base else set())
    return found


def import_closure(package: Path, roots=DEVICE_ROOTS) -> tuple[list[str], list[str]]:
    """(top-level modules, subpackages) of the full package that ``roots`` need at import time. Subpackages
    are copied whole (with their data files); ``kernels`` is assembled separately."""
    modules, packages = set(), set()
    todo = [package / r for r in roots if (package / r).exists()]
    seen: set[Path] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in _imports(path, package):
            head = name.split(".")[0]
            if head in ("", "kernels", "minimal_build"):
                continue
            if (package / head).is_dir():
                if head not in packages:
                    packages.add(head)
                    todo += sorted((package / head).rglob("*.py"))
            elif (package / f"{head}.py").exists():
                modules.add(f"{head}.py")
                todo.append(package / f"{head}.py")
    modules |= {r for r in roots if (package / r).exists()}
    return sorted(modules), sorted(packages)


def assemble(out_dir: Path, so_file: Path, manifest_file: Path, families: list[str]) -> Path:
    """Write ``out_dir/edgetrain`` (the trimmed package) and ``out_dir/pyproject.toml``; returns the package dir."""
    here = Path(__file__).parent
    package, kernels = _source_dirs()
    target = out_dir / "edgetrain"
    check_replaceable(out_dir)
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    modules, packages = import_closure(package)
    packages = [p for p in packages if p != "cli"]          # its device commands only (DEVICE_CLI, below)
    for name in modules:
        atomic.copy_file(package / name, target / name)
    for name in packages:
        _copy_package(package / name, target / name)
    (target / "cli").mkdir(exist_ok=True)
    for name in DEVICE_CLI:
        atomic.copy_file(package / "cli" / name, target / "cli" / name)
    for rel, (names, text) in REPLACED.items():
        path = target / rel
        atomic.write_text(path, drop_definitions(path.read_text(), names, str(package / rel)) + text)
    atomic.copy_file(here / "device_build.py", target / "trimmed.py")
    kdir = target / "kernels"
    kdir.mkdir()
    atomic.copy_file(kernels / "__init__.py", kdir / "__init__.py")
    atomic.copy_file(here / "device_jit.py", kdir / "_jit.py")
    atomic.copy_file(kernels / "_aot.py", kdir / "_aot.py")          # the dispatcher device_jit uses
    atomic.copy_file(kernels / "_gemm_threads.py", kdir / "_gemm_threads.py")    # matmul's threads, no Numba
    for family in families:
        src = kernels / f"{family}.py"
        atomic.write_text(kdir / src.name, strip_numba(src.read_text(), str(src)))
    atomic.copy_file(so_file, kdir / so_file.name)
    atomic.copy_file(manifest_file, kdir / manifest_file.name)
    atomic.write_text(out_dir / "pyproject.toml", pyproject(target, so_file.name, manifest_file.name))
    return target


def _copy_package(source: Path, target: Path) -> None:
    """A package folder's files (no bytecode caches), each copied with ``atomic.copy_file``."""
    for path in sorted(source.rglob("*")):
        rel = path.relative_to(source)
        if "__pycache__" in rel.parts or path.suffix == ".pyc":
            continue
        if path.is_dir():
            (target / rel).mkdir(parents=True, exist_ok=True)
        else:
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            atomic.copy_file(path, target / rel)


PYPROJECT_MARK = "# The trimmed edgetrain written by `edgetrain reduce`"


def check_replaceable(out_dir: Path) -> None:
    """Refuse to overwrite an ``edgetrain`` folder or ``pyproject.toml`` that an earlier build did not write
    (``-o .`` in a checkout of edgetrain would otherwise replace its sources)."""
    target, project = out_dir / "edgetrain", out_dir / "pyproject.toml"
    if target.exists() and not (target / "trimmed.py").exists():
        raise EdgetrainError(f"{target} exists and is not a trimmed edgetrain; choose another output folder")
    if project.exists() and not project.read_text().startswith(PYPROJECT_MARK):
        raise EdgetrainError(f"{project} exists and was not written by edgetrain reduce; choose another output "
                             "folder")


def _packages(target: Path) -> list[str]:
    return sorted(".".join(p.parent.relative_to(target.parent).parts) for p in target.rglob("__init__.py"))


def requirements() -> list[str]:
    """numpy in the major version the kernels were built against (the extension's C ABI), and flatbuffers."""
    major = int(np.__version__.split(".")[0])
    return [f"numpy>={major}.0,<{major + 1}", "flatbuffers>=23.5"]


def pyproject(target: Path, so_name: str, manifest_name: str) -> str:
    packages = ", ".join(f'"{p}"' for p in _packages(target))
    deps = ", ".join(f'"{r}"' for r in requirements())
    return f"""{PYPROJECT_MARK}: `pip install .` (or the wheel in dist/).
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "edgetrain"
version = "{__version__}+trimmed"
description = "edgetrain's device-side runtime with ahead-of-time compiled kernels (no numba, no onnx)"
requires-python = "=={sys.version_info.major}.{sys.version_info.minor}.*"
dependencies = [{deps}]

[project.scripts]
edgetrain = "edgetrain.cli:main"

[tool.setuptools]
packages = [{packages}]

[tool.setuptools.package-data]
"edgetrain.kernels" = ["{so_name}", "{manifest_name}"]
"edgetrain.checkpoint" = ["*.fbs"]
"""


def wheel_tag() -> str:
    """``cp311-cp311-linux_x86_64``: the extension is built for this interpreter and platform."""
    impl = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{impl}-{platform}"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def write_wheel(target: Path, dist_dir: Path) -> Path:
    """A wheel of the trimmed package (no build backend needed): the package files, METADATA, WHEEL, RECORD."""
    version = f"{__version__}+trimmed"
    tag = wheel_tag()
    dist_dir.mkdir(parents=True, exist_ok=True)
    for old in dist_dir.glob("edgetrain-*+trimmed-*.whl"):
        old.unlink()
    path = dist_dir / f"edgetrain-{version}-{tag}.whl"
    info = f"edgetrain-{version}.dist-info"
    files: list[tuple[str, bytes]] = []
    for p in sorted(target.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            files.append((p.relative_to(target.parent).as_posix(), p.read_bytes()))
    metadata = "\n".join(["Metadata-Version: 2.1", "Name: edgetrain", f"Version: {version}",
                          "Summary: edgetrain's device-side runtime with ahead-of-time compiled kernels",
                          f"Requires-Python: =={sys.version_info.major}.{sys.version_info.minor}.*"]
                         + [f"Requires-Dist: {r}" for r in requirements()]) + "\n"
    wheel = f"Wheel-Version: 1.0\nGenerator: edgetrain.minimal_build\nRoot-Is-Purelib: false\nTag: {tag}\n"
    scripts = "[console_scripts]\nedgetrain = edgetrain.cli:main\n"
    files += [(f"{info}/METADATA", metadata.encode()), (f"{info}/WHEEL", wheel.encode()),
              (f"{info}/entry_points.txt", scripts.encode())]
    record = [_record_line(n, d) for n, d in files] + [f"{info}/RECORD,,"]
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files:
            zi = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    atomic.write_atomic(path, archive.getbuffer())
    return path
