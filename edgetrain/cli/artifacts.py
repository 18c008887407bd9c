"""Make training artifacts (training, eval and optimizer models, checkpoint) from a forward-only ONNX model.

Trainable parameters default to every floating-point initializer that gets a gradient: BatchNorm running
statistics and other buffers no output depends on differentiably are frozen automatically (and listed);
--frozen keeps more fixed. An artifact folder that already holds artifacts or a trained run is not overwritten
without --overwrite (the run is then kept, renamed).
"""
from __future__ import annotations

import time
from pathlib import Path

# command-line name -> member of edgetrain.artifacts.LossType / OptimType (imported lazily: onnx is slow to load)
LOSSES = {"crossentropy": "CrossEntropyLoss", "mse": "MSELoss", "bcewithlogits": "BCEWithLogitsLoss", "l1": "L1Loss"}
OPTIMIZERS = {"adamw": "AdamW", "sgd": "SGD"}
ARTIFACT_FILES = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx", "checkpoint")
RUN_FOLDER = "run"      # where `edgetrain train` keeps its checkpoints by default
# inputs that hold statistics, not weights: frozen by default even where a gradient could reach them
# (an inference-mode BatchNormalization differentiates its running mean and variance)
BUFFER_INPUTS = {("", "BatchNormalization"): (3, 4), ("com.microsoft", "BatchNormInternal"): (3, 4)}


def add_arguments(p):
    p.add_argument("model", help="forward-only ONNX model")
    p.add_argument("-o", "--output", required=True, help="artifact folder to write")
    p.add_argument("--loss", choices=LOSSES, default="crossentropy",
                   help="loss over the model's output and a label input (named 'labels' for crossentropy, "
                        "'target' for the others)")
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw")
    p.add_argument("--requires-grad", nargs="+", metavar="NAME",
                   help="trainable initializers (default: every floating-point initializer that gets a gradient "
                        "and is not --frozen)")
    p.add_argument("--frozen", nargs="+", default=[], metavar="NAME", help="initializers to keep fixed")
    p.add_argument("--overwrite", action="store_true",
                   help="replace artifacts already in --output (a trained run there is kept, renamed)")


def trainable_initializers(graph) -> list[str]:
    return [name for name, a in graph.initializers.items() if a.dtype.kind == "f"]


def statistics_buffers(graph) -> set[str]:
    """Initializers fed to an input that holds statistics (BatchNorm's running mean and variance)."""
    return {n.inputs[i] for n in graph.nodes for i in BUFFER_INPUTS.get((n.domain, n.op_type), ())
            if i < len(n.inputs) and n.inputs[i] in graph.initializers}


def _check_output(out: Path, overwrite: bool) -> Path | None:
    """Refuse to replace artifacts or a trained run without --overwrite; with it, the run folder to set aside."""
    from ..errors import InputError

    existing = [name for name in ARTIFACT_FILES if (out / name).exists()]
    run = out / RUN_FOLDER
    trained = run / "checkpoint"
    if (existing or trained.exists()) and not overwrite:
        what = f"a trained run ({trained})" if trained.exists() else f"artifacts ({', '.join(existing)})"
        raise InputError(f"'{out}' already holds {what}: its checkpoints would no longer match the new models. "
                         "Write to another folder, or pass --overwrite (a trained run is then kept, renamed)")
    return run if run.exists() else None


def _record_loss(path: Path, loss: str) -> None:
    """Note the loss in the checkpoint's properties (eval then knows which metrics fit)."""
    from .. import checkpoint
    from ..trainer import LOSS_PROPERTY

    ckpt = checkpoint.load(path)
    ckpt.properties[LOSS_PROPERTY] = loss
    checkpoint.save(ckpt, path)


def run(args) -> int:
    from .. import artifacts
    from ..autodiff import params_with_gradient
    from ..errors import InputError
    from ..onnx_io import to_graph

    graph = to_graph(args.model)
    out = Path(args.output)
    old_run = _check_output(out, args.overwrite)
    unknown = sorted(set((args.requires_grad or []) + args.frozen) - set(graph.initializers))
    if unknown:
        raise InputError(f"{unknown} are not initializers of {args.model}; it has {sorted(graph.initializers)}")
    auto_frozen, constants = [], []
    if args.requires_grad:
        requires_grad = list(args.requires_grad)
    else:
        candidates = [n for n in trainable_initializers(graph) if n not in args.frozen]
        buffers = statistics_buffers(graph)
        requires_grad = params_with_gradient(graph, [n for n in candidates if n not in buffers])
        # statistics become frozen parameters (training updates them); other values without a gradient
        # (Dropout ratios, shape constants) stay constants of the models, as planning needs them
        auto_frozen = [n for n in candidates if n in buffers]
        constants = [n for n in candidates if n not in buffers and n not in requires_grad]
    if not requires_grad:
        raise InputError(f"no initializer of {args.model} gets a gradient: nothing to train")
    loss = artifacts.LossType[LOSSES[args.loss]]
    optimizer = artifacts.OptimType[OPTIMIZERS[args.optimizer]]
    # the models' outputs come out of every step too, so `edgetrain eval` can report accuracy and the like
    outputs = [v.name for v in graph.outputs]
    artifacts.generate_artifacts(args.model, requires_grad=requires_grad, frozen_params=args.frozen + auto_frozen,
                                 loss=loss, optimizer=optimizer, artifact_directory=args.output,
                                 additional_output_names=outputs)
    _record_loss(out / "checkpoint", args.loss)
    if old_run is not None:
        kept = old_run.with_name(f"{RUN_FOLDER}.replaced-{time.strftime('%Y%m%d-%H%M%S')}")
        old_run.rename(kept)
        print(f"the trained run in {old_run} no longer matches these models: kept as {kept}")
    print(f"wrote {', '.join(n for n in ARTIFACT_FILES if (out / n).is_file())} to {out}")
    print(f"trainable: {len(requires_grad)} initializers; frozen: {len(args.frozen) + len(auto_frozen)}"
          + (f" (statistics, frozen automatically: {', '.join(auto_frozen)})" if auto_frozen else "")
          + f"; constants: {len(graph.initializers) - len(requires_grad) - len(args.frozen) - len(auto_frozen)}"
          + (f" (no gradient reaches them: {', '.join(constants)})" if constants else ""))
    return 0
