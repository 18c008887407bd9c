"""Reverse-mode autodiff on the IR: gradients are graph nodes, not numbers.

``gradient_graph(graph, loss, wrt)`` walks the nodes between ``wrt`` and ``loss`` backwards and asks each
op's gradient rule (``OpDef.vjp``, beside its shape rule) to emit backward nodes. Fan-in is summed; the
loss gradient is seeded with ones. Names follow onnxruntime: the gradient of value ``v`` is ``v_grad`` and a
rule's helper nodes are named ``<node>_Grad/<op>_<k>``, so the training model reads like ORT's and ORT can run it.
"""
from .builder import GradContext, gradient_graph, params_with_gradient

__all__ = ["GradContext", "gradient_graph", "params_with_gradient"]
