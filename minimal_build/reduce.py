"""Operator reduction: which ops and element types a set of training artifacts needs, in ORT's config format.

``collect`` reads artifact folders (``training_model``, ``eval_model``, ``optimizer_model`` as ``.onnx`` or
``.etm``) or single model files and returns, per op, its domain, since-version and the element types seen at
each input and output. Which ops are needed comes from the op table (``edgetrain.ops``), not the kernels.
``write_configs`` writes ONNX Runtime's two reduced-build files (ORT_FORMATS.md §5), which ORT's own
``reduced_build_config_parser`` reads:

- ``required_operators.config``: ``domain;since;Op1,Op2`` lines, sorted by domain, since-version and op;
- ``required_operators_and_types.config``: the same with ``Op{"inputs": {"0": ["float"]}, "outputs": ...}``.

Both start with a ``# Generated from model/s:`` header listing the model files. ``parse_config`` reads either
back. ``compact_artifacts`` rewrites an artifact folder as compact models (``edgetrain.compact``) plus its
checkpoint, which is what a device with the trimmed runtime loads.

Choices, and why:

- Since-version: the ONNX schema's since-version at the opset the model imports (ReduceMean in an opset-17 model
  is ``ai.onnx;13``), which is what ORT writes; it comes from ``onnx.defs`` when onnx knows the op. Ops onnx does
  not define (``com.microsoft`` training ops, ``MaxPoolGrad``) take ``OpDef.since`` from the op table.
- Types: ORT tracks one or two inputs of a hand-picked list of ops; edgetrain records the element type of every
  input and output of every op (a superset ORT's parser accepts), since a trimmed runtime compiles kernels for
  whole signatures (Cast's output type, Gather's index type). Types are the planner's (``plan.specialize``:
  the op table's shape rules with symbolic dimensions bound to 1, or to ``dims``), so they are what the
  runtime will see; tensor-sequence inputs (optimizer models) count as their element type, as in ORT.
  Folding a constant subgraph through an op that has only a kernel (the transformer's Concat of shape pieces)
  runs that kernel, as planning does; the op list itself comes from the op table alone.
- Every node counts, including ones the planner folds away (Shape, Constant), as in ORT's configs.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from edgetrain import atomic, checkpoint, compact
from edgetrain.errors import EdgetrainError, UnsupportedOpError
from edgetrain.ir import Graph, SequenceType, TensorType
from edgetrain.ops import OpDef, lookup
from edgetrain.plan.specialize import specialize

ARTIFACT_MODELS = ("training_model", "eval_model", "optimizer_model")
CHECKPOINTS = ("checkpoint", "nominal_checkpoint")
OPS_CONFIG = "required_operators.config"
TYPES_CONFIG = "required_operators_and_types.config"
HEADER = "# Generated from model/s:"

# numpy dtype name -> the C++ type name ORT's configs use
CPP_TYPE = {"float32": "float", "float64": "double", "float16": "MLFloat16", "bool": "bool",
            "int8": "int8_t", "int16": "int16_t", "int32": "int32_t", "int64": "int64_t",
            "uint8": "uint8_t", "uint16": "uint16_t", "uint32": "uint32_t", "uint64": "uint64_t"}


class ConfigError(EdgetrainError):
    """A reduced-build config file that cannot be parsed."""


@dataclass
class OpTypes:
    """Element types (ORT's C++ names) seen per input and output index of one op."""
    inputs: dict[int, set[str]] = field(default_factory=dict)
    outputs: dict[int, set[str]] = field(default_factory=dict)

    def add(self, other: OpTypes) -> None:
        for mine, theirs in ((self.inputs, other.inputs), (self.outputs, other.outputs)):
            for i, types in theirs.items():
                mine.setdefault(i, set()).update(types)

    def to_json(self) -> str | None:
        """ORT's spelling: indices as strings in numeric order, types sorted; None when nothing is known."""
        info = {key: {str(i): sorted(part[i]) for i in sorted(part) if part[i]}
                for key, part in (("inputs", self.inputs), ("outputs", self.outputs))}
        info = {k: v for k, v in info.items() if v}
        return json.dumps(info) if info else None


OpKey = tuple[str, int, str]     # (domain spelled out, e.g. "ai.onnx"; since-version; op type)


@dataclass
class RequiredOps:
    """The ops (and their types) some models need, and the model files they came from."""
    models: list[str] = field(default_factory=list)
    ops: dict[OpKey, OpTypes] = field(default_factory=dict)

    def add(self, key: OpKey, types: OpTypes) -> None:
        self.ops.setdefault(key, OpTypes()).add(types)

    def update(self, other: RequiredOps) -> RequiredOps:
        self.models += [m for m in other.models if m not in self.models]
        for key, types in other.ops.items():
            self.add(key, types)
        return self

    def by_domain(self) -> dict[str, dict[int, list[str]]]:
        """{domain: {since: [ops, sorted]}}, domains and since-versions sorted."""
        out: dict[str, dict[int, list[str]]] = {}
        for domain, since, op in sorted(self.ops):
            out.setdefault(domain, {}).setdefault(since, []).append(op)
        return out


# -- collecting -----------------------------------------------------------------------------------------------
def model_files(paths) -> list[Path]:
    """The model files behind ``paths``: an artifact folder gives its training, eval and optimizer models."""
    files = []
    for p in map(Path, paths):
        if p.is_dir():
            found = [f for f in (_artifact_model(p, m) for m in ARTIFACT_MODELS) if f is not None]
            if not found:
                raise EdgetrainError(f"folder '{p}' holds no artifact models: expected "
                                     f"{', '.join(m + '.onnx' for m in ARTIFACT_MODELS)} (or .etm)")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise EdgetrainError(f"'{p}' is neither an artifact folder nor a model file")
    return files


def _artifact_model(folder: Path, model: str) -> Path | None:
    for suffix in (".onnx", compact.SUFFIX):        # the ONNX file is the source when both are there
        if (folder / f"{model}{suffix}").is_file():
            return folder / f"{model}{suffix}"
    return None


def collect(paths, dims: dict[str, int] | None = None) -> RequiredOps:
    """The ops and types needed by the models in ``paths`` (artifact folders or model files).

    Parameters
    ----------
    paths : iterable of str or os.PathLike
    dims : dict, optional
        Sizes for symbolic dimensions when computing types (default 1 each).

    Raises
    ------
    UnsupportedOpError
        A node's op is not in edgetrain's op table (names the op, node and model file).
    """
    required = RequiredOps()
    for f in model_files(paths):
        required.update(collect_graph(compact.load_graph(f), str(f), dims))
    return required


def collect_graph(graph: Graph, model: str, dims: dict[str, int] | None = None) -> RequiredOps:
    """The ops and types of one graph; ``model`` names it in the header and in errors."""
    ops = []
    for node in graph.nodes:
        try:
            ops.append(lookup(node, graph.opset(node.domain)))
        except UnsupportedOpError as e:
            raise UnsupportedOpError(f"model '{model}': {e}. The minimal build holds only ops edgetrain "
                                     "implements; change the model or add the op to edgetrain.ops") from None
    try:
        types = specialize(graph, _input_types(graph, dims or {}), [v.name for v in graph.outputs]).types
    except UnsupportedOpError as e:
        raise UnsupportedOpError(f"model '{model}': {e}") from None
    except EdgetrainError as e:
        raise EdgetrainError(f"model '{model}': cannot compute its types with symbolic dimensions set to "
                             f"{dims or 1}: {e}; pass sizes for them (--dim NAME=SIZE)") from None
    required = RequiredOps([model])
    for node, op in zip(graph.nodes, ops):
        required.add(_key(op, node.domain, graph.opset(node.domain)), OpTypes(
            {i: {_cpp(types[n])} for i, n in enumerate(node.inputs) if n in types},
            {i: {_cpp(types[n])} for i, n in enumerate(node.outputs) if n in types}))
    return required


def _input_types(graph: Graph, dims: dict[str, int]) -> dict[str, TensorType]:
    """Graph inputs with symbolic dimensions bound; a tensor sequence is bound as a flat tensor, as the
    runtime binds an optimizer model's parameter sequences."""
    types = {}
    for v in graph.inputs:
        if isinstance(v.type, SequenceType):
            types[v.name] = TensorType(v.type.dtype, (1,))
        else:
            types[v.name] = TensorType(v.type.dtype, tuple(d if isinstance(d, int) else int(dims.get(d, 1))
                                                           for d in v.type.shape))
    return types


def _cpp(t: TensorType) -> str:
    return CPP_TYPE[t.dtype.name]


def _key(op: OpDef, domain: str, opset: int) -> OpKey:
    return (domain or "ai.onnx", since_version(op, domain, opset), op.op_type)


def since_version(op: OpDef, domain: str, opset: int) -> int:
    """The since-version of ``op`` at ``opset``: from ONNX's schemas where they define it, else the op table's."""
    if domain in ("", "ai.onnx", "ai.onnx.ml"):
        try:
            from ..onnx_io import schema_since_version
        except ImportError:
            return op.since
        since = schema_since_version(op.op_type, opset, "" if domain == "ai.onnx" else domain)
        if since is not None:
            return since
    return op.since


# -- config files ---------------------------------------------------------------------------------------------
def format_config(required: RequiredOps, with_types: bool) -> str:
    """The text of ``required_operators.config`` (or, ``with_types``, ``required_operators_and_types.config``)."""
    lines = [HEADER] + [f"# - {m}" for m in sorted(required.models)]
    for domain, versions in required.by_domain().items():
        for since, ops in versions.items():
            entries = [op + ((required.ops[(domain, since, op)].to_json() or "") if with_types else "")
                       for op in ops]
            lines.append(f"{domain};{since};{','.join(entries)}")
    return "\n".join(lines) + "\n"


def write_configs(required: RequiredOps, folder) -> tuple[Path, Path]:
    """Write both config files into ``folder`` (created if needed); return their paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / OPS_CONFIG, folder / TYPES_CONFIG
    for path, with_types in zip(paths, (False, True)):
        atomic.write_text(path, format_config(required, with_types))
    return paths


def parse_config(source) -> RequiredOps:
    """Read a config file (path) or its text (str containing a newline) in ORT's format, with or without types.

    Raises
    ------
    ConfigError
        A malformed line (names the line number and what is wrong), or a directive (``!...``) edgetrain's
        minimal build does not use.
    """
    if isinstance(source, str) and "\n" in source:
        text, where = source, "config text"
    else:
        text, where = Path(source).read_text(encoding="utf-8"), f"config '{os.fspath(source)}'"
    required = RequiredOps()
    in_header = False
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith("#"):
            in_header = line == HEADER or (in_header and line.startswith("# - "))
            if in_header and line.startswith("# - "):
                required.models.append(line[4:])
            continue
        if not line:
            continue
        if line.startswith("!"):
            raise ConfigError(f"{where} line {number}: directive '{line.split(';')[0]}' is not used by "
                              "edgetrain's minimal build")
        parts = line.split(";", 2)
        if len(parts) != 3:
            raise ConfigError(f"{where} line {number}: expected 'domain;opset;Op1,Op2,...', got {line!r:.80}")
        domain, versions, ops = (p.strip() for p in parts)
        try:
            sinces = [int(v) for v in versions.split(",")]
        except ValueError:
            raise ConfigError(f"{where} line {number}: opset {versions!r} is not a comma-separated list of "
                              "integers") from None
        for op, types in _split_ops(ops, f"{where} line {number}"):
            for since in sinces:
                required.add((domain, since, op), types)
    return required


def _split_ops(text: str, where: str):
    """(op, OpTypes) for each entry of ``Op1,Op2{json},Op3``; commas inside the JSON do not split."""
    entries, depth, start = [], 0, 0
    for i, ch in enumerate(text + ","):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"{where}: unmatched '}}' in {text!r:.80}")
        elif ch == "," and depth == 0:
            entries.append(text[start:i].strip())
            start = i + 1
    if depth:
        raise ConfigError(f"{where}: unmatched '{{' in {text!r:.80}")
    for entry in entries:
        name, brace, info = entry.partition("{")
        name = name.strip()
        if not name:
            raise ConfigError(f"{where}: empty op name in {text!r:.80}")
        yield name, _parse_types(brace + info, f"{where}, op {name}") if brace else OpTypes()


def _parse_types(text: str, where: str) -> OpTypes:
    try:
        info = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{where}: type information is not valid JSON ({e})") from None
    if not isinstance(info, dict) or set(info) - {"inputs", "outputs"}:
        raise ConfigError(f"{where}: type information must map 'inputs'/'outputs' to {{index: [types]}}, got "
                          f"{text!r:.80} (ORT's 'custom' entries are not used by edgetrain)")
    parts = []
    for key in ("inputs", "outputs"):
        part = info.get(key, {})
        if not isinstance(part, dict) or not all(k.isdigit() and isinstance(v, list) for k, v in part.items()):
            raise ConfigError(f"{where}: '{key}' must map indices to lists of type names, got {part!r:.80}")
        parts.append({int(k): set(v) for k, v in part.items()})
    return OpTypes(*parts)


# -- compact artifacts ----------------------------------------------------------------------------------------
def compact_artifacts(folder, out_folder) -> list[Path]:
    """Rewrite the artifact folder ``folder`` into ``out_folder``: ``training_model.etm``, ``eval_model.etm``,
    ``optimizer_model.etm`` (those present) and the checkpoint(s), checked and copied as they are.

    Every node's op must be in edgetrain's op table (else ``UnsupportedOpError`` naming op, node and model).
    """
    folder, out = Path(folder), Path(out_folder)
    models = [(m, _artifact_model(folder, m)) for m in ARTIFACT_MODELS]
    if not any(f for _, f in models):
        raise EdgetrainError(f"folder '{folder}' holds no artifact models: expected "
                             f"{', '.join(m + '.onnx' for m in ARTIFACT_MODELS)} (or .etm)")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for model, source in models:
        if source is not None:
            written.append(compact_model(source, out / f"{model}{compact.SUFFIX}"))
    for name in CHECKPOINTS:
        if (folder / name).is_file():
            data = (folder / name).read_bytes()
            checkpoint.loads(data)          # refuse to ship a checkpoint the device could not read
            checkpoint.files.write_atomic(out / name, data)
            written.append(out / name)
    return written


def compact_model(source, target) -> Path:
    """Convert one model file (ONNX or compact) to a compact model at ``target``, checking its ops."""
    graph = compact.load_graph(source)
    for node in graph.nodes:
        try:
            lookup(node, graph.opset(node.domain))
        except UnsupportedOpError as e:
            raise UnsupportedOpError(f"model '{source}': {e}") from None
    compact.save(graph, target)
    return Path(target)
