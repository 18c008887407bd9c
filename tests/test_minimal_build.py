"""The trimmed runtime (``edgetrain.minimal_build.runtime.build``): installed from its wheel and run in a Python
that cannot import numba, llvmlite, onnx, protobuf or psutil, it trains like the full package does.

The oracle is the full package (Numba JIT) on the original ONNX artifacts, run as a separate process; the
trimmed runtime gets the compact (.etm) form of the same artifacts.
"""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import numpy as np
import pytest
from edgetrain.minimal_build.reduce import compact_artifacts
from edgetrain.minimal_build.runtime import blocked_python, build

from edgetrain.data import digits_split

pytestmark = pytest.mark.native

BENCH_ARTIFACTS = ["cnn", "digits", "mlp", "mobilenet", "transformer"]

# The digits demo's recipe (batch 32, AdamW), shortened: two epochs, one epoch of 5 samples at batch 1 and an
# evaluation of the test split at batch 1 (the build ran batch sizes 1 and 32).
DIGITS = r"""
import json, sys
import numpy as np
from edgetrain.trainer import evaluate, open_artifacts, train_epoch
art, data = sys.argv[1], np.load(sys.argv[2])
x, y, xt, yt = data["x"], data["y"], data["xt"], data["yt"]
state, module, optimizer = open_artifacts(art)
losses = []
for epoch in range(2):
    train_epoch(module, optimizer, [x, y], 32, epoch, rng=np.random.default_rng(epoch),
                on_step=lambda info: losses.append(info.loss))
train_epoch(module, optimizer, [x[:5], y[:5]], 1, on_step=lambda info: losses.append(info.loss))
losses.append(evaluate(module, [xt, yt], 1))
blocked = sorted({m.split(".")[0] for m in sys.modules} & {"numba", "llvmlite", "onnx", "psutil"})
print(json.dumps({"losses": losses, "imported": blocked, "file": __import__("edgetrain").__file__}))
"""

# A fixed random batch per bench model, a few AdamW steps, then an eval step.
BENCH = r"""
import json, os, sys
import numpy as np
from edgetrain.trainer import open_artifacts
state, module, optimizer = open_artifacts(sys.argv[1])
rng = np.random.default_rng(0)
inputs = {v.name: v for v in module.graph().inputs}
feeds = []
for name in module.input_names():
    t = inputs[name].type
    shape = [d if isinstance(d, int) else 8 for d in t.shape]
    if np.issubdtype(t.dtype, np.integer):
        high = 100 if name == "input" else (4 if "transformer" in sys.argv[1] else 10)
        feeds.append(rng.integers(0, high, shape).astype(t.dtype))
    else:
        feeds.append(rng.standard_normal(shape).astype(t.dtype))
losses = []
for _ in range(4):
    losses.append(float(module(*feeds)))
    optimizer.step()
    module.lazy_reset_grad()
module.eval()
losses.append(float(module(*feeds)))
print(json.dumps({"losses": losses}))
"""


def _install(wheel, target):
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                    str(target), str(wheel)], check=True)
    return target


def _run_trimmed(site, code: str, *args):
    return blocked_python([site], f"import sys\nsys.argv = ['-', *{list(map(str, args))!r}]\n" + code)


