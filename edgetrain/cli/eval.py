"""Mean eval loss of artifacts (or a trained checkpoint) over the arrays of an .npz file."""
from __future__ import annotations


def add_arguments(p):
    p.add_argument("artifacts", help="artifact folder (from `edgetrain artifacts`)")
    p.add_argument("--data", required=True, help=".npz with one array per eval-model input, named as the inputs")
    p.add_argument("--checkpoint", help="checkpoint to evaluate (default: the artifact folder's)")
    p.add_argument("--batch-size", type=int, default=256)


def run(args) -> int:
    from ..errors import InputError
    from ..trainer import evaluate, open_artifacts
    from .train import load_arrays

    _, module, _ = open_artifacts(args.artifacts, args.checkpoint, optimizer=False)
    if module._eval is None:
        raise InputError(f"artifact folder '{args.artifacts}' has no eval model")
    module.eval()
    arrays = load_arrays(args.data, module.input_names())
    print(f"eval loss {evaluate(module, arrays, args.batch_size):.6f} over {arrays[0].shape[0]} samples")
    return 0
