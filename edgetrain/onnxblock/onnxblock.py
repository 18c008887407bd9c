"""Block, ForwardBlock and TrainingBlock: onnxruntime.training.onnxblock's building units.

As in ORT 1.19, ``self.base`` inside ``build()`` is the ``onnx.ModelProto`` under construction (the one
``accessor.model`` returns): user blocks may read ``self.base.graph.output[0]`` or append graph inputs.
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod

from ..autodiff.training import eval_graph, training_graph
from ..errors import EdgetrainError
from ..ir import SequenceType
from ..onnx_io import from_graph, inferred_types, tensor_proto, to_graph, value_info
from ..ops import OP_TABLE
from ._builder import current


class Block(ABC):
    """A piece of graph: ``build(*input_names) -> output name(s)`` edits ``self.base`` (the ModelProto).

    Calling a block builds it, then checks the whole graph again (single assignment, defined inputs, every
    shape rule edgetrain has), so a mistake is reported at the block that made it. Subclasses need not call
    ``Block.__init__`` (ORT's do not always).
    """

    base = None

    def __init__(self):
        self.base = None

    @abstractmethod
    def build(self, *args, **kwargs):
        ...

    def __call__(self, *args, **kwargs):
        self.base = current().model
        output = self.build(*args, **kwargs)
        typecheck(self.base, _names(output))
        return output


def _names(output) -> list[str]:
    return [output] if isinstance(output, str) else [n for n in output]


def _typeable(graph) -> bool:
    """Whether edgetrain's shape rules cover the graph: every op is in its table and no value is a sequence
    (optimizer graphs, SequenceConstruct); otherwise it is checked structurally and typed by onnx."""
    return (all((n.domain, n.op_type) in OP_TABLE for n in graph.nodes)
            and not any(isinstance(v.type, SequenceType) for v in graph.inputs)
            and not any(n.op_type == "SequenceConstruct" for n in graph.nodes))


def typecheck(model, names: list[str]) -> None:
    from ..autodiff.builder import symbolic_types
    graph = to_graph(model)       # verifies single assignment and that every input is defined
    if _typeable(graph) and (graph.inputs or graph.initializers):
        symbolic_types(graph, outputs=[n for n in names if n] or None)


def _output_types(model, names: list[str]) -> dict:
    """Types of ``names``: edgetrain's symbolic ones where its rules cover the graph, else onnx's, else a
    sequence like the producer's first input (in-place sequence ops), else unknown."""
    from ..autodiff.builder import symbolic_types
    graph = to_graph(model)
    if _typeable(graph):
        return symbolic_types(graph, outputs=names)
    types = inferred_types(model)
    declared = {v.name: v.type for v in graph.inputs}
    for node in graph.nodes:
        for o in node.outputs:
            if types.get(o) is None and node.inputs and isinstance(declared.get(node.inputs[0]), SequenceType):
                types[o] = declared[node.inputs[0]]
            declared.setdefault(o, types.get(o))
    return {n: types.get(n) for n in names}


def _register_outputs(model, output) -> list[str]:
    """Make ``output`` the graph's outputs (existing declarations kept, others typed)."""
    names = _names(output)
    existing = {v.name: copy.deepcopy(v) for v in model.graph.output}
    missing = [n for n in names if n not in existing]
    types = _output_types(model, missing) if missing else {}
    del model.graph.output[:]
    model.graph.output.extend(existing[n] if n in existing else value_info(n, types.get(n)) for n in names)
    return names


class ForwardBlock(Block):
    """A block whose outputs become the model's outputs; ``to_model_proto()`` gives the model."""

    def __init__(self):
        super().__init__()
        self._model = None

    def __call__(self, *args, **kwargs):
        output = super().__call__(*args, **kwargs)
        _register_outputs(self.base, output)
        self._model = copy.deepcopy(self.base)
        return output

    def to_model_proto(self):
        if getattr(self, "_model", None) is None:
            raise EdgetrainError("Please build the forward models first before trying to retrieve it. (call the "
                                 "block inside `with onnxblock.base(model):`)")
        return self._model


class TrainingBlock(Block):
    """A block whose first output is the loss; building it makes the training and eval models.

    ``requires_grad(name)`` marks an initializer as trainable (``False``: frozen, kept as a parameter without
    gradient), or a graph input whose gradient the training model then accumulates too, as ORT does
    (``<input>_grad.accumulation.buffer`` in, ``<input>_grad.accumulation.out`` out). Initializers in neither
    set stay constants inside the graphs; with no parameter named at all the models have no gradient (ORT 1.19
    then also makes every initializer a graph input the caller must feed; edgetrain keeps them constants).
    After the call, the accessor's model is the training model, as in ORT.
    """

    def __init__(self):
        super().__init__()
        self._requires_grad: list[str] = []
        self._frozen: list[str] = []
        self._parameters = None
        self._models = None

    def requires_grad(self, argument_name: str, value: bool = True):
        for names in (self._requires_grad, self._frozen):
            if argument_name in names:
                names.remove(argument_name)
        (self._requires_grad if value else self._frozen).append(argument_name)

    def __call__(self, *args, **kwargs):
        output = super().__call__(*args, **kwargs)
        outputs = _register_outputs(self.base, output)
        graph = to_graph(self.base)
        inits = graph.initializers
        self._parameters = ([tensor_proto(n, inits[n]) for n in inits if n in self._requires_grad],
                            [tensor_proto(n, inits[n]) for n in inits if n in self._frozen])
        loss, extra = outputs[0], outputs[1:]
        train = training_graph(graph, loss, self._requires_grad, self._frozen, extra)
        evaluation = eval_graph(graph, loss, self._requires_grad, self._frozen, extra)
        ir = self.base.ir_version
        self._models = (from_graph(train, producer="edgetrain", ir_version=ir),
                        from_graph(evaluation, producer="edgetrain", ir_version=ir))
        self.base.CopyFrom(self._models[0])
        return output

    def parameters(self):
        """(trainable TensorProtos, frozen TensorProtos), in the graph's initializer order."""
        if self._parameters is None:
            raise EdgetrainError("Please build the training model first before trying to retrieve the parameters. "
                                 "(call the block inside `with onnxblock.base(model):`)")
        return self._parameters

    def to_model_proto(self):
        """(training model, eval model) as ModelProtos."""
        if self._models is None:
            raise EdgetrainError("Please build the training and eval models first before trying to retrieve them. "
                                 "(call the block inside `with onnxblock.base(model):`)")
        return self._models
