"""edgetrain reduce: ORT-format reduced-build configs that ORT's own parser reads and that name what ORT 1.19.2
names for the same models; unions over artifact sets; clear errors for ops outside the op table."""
from pathlib import Path

import numpy as np
import pytest
from conftest import BENCH_MODELS
from edgetrain.minimal_build import reduce

from edgetrain import compact
from edgetrain.cli import main
from edgetrain.errors import UnsupportedOpError
from edgetrain.ir import Graph, Node, TensorType, Value

ORT_SETS = BENCH_MODELS + ["mlp_sgd"]


def _art(shared, name) -> Path:
    return shared / "ort_artifacts" / name


def _op_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def _op_names(entries: str) -> list[str]:
    """Op names of ``Op1,Op2{json},Op3``, JSON (with its own commas and braces) dropped."""
    names, depth, current = [], 0, ""
    for ch in entries + ",":
        depth += (ch == "{") - (ch == "}")
        if ch == "," and depth == 0:
            names.append(current)
            current = ""
        elif depth == 0 and ch != "}":
            current += ch
    return names


@pytest.mark.arm64
def test_configs_parse_back_sorted_with_a_header_naming_the_models(shared, tmp_path):
    required = reduce.collect([_art(shared, "mlp"), _art(shared, "cnn")])
    ops_path, types_path = reduce.write_configs(required, tmp_path)
    assert (ops_path.name, types_path.name) == ("required_operators.config", "required_operators_and_types.config")
    models = sorted(str(_art(shared, s) / f"{m}.onnx") for s in ("mlp", "cnn")
                    for m in ("training_model", "eval_model", "optimizer_model"))
    for path, with_types in ((ops_path, False), (types_path, True)):
        text = path.read_text()
        assert text.splitlines()[: 1 + len(models)] == ["# Generated from model/s:"] + [f"# - {m}" for m in models]
        back = reduce.parse_config(path)
        assert back.models == models
        assert set(back.ops) == set(required.ops)
        if with_types:
            assert back.ops == required.ops
        else:
            assert all(not t.inputs and not t.outputs for t in back.ops.values())
            assert "{" not in text
        keys = [(d, int(v)) for d, v, _ in (line.split(";") for line in _op_lines(text))]
        assert keys == sorted(keys) and len(set(keys)) == len(keys)
        for line in _op_lines(text):
            names = _op_names(line.split(";", 2)[2])
            assert names == sorted(names)
    assert "ai.onnx;13;Flatten,Gemm,ReduceSum,SoftmaxCrossEntropyLoss" in _op_lines(ops_path.read_text())
    assert 'Gemm{"inputs": {"0": ["float"], "1": ["float"], "2": ["float"]}, "outputs": {"0": ["float"]}}' in \
        types_path.read_text()


def test_onnxruntimes_own_parser_reads_both_files(shared, tmp_path):
    parser = pytest.importorskip("onnxruntime.tools.reduced_build_config_parser")
    required = reduce.collect([_art(shared, "transformer"), _art(shared, "mobilenet")])
    ops_path, types_path = reduce.write_configs(required, tmp_path)
    want = {}
    for domain, since, op in required.ops:
        want.setdefault(domain, {}).setdefault(since, set()).add(op)
    for path in (ops_path, types_path):
        ops, type_filter = parser.parse_config(str(path), enable_type_reduction=True)
        assert ops == want
        assert (type_filter is None) == (path == ops_path)
    entries = type_filter.get_cpp_entries()
    assert "ORT_SPECIFY_OP_KERNEL_ARG_ALLOWED_TYPES(kOnnxDomain, Gather, Input, 1, int64_t);" in entries


@pytest.mark.arm64
def test_a_build_from_two_artifact_sets_holds_the_union_of_their_ops(shared):
    one, two = reduce.collect([_art(shared, "mlp_sgd")]), reduce.collect([_art(shared, "cnn")])
    both = reduce.collect([_art(shared, "mlp_sgd"), _art(shared, "cnn")])
    assert set(both.ops) == set(one.ops) | set(two.ops)
    assert ("com.microsoft", 1, "SGDOptimizerV2") in both.ops and ("com.microsoft", 1, "AdamWOptimizer") in both.ops
    assert ("ai.onnx", 11, "Conv") in both.ops and ("com.microsoft", 1, "ConvGrad") in both.ops
    assert ("com.microsoft", 1, "SGDOptimizerV2") not in two.ops and ("ai.onnx", 11, "Conv") not in one.ops
    for key, types in both.ops.items():   # types merge: an op's types as either set saw them
        for part in ("inputs", "outputs"):
            merged = {}
            for single in (one, two):
                for i, t in getattr(single.ops.get(key, reduce.OpTypes()), part).items():
                    merged.setdefault(i, set()).update(t)
            assert getattr(types, part) == merged, key
    assert len(both.models) == 6


