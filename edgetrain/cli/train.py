"""Train artifacts on the arrays of an .npz file (one array per model input, named as the inputs).

Checkpoints (with optimizer state, epoch and step) go to --output every --checkpoint-every steps and at the end of
each epoch; --resume continues from the one there, on the same batch order.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

# checkpoint properties a run saves, so --resume knows where it stopped and which batch order it used
EPOCH, STEP, SEED = RUN_PROPERTIES = ("edgetrain.epoch", "edgetrain.step_in_epoch", "edgetrain.seed")
SEED_MAX = 2**63 - 1          # a checkpoint stores int properties as int64; numpy seeds with any int >= 0


def add_arguments(p):
    p.add_argument("artifacts", help="artifact folder (from `edgetrain artifacts`)")
    p.add_argument("--data", required=True, help=".npz with one array per training-model input, named as the inputs")
    p.add_argument("--eval-data", help=".npz for an eval loss after each epoch")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-3, help="(initial) learning rate")
    p.add_argument("--schedule", choices=("constant", "linear"), default="constant",
                   help="linear: warm up over --warmup-steps, then decay to 0 at the last step")
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument("--seed", type=int, default=0, help="seed of the batch order")
    p.add_argument("-o", "--output", help="folder for checkpoints (default: ARTIFACTS/run)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="STEPS", help="also save every STEPS steps")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --output")
    p.add_argument("--no-progress", action="store_true")


def load_arrays(path, names: list[str]) -> list[np.ndarray]:
    """The arrays of ``path`` for the model inputs ``names``, in that order."""
    from ..errors import InputError
    from ..reading import open_regular

    try:
        with open_regular(path) as f, np.load(f, allow_pickle=False) as z:
            found = {k: z[k] for k in z.files}
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read '{path}' as an .npz file: {e}") from None
    missing = [n for n in names if n not in found]
    if missing:
        raise InputError(f"'{path}' has no array for model input(s) {missing}: it has {sorted(found)}; the model "
                         f"takes {names}")
    return [found[n] for n in names]


def resume_point(props, checkpoint, epochs: int, steps_per_epoch: int, seed: int) -> tuple[int, int, int]:
    """(epoch, step in that epoch, seed) saved in the run properties ``props`` of ``checkpoint``, checked against
    this run's ``epochs`` and ``steps_per_epoch``; a property not saved gives 0, 0 and ``seed``.

    Raises
    ------
    CheckpointError
        A property that is not an integer in its range (names the file, the property and its value).
    """
    from ..checkpoint.state import CheckpointError

    ranges = {EPOCH: (0, epochs, "--epochs"), STEP: (0, max(steps_per_epoch - 1, 0), "the steps per epoch - 1"),
              SEED: (0, SEED_MAX, "2**63 - 1")}
    point = {EPOCH: 0, STEP: 0, SEED: seed}
    for name, (low, high, limit) in ranges.items():
        if name not in props:
            continue
        value = props[name]
        if type(value) is not int or not low <= value <= high:
            raise CheckpointError(f"--resume: checkpoint '{checkpoint}' has {name} = {value!r} "
                                  f"({type(value).__name__}); it must be an integer from {low} to {high} ({limit}): "
                                  "resume with the options of the run that saved it, or start over without --resume")
        point[name] = value
    return point[EPOCH], point[STEP], point[SEED]


def run(args) -> int:
    from ..api import CheckpointState, LinearLRScheduler
    from ..errors import InputError
    from ..trainer import evaluate, open_artifacts, train_epoch
    from .progress import Progress

    out = Path(args.output or Path(args.artifacts) / "run")
    saved = out / "checkpoint"
    if not 0 <= args.seed <= SEED_MAX:
        raise InputError(f"--seed must be an integer from 0 to {SEED_MAX}, got {args.seed}")
    if args.resume and not saved.exists():
        raise InputError(f"--resume: no checkpoint at '{saved}'")
    state, module, optimizer = open_artifacts(args.artifacts, saved if args.resume else None)
    names = module.input_names()
    arrays = load_arrays(args.data, names)
    eval_arrays = load_arrays(args.eval_data, names) if args.eval_data else None
    n = arrays[0].shape[0] if arrays and arrays[0].ndim else 0
    steps_per_epoch = -(-n // args.batch_size) if args.batch_size > 0 else 0
    props = state.properties
    epoch0, skip, seed = resume_point(props if args.resume else {}, saved, args.epochs, steps_per_epoch, args.seed)
    scheduler = None
    if args.schedule == "linear":
        scheduler = LinearLRScheduler(optimizer, args.warmup_steps, args.epochs * steps_per_epoch, args.lr)
    else:
        optimizer.set_learning_rate(args.lr)
    out.mkdir(parents=True, exist_ok=True)

    def save(epoch: int, step: int) -> None:
        props[EPOCH], props[STEP], props[SEED] = epoch, step, seed
        CheckpointState.save_checkpoint(state, saved, include_optimizer_state=True)

    progress = Progress(args.epochs, enabled=not args.no_progress)

    def on_step(info) -> None:
        progress.step(info)
        if args.checkpoint_every and info.step % args.checkpoint_every == 0 and info.step < info.steps_per_epoch:
            save(info.epoch, info.step)

    print(f"training {n} samples, batch {args.batch_size}, {steps_per_epoch} steps per epoch"
          + (f", resuming at epoch {epoch0 + 1} step {skip + 1}" if args.resume else ""))
    for epoch in range(epoch0, args.epochs):
        start = time.perf_counter()
        loss = train_epoch(module, optimizer, arrays, args.batch_size, epoch, np.random.default_rng([seed, epoch]),
                           scheduler, skip_steps=skip if epoch == epoch0 else 0, on_step=on_step)
        seconds = time.perf_counter() - start
        text = f"train loss {loss:.4f}, {seconds:.2f} s, lr {optimizer.get_learning_rate():.3g}"
        if eval_arrays is not None:
            text += f", eval loss {evaluate(module, eval_arrays, args.batch_size):.4f}"
        progress.epoch(epoch, text)
        save(epoch + 1, 0)
    print(f"checkpoint: {saved}")
    return 0
