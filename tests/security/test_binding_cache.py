"""Issue 11, item 6: Module's binding cache keys on shape and dtype only. Inputs that are not exactly np.ndarray
(memmaps, subclasses) do not grow it call after call, and an object seen before is validated again when its
shape or dtype is not one validated before (an id says nothing about what the object holds now)."""
import numpy as np
import pytest

from edgetrain.api import CheckpointState, Module
from edgetrain.data import digits_split
from edgetrain.errors import InputError


class Tagged(np.ndarray):
    """An ndarray subclass, as libraries hand out (np.matrix, masked arrays, memmaps...)."""


@pytest.fixture
def module(shared):
    folder = shared / "ort_artifacts" / "digits"
    state = CheckpointState.load_checkpoint(folder / "checkpoint")
    return Module(folder / "training_model.onnx", state, folder / "eval_model.onnx")


@pytest.fixture(scope="module")
def batch():
    (x, y), _ = digits_split()
    return np.ascontiguousarray(x[:8], np.float32), np.ascontiguousarray(y[:8], np.int64)


def _memmap(tmp_path, name, array):
    m = np.memmap(tmp_path / name, array.dtype, "w+", shape=array.shape)
    m[...] = array
    return m


def test_memmap_inputs_reuse_one_binding(module, batch, tmp_path):
    x, y = batch
    expected = module(x, y)
    module.lazy_reset_grad()
    alive = []                     # kept alive, so every call sees a new object with a new id
    for k in range(6):
        alive.append((_memmap(tmp_path, f"x{k}", x), _memmap(tmp_path, f"y{k}", y)))
        np.testing.assert_array_equal(module(*alive[-1]), expected)
        module.lazy_reset_grad()
    assert len(module.training_program.bound_steps()) == 1


def test_subclass_inputs_reuse_one_binding_per_shape(module, batch):
    x, y = batch
    alive = [(x.copy().view(Tagged), y.copy().view(Tagged)) for _ in range(5)]
    alive += [(x[:4].copy().view(Tagged), y[:4].copy().view(Tagged)) for _ in range(5)]
    for inputs in alive:
        module(*inputs)
    assert len(module.training_program.bound_steps()) == 2


def test_an_object_seen_before_with_another_dtype_is_validated_again(module, batch):
    x, y = batch
    tagged = x.copy().view(Tagged)
    module(tagged, y)
    tagged.dtype = np.int32                   # same object, same id, same bytes: now int32 data
    with pytest.raises(InputError, match="input 'input' has element type int32"):
        module(tagged, y)


def test_an_object_seen_before_with_another_shape_is_validated_again(module, batch):
    x, y = batch
    tagged = x.copy().view(Tagged)
    module(tagged, y)
    tagged.shape = (16, 32)                   # same object and id, same number of elements
    with pytest.raises(InputError, match=r"input 'input' has shape \(16, 32\)"):
        module(tagged, y)


def test_the_inputs_that_are_not_arrays_are_refused(module, batch):
    x, y = batch
    with pytest.raises(InputError, match="input .input. must be a numpy array or an OrtValue, got list"):
        module(x.tolist(), y)
    assert len(module.training_program.bound_steps()) == 0
