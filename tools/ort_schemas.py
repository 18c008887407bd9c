"""Record, from ONNX Runtime 1.19.2 itself, the schemas of its own ops that edgetrain's ORT-format writer needs.

ORT writes, for each op in an ``.ort`` model, which formal inputs and outputs each kernel type string binds
(its kernel type-string resolver), computed from the op's schema. ONNX's ops have their schemas in
``onnx.defs``; onnxruntime's training and contrib ops do not, so this tool has ORT 1.19.2 (the ort119 venv of
tests/ort119.py) save training, eval and optimizer models as ``.ort`` (graph optimizations off), reads back
the resolver entries and node since-versions it wrote, and prints ``edgetrain/ort_schemas.py``:

    python tools/ort_schemas.py > edgetrain/ort_schemas.py

The models: edgetrain's artifacts and ORT's own (``$EDGETRAIN_SHARED/ort_artifacts``) for the bench models,
and edgetrain's artifacts for small graphs that make the other gradient ops appear.
tests/test_ort_format.py checks the table against ORT again, for the ops of the models it writes.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnx.defs
from onnx import TensorProto, helper

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
SHARED = Path(os.environ.get("EDGETRAIN_SHARED", ROOT.parent / "shared"))

_HARVEST = '''
sys.path.append(os.path.join(_pkg, "tools", "ort_format_model"))
from ort_flatbuffers_py.fbs import InferenceSession as _IS
found = {}
for path in ARGS["models"]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.optimized_model_filepath = path + ".ort"
    so.add_session_config_entry("session.save_model_format", "ORT")
    ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    s = _IS.InferenceSession.GetRootAs(open(path + ".ort", "rb").read(), 0)
    g = s.Model().Graph()
    variadic = {}
    for i in range(g.NodesLength()):
        n = g.Nodes(i)
        key = "%s:%s:%d" % (n.Domain().decode(), n.OpType().decode(), n.SinceVersion())
        counts = [int(c) for c in n.InputArgCountsAsNumpy()] if n.InputArgCountsLength() else []
        variadic[key] = variadic.get(key, False) or (bool(counts) and counts[-1] > 1)
    r = s.KernelTypeStrResolver()
    for i in range(r.OpKernelTypeStrArgsLength()):
        e = r.OpKernelTypeStrArgs(i)
        args = {}
        for j in range(e.KernelTypeStrArgsLength()):
            k = e.KernelTypeStrArgs(j)
            args[k.KernelTypeStr().decode()] = [[k.Args(m).ArgType(), k.Args(m).Index()] for m in range(k.ArgsLength())]
        op_id = e.OpId().decode()
        found[op_id] = {"args": args, "variadic": variadic.get(op_id, False)}
OUT["found"] = found
'''


def _small_models() -> dict[str, tuple[onnx.ModelProto, list[str]]]:
    """Graphs whose training artifacts hold the gradient ops the bench models do not (ResizeGrad has no CPU
    kernel in ORT 1.19.2, so ORT cannot load a model with it)."""
    rng = np.random.default_rng(0)

    def init(name, *shape):
        return helper.make_tensor(name, TensorProto.FLOAT, shape, rng.standard_normal(shape).ravel().tolist())

    def model(nodes, inits, x_shape, y_shape, extra=()):
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
                              inits + list(extra))
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

    acts = model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                  helper.make_node("LeakyRelu", ["h"], ["a"], alpha=0.1),
                  helper.make_node("Sigmoid", ["a"], ["s"]), helper.make_node("Tanh", ["s"], ["t"]),
                  helper.make_node("Softmax", ["t"], ["sm"]), helper.make_node("LogSoftmax", ["sm"], ["y"])],
                 [init("w", 4, 4)], [2, 4], [2, 4])
    idx = helper.make_tensor("idx", TensorProto.INT64, [2, 2], [0, 1, 1, 0])
    gidx = helper.make_tensor("gidx", TensorProto.INT64, [2], [0, 2])
    starts = helper.make_tensor("starts", TensorProto.INT64, [1], [0])
    ends = helper.make_tensor("ends", TensorProto.INT64, [1], [2])
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    ratio = helper.make_tensor("ratio", TensorProto.FLOAT, [], [0.25])
    train = helper.make_tensor("train", TensorProto.BOOL, [], [True])
    tensor = model([helper.make_node("Mul", ["x", "w"], ["m"]),
                    helper.make_node("GatherElements", ["m", "idx"], ["ge"], axis=1),
                    helper.make_node("Gather", ["m", "gidx"], ["ga"], axis=1),
                    helper.make_node("Slice", ["ga", "starts", "ends", "axes"], ["sl"]),
                    helper.make_node("Add", ["ge", "sl"], ["ad"]),
                    helper.make_node("Dropout", ["ad", "ratio", "train"], ["dr", "mask"]),
                    helper.make_node("ReduceMean", ["dr"], ["y"], keepdims=0)],
                   [init("w", 2, 4), idx, gidx, starts, ends, axes, ratio, train], [2, 4], [])
    norm = model([helper.make_node("MatMul", ["x", "w"], ["h"]),
                  helper.make_node("LayerNormalization", ["h", "g", "b"], ["ln", "mu", "isd"], axis=-1),
                  helper.make_node("Gelu", ["ln"], ["y"], domain="com.microsoft")],
                 [init("w", 4, 4), init("g", 4), init("b", 4)], [2, 4], [2, 4])
    norm.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    pool = model([helper.make_node("Mul", ["x", "w"], ["m"]),
                  helper.make_node("AveragePool", ["m"], ["p"], kernel_shape=[2, 2]),
                  helper.make_node("ReduceMean", ["p"], ["y"], keepdims=0)],
                 [init("w", 1, 1, 4, 4)], [1, 1, 4, 4], [])
    return {"pool": (pool, ["w"]), "acts": (acts, ["w"]), "tensor": (tensor, ["w"]), "norm": (norm, ["w", "g", "b"])}


def _write_artifacts(folder: Path) -> list[str]:
    from edgetrain import artifacts, checkpoint, onnxblock

    paths = []
    for model in ("mlp", "cnn", "mobilenet", "transformer", "digits"):
        ort_dir = SHARED / "ort_artifacts" / model
        ort_copy = folder / f"{model}.ort119"      # ORT writes each .ort beside its model: never into shared/
        ort_copy.mkdir(parents=True)
        for p in sorted(ort_dir.glob("*.onnx")):
            (ort_copy / p.name).write_bytes(p.read_bytes())
            paths.append(str(ort_copy / p.name))
        ckpt = checkpoint.load(ort_dir / "checkpoint")
        out = folder / model
        artifacts.generate_artifacts(str(SHARED / "models" / f"{model}.onnx"), requires_grad=list(ckpt.trainable),
                                     frozen_params=list(ckpt.frozen), loss=artifacts.LossType.CrossEntropyLoss,
                                     optimizer=onnxblock.optim.AdamW(clip_grad=onnxblock.optim.ClipGradNorm(1.0)),
                                     artifact_directory=out)
        paths += [str(p) for p in sorted(out.glob("*.onnx"))]
    for name, (m, trainable) in _small_models().items():
        out = folder / name
        artifacts.generate_artifacts(m, requires_grad=trainable, loss=artifacts.LossType.MSELoss,
                                     optimizer=artifacts.OptimType.SGD, artifact_directory=out)
        paths += [str(p) for p in sorted(out.glob("*.onnx"))]
    return paths


def _onnx_defines(domain: str, op_type: str) -> bool:
    try:
        onnx.defs.get_schema(op_type, 30, domain)
        return True
    except onnx.defs.SchemaError:
        return False


def harvest() -> dict:
    import ort119
    with tempfile.TemporaryDirectory() as tmp:
        paths = _write_artifacts(Path(tmp))
        found = ort119.run(_HARVEST, {"models": paths})["found"]
    table: dict = {}
    for op_id, entry in found.items():
        domain, op_type, since = op_id.split(":")
        if _onnx_defines(domain, op_type):
            continue
        ins, outs = {}, {}
        for type_str, args in entry["args"].items():
            for kind, index in args:
                (ins if kind == 0 else outs)[index] = type_str
        if sorted(ins) != list(range(len(ins))) or sorted(outs) != list(range(len(outs))):
            raise SystemExit(f"{op_id}: formal parameters are not numbered 0..n-1: {entry}")
        ins_t = [ins[i] for i in range(len(ins))]
        if entry["variadic"]:
            ins_t[-1] += "*"
        table.setdefault((domain, op_type), {})[int(since)] = (tuple(ins_t), tuple(outs[i] for i in range(len(outs))))
    return table


def main() -> None:
    table = harvest()
    print('"""onnxruntime\'s own ops (training and contrib) as ONNX Runtime 1.19.2 registers their schemas: for each\n'
          "(domain, op_type) and since-version, the kernel type string of each formal input and output (a type\n"
          "constraint's name, or the parameter's name where it has none; a trailing \"*\" marks a variadic last\n"
          "input). The ORT-format writer needs them for node since-versions, input arg counts and the kernel\n"
          "type-string resolver. Generated by tools/ort_schemas.py from what ORT 1.19.2 writes; do not edit.\n"
          '"""\n\nORT_SCHEMAS: dict[tuple[str, str], dict[int, tuple[tuple[str, ...], tuple[str, ...]]]] = {')
    for key in sorted(table):
        line = f"    {key!r}: {{{', '.join(f'{v}: {table[key][v]!r}' for v in sorted(table[key]))}}},"
        if len(line) <= 110:
            print(line)
            continue
        print(f"    {key!r}: {{")
        for v in sorted(table[key]):
            ins, outs = table[key][v]
            print(f"        {v}: ({ins!r},\n            {outs!r}),")
        print("    },")
    print("}")


if __name__ == "__main__":
    main()
