"""A one-line progress bar on a terminal, one line per epoch otherwise (logs, CI)."""
from __future__ import annotations

import sys

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
                          f"{info.samples_per_s:,.0f} samples/s ")
        self.stream.flush()

    def epoch(self, epoch: int, text: str) -> None:
        if self.live:
            self.stream.write("\r\033[K")
        print(f"epoch {epoch + 1}/{self.epochs}: {text}", file=sys.stdout, flush=True)
