"""Export an inference ONNX model (the eval model's forward part with trained parameters)."""
from __future__ import annotations


def add_arguments(p):
    p.add_argument("artifacts", help="artifact folder (from `edgetrain artifacts`)")
    p.add_argument("-o", "--output", required=True, help="inference model file to write (.onnx)")
    p.add_argument("--checkpoint", help="trained checkpoint (default: ARTIFACTS/run/checkpoint if it exists, "
                                        "else the artifact folder's)")
    p.add_argument("--outputs", nargs="+", metavar="NAME",
                   help="outputs of the exported model (default: the values the loss is computed from)")


def forward_outputs(graph, user_inputs: list[str]) -> list[str]:
    """The values the loss part of an eval graph reads from the forward part.

    Label inputs are the user (non-parameter) inputs whose dependent nodes are a strict subset of another input's (the loss
    depends on the data too, through the logits); the loss part is what depends on a label.
    """
    inputs = list(user_inputs)
    dependents = {}
    for name in inputs:
        reached, nodes = {name}, set()
        for k, node in enumerate(graph.nodes):          # nodes are in topological order
            if any(i in reached for i in node.inputs if i):
                nodes.add(k)
                reached.update(o for o in node.outputs if o)
        dependents[name] = nodes
    labels = [a for a in inputs if dependents[a] and any(dependents[a] < dependents[b] for b in inputs)]
    loss_part = set().union(*(dependents[a] for a in labels)) if labels else set()
    produced = {o for k, n in enumerate(graph.nodes) if k not in loss_part for o in n.outputs if o}
    found: list[str] = []
    for k in sorted(loss_part):
        found += [i for i in graph.nodes[k].inputs if i in produced and i not in found]
    return found


def run(args) -> int:
    from pathlib import Path

    from ..errors import EdgetrainError, InputError
    from ..trainer import open_artifacts
    from .eval import trained_checkpoint

    folder = Path(args.output).resolve().parent
    if not folder.is_dir():
        raise InputError(f"cannot write '{args.output}': folder '{folder}' does not exist")
    checkpoint = args.checkpoint or trained_checkpoint(args.artifacts)
    _, module, _ = open_artifacts(args.artifacts, checkpoint, optimizer=False)
    try:
        eval_graph = module.eval().graph()
    except EdgetrainError:
        raise InputError(f"artifact folder '{args.artifacts}' has no eval model to export from") from None
    outputs = args.outputs or forward_outputs(eval_graph, module.input_names())
    if not outputs:
        raise InputError("cannot tell the model's outputs from its loss: name them with --outputs")
    module.export_model_for_inferencing(args.output, outputs)
    print(f"wrote {args.output} (outputs {outputs}; parameters from {checkpoint or 'the artifact checkpoint'})")
    return 0
