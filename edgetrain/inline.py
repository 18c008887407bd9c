"""Ops ONNX defines as functions, run through their function body when edgetrain's op table lacks them.

Many ONNX ops (Attention, RotaryEmbedding, Swish, Celu, Shrink, Softsign, ...) come with a body made of other
ONNX ops (``OpSchema.has_function``), some built for the node's attributes and input types
(``has_context_dependent_function``). At load, a node whose (domain, op) is not in the op table but whose
schema at the model's opset has such a body is replaced by that body: formal inputs and outputs become the
node's, intermediates get fresh names under the node's name, attribute references (``ref_attr_name``) take the
node's attribute or its default. A body's own function ops are expanded the same way, up to ``MAX_DEPTH``
levels. Model-local functions (``ModelProto.functions``) inline the same way. Ops in the table keep their own
kernels; gradients come from the body's ops.

Only graph nodes are rewritten, from bodies the installed onnx package builds: nothing in a model becomes code.
"""
from __future__ import annotations

import onnx
import onnx.defs
from onnx import helper

from .errors import UnsupportedOpError
from .ops import OP_TABLE
from .opset import COMPATIBLE, TARGET

MAX_DEPTH = 8       # nesting levels of function ops inside function bodies (onnx's own nest 2-3 deep)
# nodes a graph may reach by inlining: a model's local functions calling each other k times per level would
# otherwise grow it k**MAX_DEPTH-fold from a small file
MAX_NODES = 200_000


def _domain(d: str) -> str:
    return "" if d == "ai.onnx" else d


def _schema(op_type: str, domain: str, opset: int | None):
    if opset is None:
        return None
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def is_function_op(op_type: str, domain: str, opset: int | None) -> bool:
    """Whether ONNX defines ``op_type`` at ``opset`` of ``domain`` by a function body (plain or built for the
    node's input types)."""
    s = _schema(op_type, _domain(domain), opset)
    return s is not None and bool(s.has_function or s.has_context_dependent_function)


def function_ops() -> list[tuple[str, str, bool, tuple[str, ...]]]:
    """(domain, op, whether its body is built for the input types, ops its body needs that edgetrain lacks) of
    every op the installed onnx defines (newest version) by a function body and the table lacks. A body built
    for the input types is sampled with float inputs; one onnx builds only for other types lists no ops."""
    found = []
    for s in onnx.defs.get_all_schemas():
        key = (_domain(s.domain), s.name)
        if key in OP_TABLE or s.deprecated or not (s.has_function or s.has_context_dependent_function):
            continue
        body = s.function_body if s.has_function else _sample_body(s)
        missing = tuple(sorted({n.op_type for n in body.node if (_domain(n.domain), n.op_type) not in OP_TABLE
                                and not is_function_op(n.op_type, n.domain, s.since_version)}))
        found.append((*key, not s.has_function, missing))
    return sorted(found)


def _sample_body(s) -> onnx.FunctionProto:
    """A context-dependent body as built for float inputs of unknown shape (empty if onnx builds none)."""
    node = helper.make_node(s.name, [f"x{i}" for i in range(s.min_input)], ["y"], domain=s.domain)
    types = [helper.make_tensor_type_proto(onnx.TensorProto.FLOAT, None).SerializeToString()] * s.min_input
    try:
        built = s.get_context_dependent_function_with_opset_version(s.since_version, node.SerializeToString(), types)
    except Exception:  # noqa: BLE001 - a builder that needs other types: the listing says nothing of its ops
        return onnx.FunctionProto()
    body = onnx.FunctionProto()
    body.ParseFromString(built)
    return body


def _newest_at_most(versions, opset: int) -> int | None:
    fitting = [v for v in versions if v <= opset]
    return max(fitting) if fitting else None


