"""Drop-in compatibility with onnxruntime.training 1.19 (issue 12): one script, written against ORT's documented
Python API, runs once with ``onnxruntime.training`` in ORT 1.19.2's venv (tests/ort119.py) and once with
edgetrain, only the import lines differing; what it records is compared.

Covered: symbolic dims with every axis dynamic (training at two batch sizes), get_contiguous_parameters'
copy semantics and its OrtValue methods, onnxblock's accessor/``self.base`` ModelProto surface (user blocks that
read ``self.base.graph.output[0]`` and append inputs, LabelEncoder, a standalone ClipGradNorm over a tensor
sequence, ``requires_grad`` on a graph input, load_checkpoint_to_model, ORT's error before build),
generate_artifacts with no trainable parameter (additional outputs, Dropout and BatchNorm in the eval model), and
the state semantics (zero gradients after Module, a nominal checkpoint's errors, OrtValue inputs).
"""
import numpy as np
import pytest

import edgetrain.api
import edgetrain.artifacts
import edgetrain.onnxblock
from edgetrain.ortvalue import OrtValue

pytestmark = [pytest.mark.ort119, pytest.mark.native]

# The script. Bound by the caller: api, artifacts, onnxblock (the implementation under test), ortvalue
# (OrtValue.ortvalue_from_numpy), np, ARGS, OUT. Everything else it imports itself.
SCRIPT = r'''
import copy, os, tempfile
import onnx
from onnx import helper, numpy_helper

RNG = np.random.default_rng(3)
F, H, C = 12, 8, 4


def mlp():
    """x[batch, features] -> Gemm -> Relu -> Gemm -> y[batch, classes], every axis dynamic (as ORT's helpers
    and torch.onnx.export with dynamic_axes write them)."""
    r = np.random.default_rng(0)
    inits = [numpy_helper.from_array(r.standard_normal((H, F)).astype(np.float32) * 0.3, "fc1.weight"),
             numpy_helper.from_array(r.standard_normal(H).astype(np.float32) * 0.1, "fc1.bias"),
             numpy_helper.from_array(r.standard_normal((C, H)).astype(np.float32) * 0.3, "fc2.weight"),
             numpy_helper.from_array(r.standard_normal(C).astype(np.float32) * 0.1, "fc2.bias")]
    nodes = [helper.make_node("Gemm", ["input-0", "fc1.weight", "fc1.bias"], ["h"], transB=1),
             helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["output-0"], transB=1)]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("input-0", 1, ["input-0_dim0", "input-0_dim1"])],
                          [helper.make_tensor_value_info("output-0", 1, ["output-0_dim0", "output-0_dim1"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


PARAMS = ["fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"]
root = tempfile.mkdtemp()
d = os.path.join(root, "mlp")
os.makedirs(d)
artifacts.generate_artifacts(mlp(), requires_grad=PARAMS, loss=artifacts.LossType.CrossEntropyLoss,
                             optimizer=artifacts.OptimType.AdamW, artifact_directory=d, nominal_checkpoint=True)
batches = [(RNG.standard_normal((n, F)).astype(np.float32), RNG.integers(0, C, n).astype(np.int64))
           for n in (5, 9, 5, 3)]

# -- item 1: every axis dynamic, two batch sizes; item 5: gradients are zeros once the Module exists ----------
state = api.CheckpointState.load_checkpoint(os.path.join(d, "checkpoint"))
module = api.Module(os.path.join(d, "training_model.onnx"), state, os.path.join(d, "eval_model.onnx"))
opt = api.Optimizer(os.path.join(d, "optimizer_model.onnx"), module)
opt.set_learning_rate(0.05)
OUT["grad_after_module"] = np.array(state.parameters["fc1.weight"].grad)   # ORT hands back a live view
OUT["input_names"] = module.input_names()
losses = []
for x, y in batches:
    losses.append(float(module(x, y)))
    opt.step()
    module.lazy_reset_grad()
OUT["losses"] = np.array(losses)
module.eval()
OUT["eval_loss"] = float(module(*batches[1]))
module.train()

# -- item 2: get_contiguous_parameters is a snapshot, with OrtValue's methods ------------------------------
snap = module.get_contiguous_parameters()
before = np.array(snap.numpy())
module(*batches[0])
opt.step()
OUT["snapshot_unchanged"] = bool(np.array_equal(snap.numpy(), before))
OUT["snapshot_shape"] = list(snap.shape())
OUT["snapshot_type"] = snap.data_type()
OUT["params_moved"] = bool(not np.array_equal(module.get_contiguous_parameters().numpy(), before))
module.copy_buffer_to_parameters(snap)
OUT["restored"] = bool(np.array_equal(module.get_contiguous_parameters().numpy(), before))
OUT["size"] = [module.get_parameters_size(), module.get_parameters_size(False)]

# -- item 5: OrtValue inputs --------------------------------------------------------------------------------
module.lazy_reset_grad()
out = module(ortvalue(batches[2][0]), ortvalue(batches[2][1]))
OUT["ortvalue_loss"] = float(np.asarray(out.numpy()))
OUT["ortvalue_numpy_loss"] = float(module(*batches[2]))

# -- item 5: a nominal checkpoint refuses values until all parameters are copied in -------------------------
def raises(f, phrase=""):
    """Whether f raises a RuntimeError whose message holds ORT's documented phrase."""
    try:
        f()
    except RuntimeError as e:
        return phrase in str(e)
    return False

PARAMS_FIRST, ALL_FIRST, MODEL_FIRST = ("Please load the parameter states first",
                                        "Please load all the parameter states first",
                                        "Please load the model parameters first.")
nominal = api.CheckpointState.load_checkpoint(os.path.join(d, "nominal_checkpoint"))
rec = {"lookup": raises(lambda: nominal.parameters["fc1.weight"], PARAMS_FIRST),
       "assign": raises(lambda: nominal.parameters.__setitem__("fc1.bias", np.zeros(H, np.float32)), ALL_FIRST),
       "contains": "fc1.weight" in nominal.parameters, "len": len(nominal.parameters)}
nmod = api.Module(os.path.join(d, "training_model.onnx"), nominal, os.path.join(d, "eval_model.onnx"))
nopt = api.Optimizer(os.path.join(d, "optimizer_model.onnx"), nmod)
rec["lookup_after_module"] = raises(lambda: nominal.parameters["fc1.weight"], PARAMS_FIRST)
rec["contiguous"] = raises(lambda: nmod.get_contiguous_parameters(), MODEL_FIRST)
rec["train_step"] = raises(lambda: nmod(*batches[0]), MODEL_FIRST)
rec["optimizer_step"] = raises(lambda: nopt.step(), MODEL_FIRST)
rec["eval_step"] = raises(lambda: nmod.eval()(*batches[0]), MODEL_FIRST)
nmod.train()
rec["size"] = nmod.get_parameters_size(False)
full = module.get_contiguous_parameters()
rec["copy_trainable_only"] = raises(lambda: nmod.copy_buffer_to_parameters(full, True), "trainable_only = false")
nmod.copy_buffer_to_parameters(full, False)
rec["lookup_after_copy"] = raises(lambda: nominal.parameters["fc1.weight"])
OUT["nominal"] = rec
OUT["nominal_loss_after_copy"] = float(nmod(*batches[3]))
OUT["loss_same_params"] = float(module(*batches[3]))

# -- item 3: onnxblock on the ModelProto ------------------------------------------------------------------
class MSEBlock(onnxblock.ForwardBlock):
    def __init__(self):
        super().__init__()
        self.loss = onnxblock.loss.MSELoss()

    def build(self, output_name):
        return self.loss(output_name)

base = mlp()
block = MSEBlock()
with onnxblock.base(base) as accessor:
    block(base.graph.output[0].name)
    edited = accessor.model
    OUT["accessor_is_model"] = isinstance(edited, onnx.ModelProto)
    OUT["forward_inputs"] = [i.name for i in edited.graph.input]
    OUT["forward_outputs"] = len(edited.graph.output)
OUT["base_untouched"] = len(base.graph.node)


class LabelEncoded(onnxblock.ForwardBlock):
    def __init__(self):
        super().__init__()
        self._loss = onnxblock.loss.CrossEntropyLoss()

    def build(self, output_name):
        labels = copy.deepcopy(self.base.graph.output[0])
        labels.type.tensor_type.elem_type = onnx.TensorProto.INT64
        labels.name = "raw_labels"
        del labels.type.tensor_type.shape.dim[1]
        self.base.graph.input.append(labels)
        encode = onnxblock.blocks.LabelEncoder(default_int64=0, keys_int64s=[10, 11, 12, 13],
                                               values_int64s=[3, 2, 1, 0])
        return self._loss(output_name, encode("raw_labels"))

le = LabelEncoded()
le_base = mlp()
le_base.opset_import.append(helper.make_opsetid("ai.onnx.ml", 2))     # ORT wants the user to import the domain
with onnxblock.base(le_base):
    le("output-0")
OUT["label_encoder_model"] = np.frombuffer(le.to_model_proto().SerializeToString(), np.uint8)


class Clip(onnxblock.ForwardBlock):
    def __init__(self):
        super().__init__()
        self._clip = onnxblock.optim.ClipGradNorm(1.5)

    def build(self, name):
        return self._clip(name)

clip_base = onnx.ModelProto()
clip_base.ir_version = 8
clip_base.graph.name = "clip"
clip_base.opset_import.extend([helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("", 17)])
clip_base.graph.input.append(helper.make_tensor_sequence_value_info("gradients", onnx.TensorProto.FLOAT, None))
clip = Clip()
with onnxblock.base(clip_base):
    clipped = clip("gradients")
clip_model = clip.to_model_proto()
if not clip_model.graph.output:       # as ORT's own test does when shape inference leaves it undeclared
    clip_model.graph.output.append(helper.make_tensor_sequence_value_info(clipped, onnx.TensorProto.FLOAT, None))
OUT["clip_model"] = np.frombuffer(clip_model.SerializeToString(), np.uint8)


class MSETrain(onnxblock.TrainingBlock):
    def __init__(self):
        super().__init__()
        self.loss = onnxblock.loss.MSELoss()

    def build(self, output_name):
        return self.loss(output_name)

early = MSETrain()
try:
    early.parameters()
    OUT["early_parameters"] = ""
except Exception as e:
    OUT["early_parameters"] = "Please build the training model first" in str(e)
grad_input = MSETrain()
grad_input.requires_grad("input-0")
grad_input.requires_grad("fc2.weight")
with onnxblock.base(mlp()):
    grad_input("output-0")
train_model, _ = grad_input.to_model_proto()
OUT["grad_input_io"] = sorted(n for n in [i.name for i in train_model.graph.input] + [o.name for o in train_model.graph.output]
                              if "accumulation" in n or n == "lazy_reset_grad")

zero = mlp()
for init in zero.graph.initializer:
    init.CopyFrom(numpy_helper.from_array(np.zeros_like(numpy_helper.to_array(init)), init.name))
onnxblock.load_checkpoint_to_model(os.path.join(d, "checkpoint"), zero)
OUT["loaded"] = {i.name: float(np.abs(numpy_helper.to_array(i)).sum()) for i in zero.graph.initializer}

# -- item 4: artifacts with no trainable parameter ---------------------------------------------------------
def dropout_bn():
    """x[N, 3, H, W] -> BatchNormalization(training_mode=1) -> Dropout(x, ratio, training_mode) -> y"""
    inits = [numpy_helper.from_array(np.ones(3, np.float32), "bn.scale"),
             numpy_helper.from_array(np.zeros(3, np.float32), "bn.bias"),
             numpy_helper.from_array(np.zeros(3, np.float32), "bn.mean"),
             numpy_helper.from_array(np.ones(3, np.float32), "bn.var"),
             numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
             numpy_helper.from_array(np.array(True), "training")]
    nodes = [helper.make_node("BatchNormalization", ["x", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
                              ["b", "bn.mean_out", "bn.var_out"], training_mode=1),
             helper.make_node("Dropout", ["b", "ratio", "training"], ["y"])]
    g = helper.make_graph(nodes, "dbn", [helper.make_tensor_value_info("x", 1, ["N", 3, "H", "W"])],
                          [helper.make_tensor_value_info("y", 1, ["N", 3, "H", "W"])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)

for extra in (None, ["y"]):
    e = os.path.join(root, f"noparams{extra is not None}")
    os.makedirs(e)
    artifacts.generate_artifacts(dropout_bn(), loss=artifacts.LossType.MSELoss, artifact_directory=e,
                                 additional_output_names=extra)
    ev = onnx.load(os.path.join(e, "eval_model.onnx"))
    tr = onnx.load(os.path.join(e, "training_model.onnx"))
    key = "extra" if extra else "plain"
    OUT[f"{key}_eval_outputs"] = len(ev.graph.output)
    OUT[f"{key}_train_outputs"] = len(tr.graph.output)
    OUT[f"{key}_train_inputs"] = [i.name for i in tr.graph.input]
    OUT[f"{key}_dropout_training_input"] = [list(n.input)[2:3] for n in ev.graph.node if n.op_type == "Dropout"]
    OUT[f"{key}_bn_training_mode"] = [a.i for n in ev.graph.node if n.op_type == "BatchNormalization"
                                      for a in n.attribute if a.name == "training_mode"]
    OUT[f"{key}_checkpoint_params"] = len(api.CheckpointState.load_checkpoint(os.path.join(e, "checkpoint")).parameters)
'''

