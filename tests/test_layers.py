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
    {"errors"},
    {"config", "budget", "reading", "ir", "ortvalue"},
    {"atomic", "ops"},
    {"onnx_io", "checkpoint", "plan"},
    {"autodiff", "compact", "kernels"},
    {"codegen", "onnxblock"},
    {"runtime", "artifacts"},
    {"session"},
    {"api"},
    {"trainer", "profiling", "timeline", "data"},
    {"federated"},                                                  # the optional Flower apps and launcher
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
