"""A training step that changes the state only once it has succeeded.

The state store keeps two gradient arrays: the committed one (what ``Parameter.grad`` and the optimizer read)
and a spare. The training program is bound twice over one plan and one arena, once writing its gradients into
each array; a step runs the one whose gradients land in the spare, checks the loss, and only then commits:
running statistics are copied over their frozen arrays and the spare (plus the committed sums when
accumulating) becomes the committed array. So a non-finite loss, or an error raised by any kernel of the
program (a bad label found in the backward pass, ...), leaves parameters, gradients, running statistics,
optimizer moments and the module's flags exactly as they were, and a normal step pays no copy for it (an
accumulating step pays the one addition it always did). The price is memory: one more gradient-sized array.
"""
from __future__ import annotations

import math

import numpy as np

from ..errors import EdgetrainError
from ..plan import Plan
from .program import Program
from .state import StateStore


def written_externals(plan: Plan) -> dict[str, str]:
    """External arrays the program writes -> the node that writes each (views resolved to their root): outputs,
    and the inputs an op updates in place (``OpDef.writes_inputs``)."""
    root: dict[str, str] = {}
    for step in plan.steps:
        if step.kind == "alias":
            root[step.outputs[0]] = root.get(step.inputs[0], step.inputs[0])
    written = {}
    for step in plan.steps:
        if step.kind == "alias":
            continue
        for b in step.nodes:
            node = b.node
            targets = [o for o in node.outputs if o]
            targets += [node.inputs[i] for i in b.op.writes_inputs if i < len(node.inputs)]
            for name in targets:
                name = root.get(name, name)
                if name in plan.external:
                    written.setdefault(name, str(node))
    return written


def check_loss(outputs: list[np.ndarray], index: int, name: str) -> None:
    """Refuse a step whose loss (output ``index``) is not finite: raised before anything is committed."""
    loss = outputs[index]
    if (math.isfinite(loss.item()) if loss.size == 1 else np.isfinite(loss).all()):
        return
    shown = loss.reshape(-1)[~np.isfinite(loss.reshape(-1))][0]
    raise EdgetrainError(f"loss '{name}' is {shown} (not finite): the step was refused and the state is as it was "
                         "before it; check the inputs and the learning rate")


def check_writes(plan: Plan, allowed: set[str], what: str) -> None:
    """Refuse a program that writes an external array other than ``allowed`` (a model that would update a
    parameter in place during a training or eval step, outside the commit)."""
    bad = {name: node for name, node in written_externals(plan).items() if name not in allowed}
    if bad:
        name, node = next(iter(bad.items()))
        raise EdgetrainError(f"{what}: {node} writes '{name}' in place; a {what} may write only its gradient "
                             "buffers (parameters change only in the optimizer step)")


class TrainingStep:
    """One training plan bound to both gradient arrays of ``store``.

    ``external``: the plan's external arrays except the gradient buffers (parameters, frozen arrays, and the
    reset flag bound to a constant true: every run writes this step's own gradients). ``buffers``: gradient
    buffer input -> its parameter. ``stats``: (output name, frozen array it replaces) per running statistic.
    ``loss``: (output index, name).

    The program of the slot the next step writes is bound now, the other one when a step first needs it:
    binding costs about what planning does, and a process's first step runs only one of them.
    """

    def __init__(self, plan: Plan, external: dict[str, np.ndarray], buffers: dict[str, str], store: StateStore,
                 arena: np.ndarray, stats: list[tuple[str, np.ndarray]], loss: tuple[int, str]):
        check_writes(plan, set(buffers), "training step")
        self.plan, self.store, self.loss = plan, store, loss
        self._external, self._arena, self._stats = external, arena, stats
        written = written_externals(plan)
        self._views = [{b: store.grad(p, slot) for b, p in buffers.items()} for slot in (0, 1)]
        self._programs: list[Program | None] = [None, None]
        self.stats: list[list[tuple[np.ndarray, np.ndarray]] | None] = [None, None]
        # buffers no step writes: their gradient is zero
        self.unwritten = [[v for b, v in views.items() if b not in written] for views in self._views]
        self.program(1 - store.slot)

    def program(self, slot: int) -> Program:
        """The program that writes its gradients into gradient slot ``slot`` (bound on first use)."""
        prog = self._programs[slot]
        if prog is None:
            prog = Program(self.plan, self._external | self._views[slot], self._arena)
            named = dict(zip(self.plan.spec.output_names, prog.outputs))
            self.stats[slot] = [(named[out], frozen) for out, frozen in self._stats]
            self._programs[slot] = prog
        return prog

    @property
    def programs(self) -> list[Program]:
        """Both programs, one per gradient slot (binding the one not bound yet)."""
        return [self.program(0), self.program(1)]

    def run(self, inputs: list[np.ndarray], accumulate: bool) -> list[np.ndarray]:
        """Run into the spare gradients, check the loss, commit; ``accumulate``: add the committed sums."""
        spare = 1 - self.store.slot
        prog = self._programs[spare] or self.program(spare)
        for view in self.unwritten[spare]:
            view.fill(0)
        outs = prog.run(inputs)
        loss = outs[self.loss[0]]
        if loss.size != 1 or not math.isfinite(loss.item()):     # the scalar case is the usual one: no ufunc
            check_loss(outs, *self.loss)
        for updated, running_stat in self.stats[spare]:
            np.copyto(running_stat, updated)
        self.store.commit_gradients(accumulate)
        return outs
