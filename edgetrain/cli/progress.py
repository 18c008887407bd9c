"""What a long command shows and how it stops: a progress line (one line per epoch when not on a terminal),
kernel-compilation progress on the first steps, and Ctrl-C that stops after the current step."""
from __future__ import annotations

import math
import os
import signal
import sys
import time
from contextlib import contextmanager

from ..trainer import StepInfo


class Progress:
    def __init__(self, epochs: int, stream=None, enabled: bool = True):
        self.epochs, self.stream = epochs, stream or sys.stderr
        self.live = enabled and self.stream.isatty()

    def step(self, info: StepInfo) -> None:
        if not self.live:
            return
        width = 24
        done = int(width * info.step / info.steps_per_epoch)
        self.stream.write(f"\repoch {info.epoch + 1}/{self.epochs} [{'#' * done}{'.' * (width - done)}] "
                          f"{info.step}/{info.steps_per_epoch} loss {info.mean_loss:.4f} "
                          + (f"{info.samples_per_s:,.0f} samples/s " if math.isfinite(info.samples_per_s) else ""))
        self.stream.flush()

    def note(self, text: str) -> None:
        """A transient status (overwritten by the next line) on a terminal; nothing otherwise."""
        if self.live:
            self.stream.write(f"\r\033[K{text}")
            self.stream.flush()

    def epoch(self, epoch: int, text: str) -> None:
        if self.live:
            self.stream.write("\r\033[K")
        print(f"epoch {epoch + 1}/{self.epochs}: {text}", file=sys.stdout, flush=True)


class CompileWatcher:
    """Counts the kernels Numba compiles (cache loads are not compiles) and the seconds spent, shows
    "compiling kernels: k done" while it happens, and gives a clock that leaves compile time out, so throughput
    figures are about training. Without Numba (the trimmed runtime) nothing ever compiles."""

    def __init__(self, progress: Progress, planned=lambda: 0):
        """``planned()``: how many kernel calls the programs planned so far make (the n of "k/n")."""
        self.progress, self.count, self.seconds, self.setup_seconds = progress, 0, 0.0, 0.0
        self.planned = planned
        self._depth, self._t0, self._setup = 0, 0.0, time.perf_counter()

    def clock(self) -> float:
        """``time.perf_counter()`` minus the compile time so far (and the setup step, once ``setup_done``)."""
        return time.perf_counter() - self.seconds - (time.perf_counter() - self._t0 if self._depth else 0.0)

    def start(self) -> None:
        """Mark the start of the first step, which plans the model and compiles or loads its kernels."""
        self._setup = time.perf_counter()

    def setup_done(self) -> float:
        """The first step is over: its whole time counts as setup (kept out of the clock); returns it."""
        took = time.perf_counter() - self._setup
        self.setup_seconds, self.seconds = took, max(self.seconds, took)
        return took

    def on_start(self, event) -> None:
        if self._depth == 0:      # kernels compile the helpers they inline: count the outermost only
            self._t0 = time.perf_counter()
            self._show()
        self._depth += 1

    def on_end(self, event) -> None:
        self._depth -= 1
        if self._depth == 0:
            self.count += 1
            self.seconds += time.perf_counter() - self._t0
            self._show()

    def _show(self) -> None:
        total = self.planned()
        # kernels found in the disk cache are not compiled: k stays below n then
        of = f"/{total}" if total >= self.count else ""
        self.progress.note(f"compiling kernels {self.count}{of} (first run; cached for later runs) ")

    @contextmanager
    def watching(self):
        from ..kernels import _jit

        with _jit.compile_listener(lambda: self.on_start(None), lambda: self.on_end(None)):
            yield self

    def summary(self) -> str:
        what = f"planning and compiling {self.count} kernels (cached for later runs)" if self.count else "planning"
        return f"first step {self.setup_seconds:.1f} s: {what}"


class Interrupt:
    """Ctrl-C asks to stop after the current step (a step, or a kernel compile inside LLVM, is never cut in half);
    a second Ctrl-C exits at once with status 130. ``requested`` tells the training loop to stop."""

    def __init__(self):
        self.requested = False

    def _handle(self, signum, frame) -> None:
        if self.requested:
            print("\nedgetrain: interrupted again: exiting now (checkpoints on disk are whole)", file=sys.stderr,
                  flush=True)
            os._exit(130)
        self.requested = True
        print("\nedgetrain: interrupt: stopping after this step and saving a checkpoint "
              "(Ctrl-C again to quit at once)", file=sys.stderr, flush=True)

    @contextmanager
    def installed(self):
        previous = signal.signal(signal.SIGINT, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)