ORT_IMPORTS = '''
sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "_NoTorch"]   # torch is not installed
from onnxruntime.training import artifacts, onnxblock
api = ort_api
ortvalue = ort.OrtValue.ortvalue_from_numpy
'''


def _edgetrain() -> dict:
    out: dict = {}
    exec(SCRIPT, {"api": edgetrain.api, "artifacts": edgetrain.artifacts, "onnxblock": edgetrain.onnxblock,
                  "ortvalue": OrtValue.ortvalue_from_numpy, "np": np, "ARGS": {}, "OUT": out})
    return out


@pytest.fixture(scope="module")
def both(ort):
    return ort.run(ORT_IMPORTS + SCRIPT), _edgetrain()


def test_every_axis_dynamic_trains_like_ort(both):
    theirs, ours = both
    assert ours["input_names"] == theirs["input_names"]
    np.testing.assert_allclose(ours["losses"], theirs["losses"], rtol=2e-4)
    np.testing.assert_allclose(ours["eval_loss"], theirs["eval_loss"], rtol=2e-4)


def test_contiguous_parameters_are_a_snapshot_like_ort(both):
    theirs, ours = both
    for key in ("snapshot_unchanged", "snapshot_shape", "snapshot_type", "params_moved", "restored", "size"):
        assert ours[key] == theirs[key], key
    assert ours["snapshot_unchanged"] and ours["restored"]


