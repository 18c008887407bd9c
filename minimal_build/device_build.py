"""What this trimmed edgetrain was built for, and the errors it raises for anything else.

Installed as ``edgetrain.trimmed`` in a trimmed runtime only (``edgetrain reduce`` writes it; the full package
has no such module). The build's manifest (``edgetrain/kernels/aot_kernels.json``) lists the ops of the
artifacts it was built from, the batch sizes it ran them at, and every compiled kernel signature.
"""
from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from edgetrain.errors import EdgetrainError, UnsupportedOpError

MANIFEST = Path(__file__).parent / "kernels" / "aot_kernels.json"


class NotInBuildError(EdgetrainError):
    """A kernel, fused loop or signature that this trimmed runtime was not compiled with."""


@cache
def manifest() -> dict:
    return json.loads(MANIFEST.read_text())


def rebuild_hint() -> str:
    return (f"rebuild the trimmed runtime on a host with the full edgetrain, adding the artifacts (or batch size) "
            f"that need it: {manifest()['rebuild']}")


def built_ops() -> list[str]:
    return [f"{d}::{o}" if d else o for d, o in manifest()["ops"]]


def describe() -> str:
    m = manifest()
    sizes = sorted({b for bs in m["batch_sizes"].values() for b in bs})
    n_sigs = sum(len(e) for e in m["kernels"].values())
    return (f"trimmed edgetrain for {m['target_cpu']}: {len(m['ops'])} ops ({', '.join(built_ops())}), "
            f"{len(m['kernels'])} kernels / {n_sigs} signatures, batch sizes {sizes or 'fixed by the models'}; "
            f"built from {', '.join(m['batch_sizes'])}")


def guard_lookup(lookup):
    """Wrap the op table's ``lookup``: an op outside this build fails when planning, naming the op."""
    ops = {tuple(k) for k in manifest()["ops"]}

    def guarded(node, opset):
        if (node.domain, node.op_type) not in ops:
            domain = node.domain or "ai.onnx"
            raise UnsupportedOpError(f"{node}: op '{node.op_type}' (domain '{domain}') is not in this trimmed "
                                     f"edgetrain, which was built for: {', '.join(built_ops())}; "
                                     + rebuild_hint())
        return lookup(node, opset)
    guarded.__doc__ = lookup.__doc__
    return guarded
