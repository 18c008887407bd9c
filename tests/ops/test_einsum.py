"""Einsum: forward against onnxruntime for the equations exporters emit (batched products, transposes, sums,
ellipsis with broadcasting), gradients against torch.einsum's autograd and by finite differences."""
import zlib

import numpy as np
import pytest
from onnx import helper
from oracle import model, run_edgetrain, run_onnxruntime

from edgetrain.errors import EdgetrainError
from edgetrain.ir import Node, TensorType

# equation, operand shapes
CASES = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhid,bhjd->bhij", [(2, 3, 4, 5), (2, 3, 6, 5)]),
    ("bhij,bhjd->bhid", [(2, 3, 4, 6), (2, 3, 6, 5)]),
    ("...ij,...jk", [(2, 3, 4, 5), (2, 3, 5, 2)]),
    ("...ij,...jk->...ik", [(1, 3, 4, 5), (2, 1, 5, 2)]),
    ("ij,jk->ki", [(3, 4), (4, 5)]),
    ("ik,jk->ij", [(3, 4), (5, 4)]),
    ("bnd,d->bn", [(2, 3, 4), (4,)]),
    ("i,j->ij", [(3,), (4,)]),
    ("bi,bi->b", [(3, 4), (3, 4)]),
    ("blhd,bmhd->bhlm", [(2, 3, 2, 4), (2, 5, 2, 4)]),
    ("ij->ji", [(3, 4)]),
    ("bij->bj", [(2, 3, 4)]),
    ("ij->", [(3, 4)]),
    ("...ij->...ji", [(2, 3, 4)]),
    ("ij", [(3, 4)]),
]
IDS = [eq for eq, _ in CASES]


def _operands(eq, shapes, dtype):
    rng = np.random.default_rng(zlib.crc32(eq.encode()))
    return {f"x{k}": rng.standard_normal(s).astype(dtype) for k, s in enumerate(shapes)}


@pytest.mark.parametrize("eq,shapes", CASES, ids=IDS)
def test_forward_against_onnxruntime(eq, shapes):
    feeds = _operands(eq, shapes, np.float32)
    m = model(helper.make_node("Einsum", list(feeds), ["y"], equation=eq), feeds, ["y"])
    ours, ref = run_edgetrain(m, feeds), run_onnxruntime(m, feeds)
    assert ours[0].shape == ref[0].shape
    np.testing.assert_allclose(ours[0], ref[0], rtol=1e-5, atol=1e-5)


GRAD_CASES = [c for c in CASES if c[0] != "...ij,...jk->...ik"]   # broadcast operands: gradient refused


@pytest.mark.parametrize("eq,shapes", GRAD_CASES, ids=[eq for eq, _ in GRAD_CASES])
def test_gradients_by_finite_differences(eq, shapes):
    from gradcheck import check_gradients
    params = _operands(eq, shapes, np.float64)
    out = np.einsum(eq, *params.values())
    check_gradients([Node("Einsum", list(params), ["y"], {"equation": eq}, "mix")], params, ["y"],
                    [TensorType(np.float64, np.shape(out))], samples=4)


@pytest.mark.parametrize("eq,shapes", GRAD_CASES[:6], ids=[eq for eq, _ in GRAD_CASES[:6]])
def test_gradients_against_torch(eq, shapes):
    import torch
    from gradcheck import gradient_session
    params = _operands(eq, shapes, np.float64)
    out_shape = np.shape(np.einsum(eq, *params.values()))
    sess, graph = gradient_session([Node("Einsum", list(params), ["y"], {"equation": eq}, "mix")], params, {},
                                   ["y"], [TensorType(np.float64, out_shape)])
    grads = sess.run(None, dict(params))[1:]
    ts = [torch.from_numpy(v).requires_grad_() for v in params.values()]
    (torch.einsum(eq, *ts) * torch.from_numpy(graph.initializers["cot_0"])).sum().backward()
    for g, t in zip(grads, ts):
        np.testing.assert_allclose(g, t.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("eq,shapes,message", [
    ("ii->i", [(3, 3)], "repeats"), ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)], "3 operands"),
    ("ij,k->i", [(2, 3), (4,)], "summed away"), ("ij,jk->ik", [(2, 3), (4, 5)], "letter 'j'")])
def test_refusals(eq, shapes, message):
    feeds = _operands(eq, shapes, np.float32)
    m = model(helper.make_node("Einsum", list(feeds), ["y"], equation=eq), feeds, ["y"])
    with pytest.raises(EdgetrainError, match=message):
        run_edgetrain(m, feeds)
