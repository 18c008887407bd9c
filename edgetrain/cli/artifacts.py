"""Make training artifacts (training, eval and optimizer models, checkpoint) from a forward-only ONNX model.

Trainable parameters default to every floating-point initializer; --frozen keeps some fixed.
"""
from __future__ import annotations

from pathlib import Path

# command-line name -> member of edgetrain.artifacts.LossType / OptimType (imported lazily: onnx is slow to load)
LOSSES = {"crossentropy": "CrossEntropyLoss", "mse": "MSELoss", "bcewithlogits": "BCEWithLogitsLoss", "l1": "L1Loss"}
OPTIMIZERS = {"adamw": "AdamW", "sgd": "SGD"}


def add_arguments(p):
    p.add_argument("model", help="forward-only ONNX model")
    p.add_argument("-o", "--output", required=True, help="artifact folder to write")
    p.add_argument("--loss", choices=LOSSES, default="crossentropy")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--requires-grad", nargs="+", metavar="NAME",
                   help="trainable initializers (default: every floating-point initializer not --frozen)")
    p.add_argument("--frozen", nargs="+", default=[], metavar="NAME", help="initializers to keep fixed")


def trainable_initializers(graph) -> list[str]:
    return [name for name, a in graph.initializers.items() if a.dtype.kind == "f"]


def run(args) -> int:
    from .. import artifacts
    from ..errors import InputError
    from ..onnx_io import to_graph

    graph = to_graph(args.model)
    requires_grad = args.requires_grad or [n for n in trainable_initializers(graph) if n not in args.frozen]
    unknown = sorted(set(requires_grad + args.frozen) - set(graph.initializers))
    if unknown:
        raise InputError(f"{unknown} are not initializers of {args.model}; it has {sorted(graph.initializers)}")
    loss = artifacts.LossType[LOSSES[args.loss]]
    optimizer = artifacts.OptimType[OPTIMIZERS[args.optimizer]]
    artifacts.generate_artifacts(args.model, requires_grad=requires_grad, frozen_params=args.frozen, loss=loss,
                                 optimizer=optimizer, artifact_directory=args.output)
    out = Path(args.output)
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out}")
    print(f"trainable: {len(requires_grad)} initializers; frozen: {len(graph.initializers) - len(requires_grad)}")
    return 0
