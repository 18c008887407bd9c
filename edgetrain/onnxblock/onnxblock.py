"""Block, ForwardBlock and TrainingBlock: onnxruntime.training.onnxblock's building units."""
from __future__ import annotations

from abc import ABC, abstractmethod

from ..autodiff.training import eval_graph, training_graph
from ..errors import EdgetrainError
from ..ir import Value
from ..onnx_io import from_graph, tensor_proto
from ._builder import current


class Block(ABC):
    """A piece of graph: ``build(*input_names) -> output name(s)`` adds nodes to the model under construction.

    Calling a block builds it, then checks the whole graph again (single assignment, defined inputs, every
    shape rule), so a mistake is reported at the block that made it.
    """

    def __init__(self):
        self.base = None

    @abstractmethod
    def build(self, *args, **kwargs):
        ...

    def __call__(self, *args, **kwargs):
        builder = current()
        self.base = builder
        output = self.build(*args, **kwargs)
        builder.graph.verify()
        _typecheck(builder)
        return output


SEQUENCE_OPS = {"SequenceConstruct", "InplaceClipGradNorm", "AdamWOptimizer", "SGDOptimizerV2", "SGDOptimizer"}


def _typecheck(builder) -> None:
    """Run every shape rule over the graph built so far; graphs of tensor sequences (optimizer graphs,
    SequenceConstruct) have no shape rules and are checked structurally only."""
    from ..autodiff.builder import symbolic_types
    graph = builder.graph
    if any(n.op_type in SEQUENCE_OPS for n in graph.nodes):
        return
    if graph.inputs or graph.initializers:
        symbolic_types(graph, outputs=[o for n in graph.nodes[-1:] for o in n.outputs if o] or None)


def _register_outputs(builder, output) -> list[str]:
    names = [output] if isinstance(output, str) else list(output)
    from ..autodiff.builder import symbolic_types
    types = symbolic_types(builder.graph, outputs=names)
    builder.graph.outputs = [Value(n, types.get(n)) for n in names]
    return names


class ForwardBlock(Block):
    """A block whose outputs become the model's outputs; ``to_model_proto()`` gives the model."""

    def __call__(self, *args, **kwargs):
        output = super().__call__(*args, **kwargs)
        _register_outputs(self.base, output)
        return output

    def to_model_proto(self):
        if self.base is None:
            raise EdgetrainError("call the block inside `with onnxblock.base(model):` before to_model_proto()")
        return from_graph(self.base.graph, producer="edgetrain", ir_version=self.base.ir_version)


class TrainingBlock(Block):
    """A block whose first output is the loss; builds the training and eval models from it.

    ``requires_grad(name)`` marks an initializer as trainable (``False``: frozen, kept as a parameter without
    gradient); initializers in neither set stay constants inside the graphs.
    """

    def __init__(self):
        super().__init__()
        self._requires_grad: list[str] = []
        self._frozen: list[str] = []
        self._outputs: list[str] = []

    def requires_grad(self, argument_name: str, value: bool = True):
        for names in (self._requires_grad, self._frozen):
            if argument_name in names:
                names.remove(argument_name)
        (self._requires_grad if value else self._frozen).append(argument_name)

    def __call__(self, *args, **kwargs):
        output = super().__call__(*args, **kwargs)
        self._outputs = _register_outputs(self.base, output)
        return output

    def parameters(self):
        """(trainable TensorProtos, frozen TensorProtos), in the graph's initializer order."""
        if self.base is None:
            raise EdgetrainError("call the block inside `with onnxblock.base(model):` before parameters()")
        inits = self.base.graph.initializers
        trainable = [tensor_proto(n, inits[n]) for n in inits if n in self._requires_grad]
        frozen = [tensor_proto(n, inits[n]) for n in inits if n in self._frozen]
        return trainable, frozen

    def to_model_proto(self):
        """(training model, eval model) as ModelProtos."""
        if self.base is None:
            raise EdgetrainError("call the block inside `with onnxblock.base(model):` before to_model_proto()")
        if not self._requires_grad:
            raise EdgetrainError("no parameter requires a gradient: call requires_grad(name) for the trainable "
                                 "initializers")
        graph = self.base.graph
        loss, extra = self._outputs[0], self._outputs[1:]
        train = training_graph(graph, loss, self._requires_grad, self._frozen, extra)
        evaluation = eval_graph(graph, loss, self._requires_grad, self._frozen, extra)
        ir = self.base.ir_version
        return (from_graph(train, producer="edgetrain", ir_version=ir),
                from_graph(evaluation, producer="edgetrain", ir_version=ir))