def test_state_semantics_like_ort(both):
    theirs, ours = both
    np.testing.assert_array_equal(ours["grad_after_module"], theirs["grad_after_module"])
    assert ours["grad_after_module"].shape == (8, 12) and not ours["grad_after_module"].any()
    assert ours["nominal"] == theirs["nominal"]
    assert ours["nominal"]["train_step"] and not ours["nominal"]["lookup_after_copy"]
    np.testing.assert_allclose(ours["ortvalue_loss"], theirs["ortvalue_loss"], rtol=2e-4)
    np.testing.assert_allclose(ours["ortvalue_loss"], ours["ortvalue_numpy_loss"], rtol=1e-6)
    np.testing.assert_allclose(ours["nominal_loss_after_copy"], theirs["nominal_loss_after_copy"], rtol=2e-4)
    np.testing.assert_allclose(ours["nominal_loss_after_copy"], ours["loss_same_params"], rtol=1e-6)


def test_onnxblock_surface_like_ort(both):
    theirs, ours = both
    for key in ("accessor_is_model", "forward_inputs", "forward_outputs", "base_untouched", "early_parameters",
                "grad_input_io", "loaded"):
        assert ours[key] == theirs[key], key
    assert "input-0_grad.accumulation.buffer" in ours["grad_input_io"]