def _trimmed(site, code: str, *args) -> dict:
    out = _run_trimmed(site, code, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _full(code: str, *args) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def digits_build(shared, tmp_path_factory):
    """A trimmed runtime built from the compact digits artifacts, installed from its wheel."""
    root = tmp_path_factory.mktemp("trimmed-digits")
    art = root / "out" / "artifacts"
    compact_artifacts(shared / "ort_artifacts" / "digits", art)
    b = build([art], root / "out", batch_sizes=[1, 32])
    return b, _install(b.wheel, root / "site"), art


def test_trained_digits_match_the_full_package(digits_build, shared, tmp_path):
    _, site, art = digits_build
    (x, y), (xt, yt) = digits_split()
    data = tmp_path / "digits.npz"
    np.savez(data, x=x, y=y, xt=xt, yt=yt)
    trimmed = _trimmed(site, DIGITS, art, data)
    full = _full(DIGITS, shared / "ort_artifacts" / "digits", data)
    assert trimmed["file"].startswith(str(site)) and trimmed["imported"] == []
    assert "numba" in full["imported"]          # the oracle really is the JIT
    assert len(trimmed["losses"]) == len(full["losses"]) == 2 * 45 + 5 + 1
    np.testing.assert_allclose(trimmed["losses"], full["losses"], rtol=1e-6, atol=1e-7)
    assert trimmed["losses"][89] < 0.85 * trimmed["losses"][0]     # and it learned


def test_an_op_outside_the_build_is_named_with_the_rebuild_command(digits_build, shared, tmp_path):
    b, site, _ = digits_build
    compact_artifacts(shared / "ort_artifacts" / "cnn", tmp_path / "cnn")
    out = _run_trimmed(site, BENCH, tmp_path / "cnn")
    assert out.returncode != 0
    last = out.stderr.strip().splitlines()[-1]
    assert "UnsupportedOpError" in last and "'Conv'" in last and "not in this trimmed edgetrain" in last
    assert b.manifest["rebuild"] in last and last.count("edgetrain reduce") == 1


def test_kernels_and_signatures_outside_the_build_say_so(digits_build):
    _, site, _ = digits_build
    code = r"""
import numpy as np
from edgetrain.kernels import _jit, training
from edgetrain.trimmed import NotInBuildError
a = np.zeros(4)                                      # float64: the build has float32 only
try:
    training.adamw_update(a, a, a, a, a, np.zeros(1, np.int64), a, a, 1, True)
except NotInBuildError as e:
    print("SIG", e)
try:
    _jit.load_generated("def kernel(a0, o0):\n    o0[0] = a0[0] * 3\n")
except NotInBuildError as e:
    print("FUSED", e)
"""
    out = blocked_python([site], code)
    assert out.returncode == 0, out.stderr
    sig = next(line for line in out.stdout.splitlines() if line.startswith("SIG"))
    assert "edgetrain.kernels.training.adamw_update" in sig and "float64[1C]" in sig and "float32[1C]" in sig
    assert "edgetrain reduce" in sig
    assert "fused element-wise loop" in out.stdout and "o0[0] = a0[0] * 3" in out.stdout


def test_the_package_depends_on_numpy_and_flatbuffers_only(digits_build):
    b, site, _ = digits_build
    with zipfile.ZipFile(b.wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
        names = z.namelist()
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    assert sorted(r.split(">")[0].split("<")[0].split("=")[0] for r in requires) == ["flatbuffers", "numpy"]
    assert any(n.startswith("edgetrain/kernels/_aot_kernels") for n in names)
    sources = [p.read_text() for p in (site / "edgetrain").rglob("*.py")]
    assert not any(line.lstrip().startswith(("import numba", "from numba", "import onnx", "from onnx"))
                   for s in sources for line in s.splitlines())
    for host_only in ("onnx_io.py", "autodiff", "onnxblock", "cli/artifacts.py", "cli/reduce.py", "minimal_build",
                      "artifacts.py"):
        assert not (site / "edgetrain" / host_only).exists(), host_only


def test_the_wheel_has_the_edgetrain_command_for_train_and_eval(digits_build, tmp_path):
    b, site, art = digits_build
    with zipfile.ZipFile(b.wheel) as z:
        scripts = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))).decode()
    assert "edgetrain = edgetrain.cli:main" in scripts
    (x, y), _ = digits_split()
    np.savez(tmp_path / "d.npz", input=x[:96], labels=y[:96])
    cli = "import sys\nfrom edgetrain.cli import main\nsys.exit(main(sys.argv[1:]))"
    out = _run_trimmed(site, cli, "train", art, "--data", tmp_path / "d.npz", "-o", tmp_path / "run",
                       "--epochs", "2", "--no-progress")
    assert out.returncode == 0, out.stderr[-3000:]
    assert "epoch 2/2: train loss" in out.stdout
    out = _run_trimmed(site, cli, "eval", art, "--data", tmp_path / "d.npz", "--checkpoint", tmp_path / "run" / "checkpoint")
    assert out.returncode == 0 and "eval loss" in out.stdout, out.stderr[-3000:]
    out = _run_trimmed(site, cli, "artifacts", "--help")
    assert out.returncode == 2 and "invalid choice: 'artifacts'" in out.stderr      # host commands stay behind


def test_the_folder_installs_with_pip(digits_build, tmp_path):
    b, _, _ = digits_build
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(tmp_path / "site"), str(b.package_dir.parent)], check=True)
    out = blocked_python([tmp_path / "site"], "import edgetrain.api, edgetrain.trimmed as t\nprint(t.describe())")
    assert out.returncode == 0, out.stderr
    assert "SoftmaxCrossEntropyLoss" in out.stdout


