"""Profile training artifacts: planned and measured memory per step, and where each step spends its time.

For each kind of step (train, eval, optimizer): the planned arena (and without reuse), the state it binds,
the process's RSS, USS and anonymous memory after each steady step and their growth, Python-heap bytes per
step, kernels compiled or loaded from the cache, and each kernel call's time. --max-memory makes planning
fail early, saying how much is needed and which tensors dominate.
"""
from __future__ import annotations

import json
import sys

from ..budget import parse_size


def _size_arg(text: str) -> int:
    import argparse
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_arguments(p):
    p.add_argument("artifacts", help="folder with training_model.onnx and checkpoint (eval_model.onnx and "
                                     "optimizer_model.onnx when present)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="batch size for symbolic batch dimensions (default: the model's fixed batch)")
    p.add_argument("--steps", type=int, default=20, help="steady steps measured of each kind (default 20)")
    p.add_argument("--data", default=None, metavar="FILE.npz",
                   help="arrays named like the model's inputs, used instead of synthetic inputs")
    p.add_argument("--max-memory", type=_size_arg, default=None, metavar="SIZE",
                   help="memory budget, e.g. 64MB or 1.5GB: planning fails early if a step's arena or the "
                        "planned total is over it (default: EDGETRAIN_MAX_MEMORY, else half the available memory)")
    p.add_argument("--top", type=int, default=10, help="kernels listed per step (default 10)")
    p.add_argument("--json", action="store_true", help="print the whole report as JSON")
    p.add_argument("--timeline", metavar="FILE", help="also draw the arena's buffers over the steps of each kind "
                                                      "of step, as FILE.svg or FILE.html")


def run(args) -> int:
    from ..errors import InputError
    from ..profiling import profile_artifacts

    if args.timeline and not args.timeline.endswith((".svg", ".html")):
        raise InputError(f"--timeline {args.timeline}: name an .svg or .html file")
    report = profile_artifacts(args.artifacts, batch_size=args.batch_size, steps=args.steps, data=args.data,
                               max_memory=args.max_memory)
    if args.json:
        json.dump(report.to_dict(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    else:
        print(report.table(args.top))
    if args.timeline:
        from .. import timeline
        from ..atomic import write_atomic

        draw = timeline.html if args.timeline.endswith(".html") else timeline.svg
        write_atomic(args.timeline, draw(report).encode())
        print(f"memory timeline: {args.timeline}", file=sys.stderr)
    return 0