RUN_BLOCK_MODELS = '''
so = ort.SessionOptions()
so.intra_op_num_threads = 1
for who in ("ort", "edgetrain"):
    le = ort.InferenceSession(ARRAYS[who + "/label_encoder_model"].tobytes(), so, providers=["CPUExecutionProvider"])
    OUT[who + "/le"] = le.run(None, {"input-0": ARRAYS["x"], "raw_labels": ARRAYS["raw"]})[0]
    clip = ort.InferenceSession(ARRAYS[who + "/clip_model"].tobytes(), so, providers=["CPUExecutionProvider"])
    for k, g in enumerate(clip.run(None, {"gradients": [ARRAYS["g0"], ARRAYS["g1"]]})[0]):
        OUT[f"{who}/clip{k}"] = g
'''


def test_label_encoder_and_sequence_clip_models_run_in_ort_like_ort_s(both, ort):
    theirs, ours = both
    rng = np.random.default_rng(5)
    g = [rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal(5).astype(np.float32)]
    out = ort.run(RUN_BLOCK_MODELS, arrays={
        "ort/label_encoder_model": theirs["label_encoder_model"], "ort/clip_model": theirs["clip_model"],
        "edgetrain/label_encoder_model": ours["label_encoder_model"], "edgetrain/clip_model": ours["clip_model"],
        "x": rng.standard_normal((6, 12)).astype(np.float32), "raw": rng.integers(10, 14, 6).astype(np.int64),
        "g0": g[0], "g1": g[1]})
    np.testing.assert_allclose(out["edgetrain/le"], out["ort/le"], rtol=1e-5)
    norm = np.sqrt(sum(float((a.astype(np.float64) ** 2).sum()) for a in g))
    for k in range(2):
        np.testing.assert_allclose(out[f"edgetrain/clip{k}"], out[f"ort/clip{k}"], rtol=1e-5)
        np.testing.assert_allclose(out[f"edgetrain/clip{k}"], g[k] * min(1.0, 1.5 / (norm + 1e-6)), rtol=1e-5)


def test_artifacts_without_trainable_parameters_like_ort(both):
    theirs, ours = both
    for key in ("eval_outputs", "train_outputs", "dropout_training_input", "bn_training_mode", "checkpoint_params"):
        for variant in ("plain", "extra"):
            assert ours[f"{variant}_{key}"] == theirs[f"{variant}_{key}"], f"{variant}_{key}"
    # ORT also makes every initializer an input to feed (none named: its set of parameters is empty); edgetrain
    # keeps them constants (a Dropout ratio must be one), so its inputs are ORT's without the initializers (the
    # model's and the loss's own, onnx::pow_exponent::k)
    initializers = {"bn.scale", "bn.bias", "bn.mean", "bn.var", "ratio", "training"}
    assert ours["plain_train_inputs"] == [n for n in theirs["plain_train_inputs"]
                                          if n not in initializers and not n.startswith("onnx::")]
    assert ours["plain_eval_outputs"] == 1 and ours["extra_eval_outputs"] == 2
    assert ours["plain_dropout_training_input"] == [[""]] and ours["plain_bn_training_mode"] == [0]