def test_since_versions_and_domains_are_the_ones_ort_writes(shared):
    """ORT 1.19.2's configs for opset-17 training artifacts (ORT_FORMATS.md §5): ReduceMean/Gemm/Expand/Size
    13, Mul/Sub 14, Pow/Shape 15, Identity 16; ORT's training ops in com.microsoft at 1."""
    ops = reduce.collect([_art(shared, n) for n in ORT_SETS]).ops
    names = {(d, op): since for d, since, op in ops}
    for key, since in {("ai.onnx", "Gemm"): 13, ("ai.onnx", "Expand"): 13, ("ai.onnx", "Size"): 13,
                       ("ai.onnx", "ReduceMean"): 13, ("ai.onnx", "Mul"): 14, ("ai.onnx", "Shape"): 15,
                       ("ai.onnx", "Identity"): 16, ("ai.onnx", "LayerNormalization"): 17,
                       ("com.microsoft", "InPlaceAccumulatorV2"): 1, ("com.microsoft", "AdamWOptimizer"): 1,
                       ("com.microsoft", "ReluGrad"): 1}.items():
        assert names.get(key) == since, key
    assert {d for d, _, _ in ops} == {"ai.onnx", "com.microsoft"}
    assert ops[("com.microsoft", 1, "AdamWOptimizer")].inputs[1] == {"int64_t"}   # step
    assert ops[("ai.onnx", 13, "SoftmaxCrossEntropyLoss")].inputs == {0: {"float"}, 1: {"int64_t"}}


@pytest.mark.arm64
def test_compact_artifacts_give_the_same_ops_as_the_onnx_ones(shared, tmp_path):
    reduce.compact_artifacts(_art(shared, "cnn"), tmp_path)
    assert reduce.collect([tmp_path]).ops == reduce.collect([_art(shared, "cnn")]).ops


def _unknown_op_model(path):
    g = Graph([Node("Relu", ["x"], ["h"], {}, "first"), Node("Frobnicate", ["h"], ["y"], {}, "frob_7")],
              [Value("x", TensorType(np.float32, (2,)))], [Value("y", None)])
    compact.save(g, path)
    return path


@pytest.mark.arm64
def test_an_op_outside_the_op_table_is_named_with_its_node_and_model(tmp_path):
    _unknown_op_model(tmp_path / "training_model.etm")
    for call in (lambda: reduce.collect([tmp_path]), lambda: reduce.compact_artifacts(tmp_path, tmp_path / "o")):
        with pytest.raises(UnsupportedOpError, match=r"training_model\.etm.*frob_7.*Frobnicate") as e:
            call()
        assert "ai.onnx" in str(e.value)
    assert not (tmp_path / "o" / "training_model.etm").exists()


def test_malformed_config_lines_are_named():
    with pytest.raises(reduce.ConfigError, match="line 2: expected 'domain;opset"):
        reduce.parse_config("# x\nai.onnx;Relu\n")
    with pytest.raises(reduce.ConfigError, match="line 1: opset 'x'"):
        reduce.parse_config("ai.onnx;x;Relu\n")
    with pytest.raises(reduce.ConfigError, match=r"unmatched '\{'"):
        reduce.parse_config('ai.onnx;13;Relu{"inputs": {"0": ["float"]}\n')
    with pytest.raises(reduce.ConfigError, match="directive '!globally_allowed_types'"):
        reduce.parse_config("!globally_allowed_types;float\n")
    ops = reduce.parse_config('ai.onnx;13,14;Relu,Cast{"inputs": {"0": ["float", "bool"]}},Add\n').ops
    assert set(ops) == {("ai.onnx", v, o) for v in (13, 14) for o in ("Relu", "Cast", "Add")}
    assert ops[("ai.onnx", 14, "Cast")].inputs == {0: {"float", "bool"}}


