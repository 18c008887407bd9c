"""Stages import only downward: each module of the package may import (at module level or inside a function)
only from modules in lower layers of this table, so data flows one way, load -> IR -> autodiff -> plan ->
codegen -> run, and a device-side module never pulls in a host-side one by accident."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# lowest first; a unit is a top-level module or subpackage of edgetrain (kernels/ and minimal_build/ included)
LAYERS = [
    {"errors", "record"},               # record: hand-written record base classes (no edgetrain imports)
    {"config", "blas", "budget", "reading", "ir", "ortvalue", "ortformat_schema", "ort_schemas"},
    {"atomic", "ops", "opset", "onnx_wire", "parallel", "pages"},   # pages: big arrays on 4 KiB pages
    {"checkpoint", "plan", "onnx_read"},  # onnx_read: ONNX bytes -> IR without onnx (compact.load_graph)
    {"ortformat", "inline"},            # ortformat reads .ort files with checkpoint's bounds-checked flatbuffer views
    {"onnx_io"},
    {"autodiff", "compact", "kernels", "ortformat_writer"},
    {"codegen", "onnxblock"},
    {"runtime", "artifacts"},
    {"session"},
    {"api", "forward_backward"},
    {"trainer", "profiling", "timeline", "data", "estimators", "torch"},
    {"federated"},
    {"cli", "minimal_build", "trimmed", "__init__", "__main__"},   # trimmed: minimal_build/device_build.py, shipped
]
LAYER = {unit: k for k, units in enumerate(LAYERS) for unit in units}
# names importable from the package itself (``from edgetrain import __version__``): defined in __init__
PACKAGE_NAMES = {"__version__", "EdgetrainError", "InferenceSession", "OrtValue"}


def _units():
    """(unit, file, the dotted package the file is in) for every Python file of the package."""
    for path in sorted((REPO / "edgetrain").rglob("*.py")):
        rel = path.relative_to(REPO / "edgetrain")
        yield (rel.parts[0] if len(rel.parts) > 1 else rel.stem), path, ["edgetrain", *rel.parts[:-1]]
    for folder in ("kernels", "minimal_build"):
        for path in sorted((REPO / folder).glob("*.py")):
            yield folder, path, ["edgetrain", folder]


def _imported_units(path: Path, package: list[str]) -> set[str]:
    units = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[:len(package) - node.level + 1]
                module = base + (node.module.split(".") if node.module else [])
            else:
                module = node.module.split(".") if node.module else []
            if module[:1] != ["edgetrain"]:
                continue
            if len(module) > 1:
                units.add(module[1])
            else:       # from edgetrain import x: a submodule, or a name the package defines
                units.update(a.name for a in node.names if a.name not in PACKAGE_NAMES)
                if any(a.name in PACKAGE_NAMES for a in node.names):
                    units.add("__init__")
        elif isinstance(node, ast.Import):
            units.update(a.name.split(".")[1] for a in node.names if a.name.startswith("edgetrain."))
    return units


def test_every_unit_has_a_layer():
    missing = sorted({unit for unit, _, _ in _units()} - set(LAYER))
    assert not missing, f"add {missing} to LAYERS"


@pytest.mark.parametrize("unit, path, package", list(_units()), ids=lambda v: str(v) if isinstance(v, str) else "")
def test_imports_only_from_lower_layers(unit, path, package):
    upward = sorted(u for u in _imported_units(path, package) - {unit}
                    if u != "__init__" and LAYER.get(u, len(LAYERS)) >= LAYER[unit])
    if LAYER[unit] == len(LAYERS) - 1:       # the entry points (command line, build tools) may use each other
        upward = [u for u in upward if u not in LAYER]
    assert not upward, f"{path.relative_to(REPO)} ({unit}, layer {LAYER[unit]}) imports {upward} from its layer or above"


def _defined_privates(tree) -> set[str]:
    """Private names a file defines: functions, classes, and attributes it assigns (``self._x = ...``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return {n for n in names if n.startswith("_")}


def test_no_module_reaches_into_another_modules_privates():
    """``obj._name`` is read only in the file that defines ``_name``, and no ``from m import _name`` (a module's
    privates are its own: the profiler, CLI, minimal build and benchmarks use public methods)."""
    files = [path for _, path, _ in _units()] + sorted((REPO / "bench").glob("*.py"))
    private_modules = {path.stem for path in files if path.stem.startswith("_")}   # a package's own, e.g. kernels._jit
    found = []
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        own = _defined_privates(tree)
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", "os", "sys"))
                    and node.attr not in own):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}: .{node.attr}")
        found += [f"{path.relative_to(REPO)}:{node.lineno}: import {a.name}" for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom) for a in node.names
                  if a.name.startswith("_") and not a.name.startswith("__") and a.name not in private_modules]
    assert not found, "\n".join(found)