def test_planning_imports_no_numba(shared):
    """The planner, op table and IR stay numba-free in the full package too (the trimmed build copies them)."""
    code = r"""
import sys
class Blocker:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("numba", "llvmlite"):
            raise ImportError("blocked " + name)
sys.meta_path.insert(0, Blocker())
import numpy as np
import edgetrain.api, edgetrain.compact, edgetrain.checkpoint
from edgetrain.onnx_io import to_graph
from edgetrain.plan import make_plan
from edgetrain.session import bind_feeds
g = to_graph(sys.argv[1])
feeds = {"input": np.zeros((4, 64), np.float32)}
print(make_plan(g, bind_feeds(g.inputs, feeds, "digits"), [v.name for v in g.outputs]).summary())
"""
    out = subprocess.run([sys.executable, "-c", code, str(shared / "models" / "digits.onnx")],
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "kernels" in out.stdout


def test_dispatch_keys_are_numbas_types():
    """The trimmed runtime keys arguments as Numba types them (the exports themselves do not check)."""
    from edgetrain.minimal_build.aot import arg_key
    from edgetrain.minimal_build.device_jit import value_key
    from numba import typeof

    base = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    frozen = np.zeros(3, np.int64)
    frozen.flags.writeable = False
    values = [base, base[:, 1], base.T, np.asfortranarray(base), base[0, 0, 0:1], np.zeros((), np.float64),
              np.zeros((1, 5), np.bool_), frozen, np.zeros(0, np.int32), 3, 2.5, True, np.float32(1.5),
              np.int64(7), np.int32(2), None, (1, 2)]
    for v in values:
        assert value_key(v) == arg_key(typeof(v)), v


@pytest.mark.slow
def test_every_bench_model_trains_as_in_the_full_package(shared, tmp_path):
    arts = []
    for m in BENCH_ARTIFACTS:
        arts.append(tmp_path / "artifacts" / m)
        compact_artifacts(shared / "ort_artifacts" / m, arts[-1])
    b = build(arts, tmp_path / "out", batch_sizes=[8])
    site = _install(b.wheel, tmp_path / "site")
    for m, art in zip(BENCH_ARTIFACTS, arts):
        trimmed = _trimmed(site, BENCH, art)
        full = _full(BENCH, shared / "ort_artifacts" / m)
        np.testing.assert_allclose(trimmed["losses"], full["losses"], rtol=1e-6, atol=1e-7, err_msg=m)


def test_an_output_folder_holding_other_sources_is_refused(tmp_path):
    from edgetrain.minimal_build.package import check_replaceable

    from edgetrain.errors import EdgetrainError

    (tmp_path / "edgetrain").mkdir()
    (tmp_path / "edgetrain" / "__init__.py").write_text("")      # e.g. `-o .` in a checkout of edgetrain
    with pytest.raises(EdgetrainError, match="not a trimmed edgetrain"):
        check_replaceable(tmp_path)
    (tmp_path / "edgetrain" / "trimmed.py").write_text("")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    with pytest.raises(EdgetrainError, match="not written by edgetrain reduce"):
        check_replaceable(tmp_path)


# One training step, the eval loss, then the export (no onnx, no protobuf in that process).
EXPORT = r"""
import json, sys
import numpy as np
from edgetrain.trainer import open_artifacts
art, out, data = sys.argv[1], sys.argv[2], np.load(sys.argv[3])
state, module, optimizer = open_artifacts(art)
module(data["x"], data["y"])
optimizer.step()
module.eval()
loss = float(module(data["x"], data["y"]))
module.export_model_for_inferencing(out, ["output"])
print(json.dumps({"loss": loss}))
"""


def test_the_trimmed_runtime_exports_a_model_onnxruntime_runs(digits_build, tmp_path):
    import onnxruntime
    _, site, art = digits_build
    (x, y), _ = digits_split()
    x, y = x[:32], y[:32]
    data = tmp_path / "batch.npz"
    np.savez(data, x=x, y=y)
    exported = tmp_path / "inference.onnx"
    trimmed = _trimmed(site, EXPORT, art, exported, data)
    session = onnxruntime.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == ["input"]      # labels and the loss are pruned away
    logits = session.run(["output"], {"input": x})[0].astype(np.float64)
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    # the eval model's loss is the mean cross-entropy of the logits onnxruntime computes from the export
    np.testing.assert_allclose(-log_probs[np.arange(len(y)), y].mean(), trimmed["loss"], rtol=1e-5)