def test_cli_writes_both_configs_and_only_them_with_configs_only(shared, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["reduce", str(_art(shared, "mlp")), str(_art(shared, "digits")), "-o", str(out),
                 "--configs-only"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["required_operators.config",
                                                     "required_operators_and_types.config"]
    want = reduce.collect([_art(shared, "mlp"), _art(shared, "digits")])
    assert reduce.parse_config(out / "required_operators_and_types.config").ops == want.ops
    assert "ops from 6 models" in capsys.readouterr().out

    _unknown_op_model(tmp_path / "bad.etm")
    assert main(["reduce", str(tmp_path / "bad.etm"), "-o", str(tmp_path / "o2"), "--configs-only"]) == 2
    assert "Frobnicate" in capsys.readouterr().err


def test_cli_artifact_layout_one_folder_several_folders_and_model_files(shared, tmp_path):
    from edgetrain.cli.reduce import write_artifacts
    files = sorted(["checkpoint", "eval_model.etm", "optimizer_model.etm", "training_model.etm"])
    write_artifacts([_art(shared, "mlp")], tmp_path / "one")
    assert sorted(p.name for p in (tmp_path / "one").iterdir()) == files
    write_artifacts([_art(shared, "mlp"), _art(shared, "cnn"), shared / "models" / "digits.onnx"], tmp_path / "many")
    assert sorted(p.name for p in (tmp_path / "many").iterdir()) == ["cnn", "digits.etm", "mlp"]
    assert sorted(p.name for p in (tmp_path / "many" / "cnn").iterdir()) == files
    from edgetrain.errors import InputError
    with pytest.raises(InputError, match="mlp"):
        write_artifacts([_art(shared, "mlp"), shared / "models" / "mlp.onnx"], tmp_path / "clash")


# -- ORT 1.19.2 as the oracle -------------------------------------------------------------------------------------
ORT_CONFIG = r'''
import os, pathlib
# tools/__init__ probes find_spec("torch"), which the prelude's torch blocker turns into an error; torch is not
# installed in that venv, so lifting the blocker for this import changes nothing else
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_NoTorch"]
os.environ["ORT_CONVERT_ONNX_MODELS_TO_ORT_OPTIMIZATION_LEVEL"] = "disable"   # the models as they are
from onnxruntime.tools.convert_onnx_models_to_ort import OptimizationStyle, convert_onnx_models_to_ort
for name in ARGS["names"]:
    out = pathlib.Path(ARGS["out"]) / name
    convert_onnx_models_to_ort(pathlib.Path(ARGS["src"]) / name, out, [OptimizationStyle.Fixed],
                               enable_type_reduction=True)
    OUT[name] = (out / "required_operators_and_types.disable.config").read_text()
'''


def _ort_configs(ort, tmp_path, folders: dict[str, Path]) -> dict[str, str]:
    src = tmp_path / "src"
    for name, folder in folders.items():     # models only: the converter would try the checkpoint too
        (src / name).mkdir(parents=True)
        for m in ("training_model", "eval_model", "optimizer_model"):
            (src / name / f"{m}.onnx").write_bytes((folder / f"{m}.onnx").read_bytes())
    return ort.run(ORT_CONFIG, {"names": list(folders), "src": str(src), "out": str(tmp_path / "ort")})


@pytest.mark.ort119
def test_ops_and_types_match_what_ort_1_19_collects_from_the_same_models(shared, tmp_path, ort):
    """ORT's converter (optimizations off, type reduction on) lists the same (domain, since, op) set, minus
    Constant (ORT turns Constant nodes into initializers on load), and wherever it tracks an input or output
    type, edgetrain records the same types there."""
    from edgetrain import artifacts, checkpoint
    folders = {f"ort_{n}": _art(shared, n) for n in ORT_SETS}
    for n in ("cnn", "mobilenet", "transformer"):
        ckpt = checkpoint.load(_art(shared, n) / "checkpoint")
        artifacts.generate_artifacts(str(shared / "models" / f"{n}.onnx"), requires_grad=list(ckpt.trainable),
                                     frozen_params=list(ckpt.frozen), loss=artifacts.LossType.CrossEntropyLoss,
                                     optimizer=artifacts.OptimType.AdamW, artifact_directory=tmp_path / f"et_{n}")
        folders[f"edgetrain_{n}"] = tmp_path / f"et_{n}"
    theirs = _ort_configs(ort, tmp_path, folders)
    for name, folder in folders.items():
        ours = reduce.collect([folder])
        ort_ops = reduce.parse_config(theirs[name]).ops
        assert set(ours.ops) - {k for k in ours.ops if k[2] == "Constant"} == set(ort_ops), name
        for key, types in ort_ops.items():
            for part in ("inputs", "outputs"):
                for i, t in getattr(types, part).items():
                    assert getattr(ours.ops[key], part).get(i) == t, (name, key, part, i)