class _Inliner:
    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.opsets = {_domain(o.domain): o.version for o in model.opset_import}
        self.local = {(_domain(f.domain), f.name): f for f in model.functions}
        self.taken: set[str] = set()        # value and node names in use (filled by run)
        self.origin: dict[str, str] = {}     # inner node name -> the model's node it came from

    def fresh(self, base: str) -> str:
        name, k = base, 0
        while name in self.taken:
            k += 1
            name = f"{base}_{k}"
        self.taken.add(name)
        return name

    def expandable(self, n: onnx.NodeProto) -> bool:
        key = (_domain(n.domain), n.op_type)
        return key not in OP_TABLE and (key in self.local
                                         or is_function_op(n.op_type, key[0], self.opsets.get(key[0])))

    def label(self, n: onnx.NodeProto) -> str:
        domain = _domain(n.domain)
        return self.origin.get(n.name) or (f"node '{n.name}' ({n.op_type}, {domain or 'ai.onnx'} opset "
                                           f"{self.opsets.get(domain)})")

    def run(self) -> onnx.ModelProto:
        g = self.model.graph
        self.taken = ({v.name for v in g.input} | {v.name for v in g.output} | {t.name for t in g.initializer}
                      | {n.name for n in g.node} | {x for n in g.node for x in (*n.input, *n.output)})
        for i, n in enumerate(g.node):
            if not n.name:
                n.name = self.fresh(f"{n.op_type}_{i}")
        for depth in range(MAX_DEPTH + 1):
            todo = [n for n in g.node if self.expandable(n)]
            if not todo:
                return self.model
            if depth == MAX_DEPTH:
                raise UnsupportedOpError(f"{self.label(todo[0])}: its ONNX function body nests function ops more "
                                         f"than {MAX_DEPTH} levels deep (op '{todo[0].op_type}' at that depth)")
            types = self.known_types() if any(self.needs_types(n) for n in todo) else {}
            nodes = []
            for n in g.node:
                nodes.extend(self.expand(n, types) if self.expandable(n) else [n])
                if len(nodes) > MAX_NODES:
                    raise UnsupportedOpError(f"{self.label(n)}: inlining function bodies grows the graph past "
                                             f"{MAX_NODES:,} nodes")
            del g.node[:]
            g.node.extend(nodes)
        return self.model

    def needs_types(self, n: onnx.NodeProto) -> bool:
        key = (_domain(n.domain), n.op_type)
        if key in self.local:
            return False
        s = _schema(n.op_type, key[0], self.opsets.get(key[0]))
        return not s.has_function

    def known_types(self) -> dict[str, onnx.TypeProto]:
        """Element types and shapes of the graph's values, as far as onnx's shape inference finds them."""
        try:
            inferred = onnx.shape_inference.infer_shapes(self.model).graph
        except Exception:  # noqa: BLE001 - inference is a hint here; a body that needs a type refuses below
            inferred = self.model.graph
        types = {t.name: helper.make_tensor_type_proto(t.data_type, list(t.dims)) for t in inferred.initializer}
        for vi in (*inferred.input, *inferred.value_info, *inferred.output):
            if vi.type.WhichOneof("value"):
                types[vi.name] = vi.type
        return types

    def body(self, n: onnx.NodeProto, types) -> tuple[onnx.FunctionProto, dict]:
        """The node's function body, and the defaults of the attributes the body may refer to."""
        key = (_domain(n.domain), n.op_type)
        if key in self.local:
            f = self.local[key]
            return f, {a.name: a for a in f.attribute_proto}
        opset = self.opsets[key[0]]
        s = _schema(n.op_type, key[0], opset)
        defaults = {name: a.default_value for name, a in s.attributes.items() if a.default_value.name}
        f = onnx.FunctionProto()
        if s.has_function:
            # the body for the model's opset; an op whose only body needs a newer opset (Shrink's, 18, at
            # opset 9) gets that, and check_opsets decides whether it means the same at the model's
            version = _newest_at_most(s.function_opset_versions, opset) or min(s.function_opset_versions)
            f.ParseFromString(s.get_function_with_opset_version(version))
            if f.node:
                return f, defaults
            raise UnsupportedOpError(f"{self.label(n)}: onnx has no function body for it at opset {opset}")
        missing = [x for x in n.input if x and x not in types]
        if missing:
            raise UnsupportedOpError(f"{self.label(n)}: edgetrain runs it through its ONNX function body, which "
                                     f"is built for the input types, and onnx's shape inference finds no type "
                                     f"for input '{missing[0]}' (declare it in the model's value_info)")
        input_types = [(types[x] if x else onnx.TypeProto()).SerializeToString() for x in n.input]
        version = _newest_at_most(s.context_dependent_function_opset_versions, opset) or s.since_version
        try:
            f.ParseFromString(s.get_context_dependent_function_with_opset_version(version, n.SerializeToString(),
                                                                                  input_types))
        except Exception as e:  # noqa: BLE001 - onnx's builder refuses attribute/type combinations it lacks
            raise UnsupportedOpError(f"{self.label(n)}: onnx cannot build its function body for these inputs "
                                     f"and attributes: {e}") from None
        if not f.node:
            raise UnsupportedOpError(f"{self.label(n)}: onnx builds no function body for these inputs and "
                                     "attributes")
        return f, defaults

    def check_opsets(self, n: onnx.NodeProto, f: onnx.FunctionProto):
        """A body written for another opset than the model's must mean the same under the model's. edgetrain
        reads every ai.onnx opset from 13 on as one form (``edgetrain.opset``), so only a body or model below
        13 is compared op by op, as ``opset.upgrade`` does."""
        for o in f.opset_import:
            d, version = _domain(o.domain), o.version
            if d not in self.opsets:
                self.model.opset_import.append(helper.make_opsetid(o.domain, version))
                self.opsets[d] = version
                continue
            model = self.opsets[d]
            if model == version or (d == "" and min(model, version) >= TARGET):
                continue
            target = min(model, TARGET) if d == "" else model
            for inner in f.node:
                if _domain(inner.domain) != d or (d == "" and inner.op_type in COMPATIBLE):
                    continue
                old, new = _schema(inner.op_type, d, version), _schema(inner.op_type, d, target)
                if new is None and d == "" and version >= TARGET:
                    continue    # an op newer than the model's opset is read in its one (13+) form
                if old is not None and (new is None or old.since_version != new.since_version):
                    raise UnsupportedOpError(
                        f"{self.label(n)}: its ONNX function body uses {inner.op_type} as defined at opset "
                        f"{version}, which differs at the model's opset {model}")

    def expand(self, n: onnx.NodeProto, types) -> list[onnx.NodeProto]:
        f, defaults = self.body(n, types)
        self.check_opsets(n, f)
        origin = self.label(n)
        rename = {formal: (n.input[k] if k < len(n.input) else "") for k, formal in enumerate(f.input)}
        for k, formal in enumerate(f.output):     # an omitted optional output: a fresh name, pruned if unused
            given_output = n.output[k] if k < len(n.output) else ""
            rename[formal] = given_output or self.fresh(f"{n.name}/{formal}")
        given = {a.name: a for a in n.attribute}
        out = []
        for inner in f.node:
            for a in inner.attribute:
                if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
                    raise UnsupportedOpError(f"{origin}: its ONNX function body holds a subgraph (op "
                                             f"'{inner.op_type}'), which edgetrain does not run")
            key = (_domain(inner.domain), inner.op_type)
            if key not in OP_TABLE and key not in self.local and not is_function_op(inner.op_type, key[0],
                                                                                     self._inner_opset(f, key[0])):
                raise UnsupportedOpError(
                    f"{origin}: edgetrain has no kernel for {n.op_type} and runs ONNX's function body for it, "
                    f"which needs op '{inner.op_type}' ({key[0] or 'ai.onnx'}) that edgetrain does not support. "
                    "`edgetrain ops` lists the supported ops")
            for x in (*inner.input, *inner.output):
                if x and x not in rename:
                    rename[x] = self.fresh(f"{n.name}/{x}")
            attrs = []
            for a in inner.attribute:
                if a.ref_attr_name:
                    src = given.get(a.ref_attr_name, defaults.get(a.ref_attr_name))
                    if src is None:
                        continue        # neither given nor defaulted: the inner op's own default applies
                    resolved = onnx.AttributeProto()
                    resolved.CopyFrom(src)
                    resolved.name = a.name
                    a = resolved
                attrs.append(a)
            new = onnx.NodeProto()
            new.CopyFrom(inner)
            del new.input[:], new.output[:], new.attribute[:]
            new.input.extend(rename[x] if x else "" for x in inner.input)
            new.output.extend(rename[x] if x else "" for x in inner.output)
            new.attribute.extend(attrs)
            new.name = self.fresh(f"{n.name}/{inner.name or inner.op_type}")
            self.origin[new.name] = origin
            out.append(new)
        return out

    @staticmethod
    def _inner_opset(f: onnx.FunctionProto, domain: str) -> int | None:
        return next((o.version for o in f.opset_import if _domain(o.domain) == domain), None)


def inline_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every node of a function op outside the op table replaced by its function body (the
    same model if it has none; else a copy). Refuses a body needing an op edgetrain lacks, naming the model's
    node, its op and the missing one."""
    probe = _Inliner(model)
    if not any(probe.expandable(n) for n in model.graph.node):
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return _Inliner(copy).run()
