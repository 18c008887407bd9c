"""Train artifacts on the arrays of an .npz file (one array per model input, named as the inputs).

Checkpoints (with optimizer state, epoch and step) go to --output (default ARTIFACTS/run) every --checkpoint-every
steps, at the end of each epoch and when interrupted (Ctrl-C stops after the current step); --resume continues
from the one there, on the same batch order. A trained run there is never overwritten without --overwrite.
Each step and epoch is logged to OUTPUT/metrics.jsonl (and drawn in OUTPUT/curves.png when matplotlib is
installed: pip install 'edgetrain[plot]').
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import zipfile
from pathlib import Path

import numpy as np

# checkpoint properties a run saves, so --resume knows where it stopped and which batch order it used
EPOCH, STEP, SEED = ("edgetrain.epoch", "edgetrain.step_in_epoch", "edgetrain.seed")
# the settings a run was started with: --resume refuses another batch size and names other differences
SETTINGS = {"batch_size": "edgetrain.batch_size", "lr": "edgetrain.lr", "schedule": "edgetrain.schedule",
            "warmup_steps": "edgetrain.warmup_steps", "epochs": "edgetrain.epochs"}
LABEL_ALIASES = {"target": "labels"}    # the regression losses name their label input 'target'
METRICS_FILE, CURVES_FILE = "metrics.jsonl", "curves.png"
SEED_MAX = 2**63 - 1          # a checkpoint stores int properties as int64; numpy seeds with any int >= 0


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def non_negative_int(text: str) -> int:
    value = int(text)
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be an integer from 0 to {SEED_MAX}, got {value}")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def add_arguments(p):
    p.add_argument("artifacts", help="artifact folder (from `edgetrain artifacts`)")
    p.add_argument("--data", required=True, help=".npz with one array per training-model input, named as the "
                                                 "inputs ('labels' is accepted for an input named 'target')")
    p.add_argument("--eval-data", help=".npz for eval loss and metrics after each epoch")
    p.add_argument("--epochs", type=positive_int, default=1, help="passes over --data")
    p.add_argument("--batch-size", type=positive_int, default=32, help="samples per step")
    p.add_argument("--lr", type=positive_float, default=1e-3, help="(initial) learning rate")
    p.add_argument("--schedule", choices=("constant", "linear"), default="constant",
                   help="linear: warm up over --warmup-steps, then decay to 0 at the last step")
    p.add_argument("--warmup-steps", type=non_negative_int, default=0, help="linear schedule's warm-up")
    p.add_argument("--seed", type=non_negative_int, default=None,
                   help="seed of the batch order and of Dropout (default 0; a resumed run keeps its own)")
    p.add_argument("-o", "--output", help="folder for checkpoints and the metrics log (default: ARTIFACTS/run)")
    p.add_argument("--checkpoint-every", type=non_negative_int, default=0, metavar="STEPS",
                   help="also save every STEPS steps")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint in --output")
    p.add_argument("--overwrite", action="store_true",
                   help="start from the artifacts' initial weights even if --output holds a trained run")
    p.add_argument("--no-progress", action="store_true", help="no progress line (one line per epoch)")


def load_arrays(path, names: list[str]) -> list[np.ndarray]:
    """The arrays of ``path`` for the model inputs ``names``, in that order."""
    from ..errors import InputError
    from ..reading import open_regular

    try:
        with open_regular(path) as f:
            if not zipfile.is_zipfile(f):
                raise InputError(f"'{path}' is not an .npz file (numpy.savez's format: a zip of .npy arrays, one "
                                 "per model input)")
            f.seek(0)
            with np.load(f, allow_pickle=False) as z:
                found = {k: z[k] for k in z.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else e
        raise InputError(f"cannot read '{path}' as an .npz file: {reason}") from None
    for name, alias in LABEL_ALIASES.items():
        if name in names and name not in found and alias in found:
            found[name] = found[alias]
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


def _refuse_overwrite(saved: Path, props) -> None:
    from ..errors import InputError

    where = ""
    if EPOCH in props:
        where = f" (saved at epoch {props[EPOCH]}, step {props[STEP] if STEP in props else 0})"
    raise InputError(f"'{saved}' holds a trained run{where}: pass --resume to continue it, --overwrite to start "
                     "over from the artifacts' initial weights, or -o to train into another folder")


def _check_settings(props, args, saved: Path) -> list[str]:
    """Differences between this command line and the run being resumed: a batch size is refused (the saved
    position in the batch order would be meaningless), the rest are returned as warnings."""
    from ..errors import InputError

    warnings = []
    for arg, prop in SETTINGS.items():
        if prop not in props or props[prop] == getattr(args, arg):
            continue
        if arg == "batch_size":
            raise InputError(f"--resume: the run in '{saved}' trains with --batch-size {props[prop]}, this command "
                             f"says {args.batch_size}: resume with the same batch size (or start over)")
        warnings.append(f"--{arg.replace('_', '-')} {getattr(args, arg)} differs from the run's {props[prop]}")
    return warnings


def _fixed_batch(module, batch_size: int, n: int) -> bool:
    """Whether to drop the last partial batch: a model exported with a fixed batch cannot run it."""
    from ..errors import InputError

    fixed = module.fixed_batch_size()
    if fixed is None:
        return False
    if fixed != batch_size:
        raise InputError(f"the model was exported with a fixed batch of {fixed}: use --batch-size {fixed}, or export "
                         "it with a dynamic batch axis (torch.onnx.export(..., dynamic_axes={'input': {0: 'batch'}, "
                         "'output': {0: 'batch'}})) and make the artifacts again")
    if n % fixed:
        print(f"note: the model's batch is fixed at {fixed}: the last {n % fixed} sample(s) of each epoch are "
              "skipped (export with a dynamic batch axis to use them)", file=sys.stderr)
    return True


class MetricsLog:
    """Step and epoch records, rewritten whole (atomically) to OUTPUT/metrics.jsonl after each epoch and save, and
    a loss curve in OUTPUT/curves.png where matplotlib is installed."""

    def __init__(self, folder: Path, resume: bool):
        self.path, self.records = folder / METRICS_FILE, []
        if resume and self.path.is_file():
            self.records = [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def add(self, **record) -> None:
        self.records.append(record)

    def write(self) -> None:
        from ..atomic import write_atomic

        write_atomic(self.path, "".join(json.dumps(r) + "\n" for r in self.records).encode())
        self._plot()

    def _plot(self) -> None:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        import io

        from ..atomic import write_atomic

        steps = [r for r in self.records if r["kind"] == "step"]
        epochs = [r for r in self.records if r["kind"] == "epoch"]
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot([r["global_step"] for r in steps], [r["loss"] for r in steps], lw=0.8, label="train loss (step)")
        if any("eval_loss" in r for r in epochs):
            ax.plot([r["global_step"] for r in epochs if "eval_loss" in r],
                    [r["eval_loss"] for r in epochs if "eval_loss" in r], "o-", label="eval loss (epoch)")
        ax.set_xlabel("step")
        ax.set_ylabel("loss")
        ax.legend()
        if any("eval_accuracy" in r for r in epochs):
            acc = ax.twinx()
            acc.plot([r["global_step"] for r in epochs if "eval_accuracy" in r],
                     [r["eval_accuracy"] for r in epochs if "eval_accuracy" in r], "s--", color="tab:green")
            acc.set_ylabel("eval accuracy")
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
        plt.close(fig)
        write_atomic(self.path.with_name(CURVES_FILE), buf.getvalue())


def run(args) -> int:
    from .. import config
    from ..api import CheckpointState, LinearLRScheduler
    from ..errors import InputError
    from ..trainer import LOSS_PROPERTY, check_indices, evaluate_metrics, open_artifacts, train_epoch
    from .progress import CompileWatcher, Interrupt, Progress

    out = Path(args.output or Path(args.artifacts) / "run")
    saved = out / "checkpoint"
    if args.resume and not saved.exists():
        raise InputError(f"--resume: no checkpoint at '{saved}'")
    if args.resume and args.overwrite:
        raise InputError("--resume and --overwrite contradict each other: pick one")
    if saved.exists() and not (args.resume or args.overwrite):
        _refuse_overwrite(saved, CheckpointState.load_checkpoint(saved).properties)
    config.set_seed(args.seed if args.seed is not None else 0)       # Dropout: runs repeat exactly
    state, module, optimizer = open_artifacts(args.artifacts, saved if args.resume else None)
    props = state.properties
    names = module.input_names()
    arrays = load_arrays(args.data, names)
    eval_arrays = load_arrays(args.eval_data, names) if args.eval_data else None
    n = arrays[0].shape[0] if arrays and arrays[0].ndim else 0
    for a in [arrays] + ([eval_arrays] if eval_arrays is not None else []):
        check_indices(module, a)
    drop_last = _fixed_batch(module, args.batch_size, n)
    steps_per_epoch = n // args.batch_size if drop_last else -(-n // args.batch_size)
    epoch0, skip, seed = resume_point(props if args.resume else {}, saved, args.epochs, steps_per_epoch,
                                      args.seed if args.seed is not None else 0)
    if args.resume:
        for warning in _check_settings(props, args, saved):
            print(f"warning: {warning}", file=sys.stderr)
        if args.seed is not None and args.seed != seed:
            print(f"warning: --seed {args.seed} differs from the run's {seed}: the run's is kept (same batch order)",
                  file=sys.stderr)
    scheduler = None
    if args.schedule == "linear":
        scheduler = LinearLRScheduler(optimizer, args.warmup_steps, args.epochs * steps_per_epoch, args.lr)
    else:
        optimizer.set_learning_rate(args.lr)
    out.mkdir(parents=True, exist_ok=True)
    log = MetricsLog(out, args.resume)
    loss_kind = props[LOSS_PROPERTY] if LOSS_PROPERTY in props else None

    def save(epoch: int, step: int) -> None:
        props[EPOCH], props[STEP], props[SEED] = epoch, step, seed
        for arg, prop in SETTINGS.items():
            props[prop] = getattr(args, arg)
        CheckpointState.save_checkpoint(state, saved, include_optimizer_state=True)
        log.write()

    progress = Progress(args.epochs, enabled=not args.no_progress)
    compiles, interrupt = CompileWatcher(progress, module.planned_kernels), Interrupt()
    position = {"epoch": epoch0, "step": skip}

    def on_step(info) -> None:           # called once the step, its optimizer update included, is done
        if not compiles.setup_seconds:   # the first step planned and compiled: no throughput figure for it
            compiles.setup_done()
            info = dataclasses.replace(info, samples_per_s=float("nan"))
        done = info.step == info.steps_per_epoch      # the epoch's last step: a checkpoint there starts the next
        position.update(epoch=info.epoch + done, step=0 if done else info.step)
        progress.step(info)
        log.add(kind="step", epoch=info.epoch + 1, step=info.step, global_step=info.epoch * steps_per_epoch
                + info.step, loss=info.loss, lr=optimizer.get_learning_rate(),
                samples_per_s=info.samples_per_s if math.isfinite(info.samples_per_s) else None)
        if args.checkpoint_every and info.step % args.checkpoint_every == 0 and info.step < info.steps_per_epoch:
            save(info.epoch, info.step)
        if interrupt.requested:
            raise KeyboardInterrupt

    with interrupt.installed(), compiles.watching():
        print(f"training {n} samples, batch {args.batch_size}, {steps_per_epoch} steps per epoch"
              + (f", resuming at epoch {epoch0 + 1} step {skip + 1}" if args.resume else ""), flush=True)
        compiles.start()
        try:
            for epoch in range(epoch0, args.epochs):
                start = compiles.clock()
                loss = train_epoch(module, optimizer, arrays, args.batch_size, epoch,
                                   np.random.default_rng([seed, epoch]), scheduler,
                                   skip_steps=skip if epoch == epoch0 else 0, on_step=on_step,
                                   drop_last=drop_last, clock=compiles.clock)
                seconds = compiles.clock() - start
                text = f"train loss {loss:.4f}, {seconds:.2f} s, lr {optimizer.get_learning_rate():.3g}"
                record = {"kind": "epoch", "epoch": epoch + 1, "global_step": (epoch + 1) * steps_per_epoch,
                          "train_loss": loss}
                if eval_arrays is not None:
                    metrics = evaluate_metrics(module, eval_arrays, args.batch_size, drop_last, loss_kind)
                    text += "".join(f", eval {k.replace('_', ' ')} {v:.4f}" for k, v in metrics.items()
                                    if k != "samples")
                    record.update({f"eval_{k}": v for k, v in metrics.items() if k != "samples"})
                if epoch == epoch0:
                    text += f" ({compiles.summary()})"
                progress.epoch(epoch, text)
                log.add(**record)
                save(epoch + 1, 0)
                position.update(epoch=epoch + 1, step=0)
                if interrupt.requested:
                    raise KeyboardInterrupt
        except KeyboardInterrupt:
            save(position["epoch"], position["step"])
            print(f"edgetrain: interrupted at epoch {position['epoch'] + 1} step {position['step']}: checkpoint "
                  f"{saved} (continue with --resume)", file=sys.stderr)
            return 130
    print(f"checkpoint: {saved}; metrics: {log.path}")
    return 0
