"""Training programs: each gradient written straight into its accumulation buffer.

Training graphs (edgetrain's and onnxruntime's) end every parameter's gradient in
``InPlaceAccumulatorV2(buffer, grad, reset)``: ``buffer = grad`` after ``lazy_reset_grad()``, else
``buffer + grad``. Done literally that is one more pass over every parameter per step and an arena slot per
gradient (mlp: 0.05 ms and 0.8 MB of its 1.2 MB arena). Here the node that computes ``grad`` writes the external
buffer itself and the accumulator's flag becomes a constant; the accumulating case (no reset) becomes the
caller's job: ``edgetrain.runtime.step`` runs into a spare gradient array and adds the committed sums when it
commits. Planning applies it only when the caller asks (``make_plan(direct_gradients=True)``).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .specialize import Bound, Specialized

ACCUMULATOR = ("com.microsoft", "InPlaceAccumulatorV2")


def direct_gradients(spec: Specialized, external: frozenset[str]) -> list[str]:
    """Rewrite ``spec`` in place; returns the buffers now written by their gradient's producer.

    An accumulator is left as it is unless its buffer is external, its gradient comes from a node (not an
    input, a constant or a view, though same-type views in between are skipped and dropped) of the buffer's
    type, and nothing else reads the gradient, those views or the accumulator's updated copy.
    """
    uses: dict[str, int] = {}
    for b in spec.nodes:
        for i in b.node.inputs:
            uses[i] = uses.get(i, 0) + 1
    for name in spec.output_names:
        uses[name] = uses.get(name, 0) + 1
    producer = {o: k for k, b in enumerate(spec.nodes) for o in b.node.outputs if o}
    redirected, dropped = [], set()
    for k, b in enumerate(spec.nodes):
        node = b.node
        if b.op.key != ACCUMULATOR or len(node.inputs) < 2:
            continue
        buffer, grad = node.inputs[0], node.inputs[1]
        updated = node.outputs[1] if len(node.outputs) > 1 else ""
        if buffer not in external or (updated and uses.get(updated)) or spec.types.get(grad) != spec.types[buffer]:
            continue
        views = []          # Identity-like views between the gradient's kernel and the accumulator go too
        while (grad in producer and spec.nodes[producer[grad]].op.kind == "alias" and uses.get(grad) == 1
               and spec.types.get(spec.nodes[producer[grad]].node.inputs[0]) == spec.types[buffer]):
            views.append(producer[grad])
            grad = spec.nodes[producer[grad]].node.inputs[0]
        p = producer.get(grad)
        if p is None or uses.get(grad) != 1 or spec.nodes[p].op.kind == "alias":
            continue
        source = spec.nodes[p]
        renamed = dataclasses.replace(source.node, outputs=[buffer if o == grad else o for o in source.node.outputs])
        spec.nodes[p] = Bound(source.op, dataclasses.replace(source.ctx, node=renamed))
        done = node.outputs[0]
        if done:
            spec.consts[done] = np.ones(spec.types[done].shape, spec.types[done].dtype)
        dropped.update([k, *views])
        redirected.append(buffer)
    spec.nodes = [b for k, b in enumerate(spec.nodes) if k not in dropped]
    return redirected
