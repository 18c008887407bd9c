"""Eval loss and metrics (accuracy, top-5 accuracy, MSE, MAE: what fits the loss) of trained artifacts over the
arrays of an .npz file. Uses the latest trained checkpoint (ARTIFACTS/run/checkpoint) unless told otherwise."""
from __future__ import annotations

import json
import sys
from pathlib import Path


def add_arguments(p):
    p.add_argument("artifacts", help="artifact folder (from `edgetrain artifacts`)")
    p.add_argument("--data", required=True, help=".npz with one array per eval-model input, named as the inputs")
    p.add_argument("--checkpoint", help="checkpoint to evaluate (default: ARTIFACTS/run/checkpoint if training "
                                        "wrote one, else the artifacts' initial checkpoint)")
    p.add_argument("--batch-size", type=int, default=256, help="samples per eval step")
    p.add_argument("--json", metavar="FILE", help="also write the metrics to FILE as JSON ('-': standard output)")


def trained_checkpoint(artifacts) -> Path | None:
    """The checkpoint `edgetrain train` writes by default, if it exists."""
    path = Path(artifacts) / "run" / "checkpoint"
    return path if path.exists() else None


def run(args) -> int:
    from ..atomic import write_atomic
    from ..trainer import LOSS_PROPERTY, artifact_files, check_indices, evaluate_metrics, open_artifacts
    from .train import load_arrays, positive_int

    batch_size = positive_int(str(args.batch_size))
    checkpoint = Path(args.checkpoint) if args.checkpoint else trained_checkpoint(args.artifacts)
    used = checkpoint or artifact_files(args.artifacts)["checkpoint"]
    state, module, _ = open_artifacts(args.artifacts, checkpoint, optimizer=False)
    module.eval()
    arrays = load_arrays(args.data, module.input_names())
    check_indices(module, arrays)
    fixed = module.fixed_batch_size()
    drop_last = fixed is not None
    if fixed is not None and fixed != batch_size:
        print(f"note: the model's batch is fixed at {fixed}: evaluating in batches of {fixed}"
              + (f", the last {len(arrays[0]) % fixed} sample(s) left out" if len(arrays[0]) % fixed else ""),
              file=sys.stderr)
        batch_size = fixed
    props = state.properties
    metrics = evaluate_metrics(module, arrays, batch_size, drop_last, props[LOSS_PROPERTY] if LOSS_PROPERTY in props
                               else None)
    print(f"checkpoint: {used}" + ("" if checkpoint else " (untrained: no run/checkpoint yet)"))
    print(", ".join(f"eval {k.replace('_', ' ')} {v:.6f}" for k, v in metrics.items() if k != "samples")
          + f" over {metrics['samples']} samples")
    if args.json:
        text = json.dumps(dict(metrics, checkpoint=str(used)), indent=2) + "\n"
        if args.json == "-":
            sys.stdout.write(text)
        else:
            write_atomic(args.json, text.encode())
    return 0
