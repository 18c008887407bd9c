"""Einsum with one or two operands, as exporters emit it: batched products ("bij,bjk->bik", "bhid,bhjd->bhij",
"...ij,...jk"), transposes and sums.

Two operands run as one batched GEMM: each letter is a batch letter (in both operands and the output), a free
letter of one operand (and the output) or a contracted one (in both operands, not the output); the
operands are permuted to [batch..., free, contracted] and [batch..., contracted, free] and multiplied by
np.matmul, whose batch broadcasting covers ellipsis dims of size 1. One operand runs as numpy's einsum (a
transpose and sums).
Refused with an error naming the letter: a letter repeated within an operand (diagonals), a letter summed
away in only one of two operands, three or more operands.
"""
from __future__ import annotations

import string

import numpy as np

from ..ir import TensorType
from ..record import Frozen
from .attrs import REQUIRED, Text
from .base import NodeContext, OpDef


class Spec(Frozen):
    """An equation with the ellipsis spelled out as letters: one letter string per operand and the output."""
    operands: tuple[str, ...]
    output: str
    sizes: dict

    def __init__(self, operands, output, sizes):
        self._set(operands=operands, output=output, sizes=sizes)

    @property
    def equation(self) -> str:
        return ",".join(self.operands) + "->" + self.output

    def shape(self, letters: str) -> tuple[int, ...]:
        return tuple(self.sizes[c] for c in letters)


class Product(Frozen):
    """The batched GEMM of a two-operand Einsum: letter groups, and the permutations into and out of it."""
    batch: str
    left: str
    right: str
    contract: str
    perm_a: tuple[int, ...]
    perm_b: tuple[int, ...]
    perm_out: tuple[int, ...]     # from batch + left + right to the output's order

    def __init__(self, batch, left, right, contract, perm_a, perm_b, perm_out):
        self._set(batch=batch, left=left, right=right, contract=contract, perm_a=perm_a, perm_b=perm_b,
                  perm_out=perm_out)


def einsum_spec(ctx: NodeContext) -> Spec:
    eq = ctx.attr("equation").replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    n_in = len(ctx.node.inputs)
    if n_in not in (1, 2):
        raise ctx.error(f"Einsum with {n_in} operands is not supported (one or two; split the product)")
    if len(terms) != n_in:
        raise ctx.error(f"equation '{eq}' names {len(terms)} operand(s); the node has {n_in}")
    allowed = set(string.ascii_letters)
    for term in terms + ([rhs] if arrow else []):
        body = term.replace("...", "", 1)
        if not set(body) <= allowed:
            raise ctx.error(f"equation '{eq}': term '{term}' may hold letters and one '...' only")
    used = set(eq)
    spare = [c for c in string.ascii_letters if c not in used]
    ranks = [len(ctx.shape(i)) for i in range(n_in)]
    n_ell = [rank - len(t.replace("...", "")) if "..." in t else 0 for t, rank in zip(terms, ranks)]
    width = max(n_ell)
    if any(n < 0 for n in n_ell) or width > len(spare):
        raise ctx.error(f"equation '{eq}' does not fit input ranks {ranks}")
    ell = "".join(spare[:width])
    operands, sizes = [], {}
    for i, (term, n) in enumerate(zip(terms, n_ell)):
        letters = term.replace("...", ell[width - n:])
        if len(letters) != ranks[i]:
            raise ctx.error(f"equation '{eq}': term '{term}' has {len(letters)} letters for input {i} of "
                            f"rank {ranks[i]}")
        if len(set(letters)) != len(letters):
            raise ctx.error(f"equation '{eq}': a letter repeats within term '{term}' (diagonals are not "
                            "supported)")
        for c, size in zip(letters, ctx.shape(i)):
            known = sizes.get(c)
            if known is None or known == 1 and c in ell:
                sizes[c] = size
            elif size != known and not (c in ell and size == 1):
                raise ctx.error(f"equation '{eq}': letter '{c}' is {known} in one place and {size} in "
                                "another")
        operands.append(letters)
    if arrow:
        out = rhs.replace("...", ell)
        if len(set(out)) != len(out) or not set(out) <= set("".join(operands)):
            raise ctx.error(f"equation '{eq}': the output repeats a letter or names one no input has")
    else:   # implicit output: the ellipsis, then the letters that appear once, in alphabetical order
        counts = {c: "".join(terms).count(c) for c in set("".join(terms)) - {"."}}
        out = ell + "".join(sorted(c for c, k in counts.items() if k == 1))
    return Spec(tuple(operands), out, sizes)


def product(ctx: NodeContext, spec: Spec) -> Product:
    a, b = spec.operands
    out = spec.output
    for mine, other in ((a, b), (b, a)):
        lone = [c for c in mine if c not in other and c not in out]
        if lone:
            raise ctx.error(f"equation '{spec.equation}': letter '{lone[0]}' is summed away in one operand "
                            "only (not supported; sum it out first)")
    batch = "".join(c for c in out if c in a and c in b)
    left = "".join(c for c in out if c in a and c not in b)
    right = "".join(c for c in out if c in b and c not in a)
    contract = "".join(c for c in a if c in b and c not in out)
    order = batch + left + right
    return Product(batch, left, right, contract, tuple(a.index(c) for c in batch + left + contract),
                   tuple(b.index(c) for c in batch + contract + right), tuple(order.index(c) for c in out))


def _einsum(ctx: NodeContext):
    spec = einsum_spec(ctx)
    if len(spec.operands) == 2:
        product(ctx, spec)
        if ctx.type(1).dtype != ctx.type(0).dtype:
            raise ctx.error("both operands must share one element type")
    return [TensorType(ctx.type(0).dtype, spec.shape(spec.output))]


def _workspace(ctx: NodeContext):
    """Permuted copies of the operands and the product before its final permutation, where needed."""
    spec = einsum_spec(ctx)
    if len(spec.operands) == 1:
        return []
    p = product(ctx, spec)
    dtype = ctx.type(0).dtype
    ws = []
    for perm, i in ((p.perm_a, 0), (p.perm_b, 1)):
        if perm != tuple(range(len(perm))):
            ws.append(TensorType(dtype, tuple(ctx.shape(i)[k] for k in perm)))
    if p.perm_out != tuple(range(len(p.perm_out))):
        ws.append(TensorType(dtype, spec.shape(p.batch + p.left + p.right)))
    return ws


def _einsum_vjp(g, dys):
    """Two operands C = A.B: dA = einsum(C, B -> A), dB = einsum(A, C -> B). One operand: dC permuted back to
    A's order, the summed letters unsqueezed and expanded to A's shape."""
    probe = NodeContext(g.node, EINSUM, g.opset, list(g.in_types), [None] * len(g.in_types))
    spec = einsum_spec(probe)
    dy, out = dys[0], spec.output
    if len(spec.operands) == 2:
        a, b = spec.operands
        for i, letters in enumerate(spec.operands):
            if g.needs[i] and spec.shape(letters) != tuple(g.in_types[i].shape):
                raise g.error(f"equation '{spec.equation}' broadcasts input {i} of shape "
                              f"{list(g.in_types[i].shape)}: its gradient is not supported")
        da = g.emit("Einsum", [dy, g.x(1)], {"equation": f"{out},{b}->{a}"}) if g.needs[0] else None
        db = g.emit("Einsum", [g.x(0), dy], {"equation": f"{a},{out}->{b}"}) if g.needs[1] else None
        return [da, db]
    (a,) = spec.operands
    kept = "".join(c for c in a if c in out)
    da = g.emit("Einsum", [dy], {"equation": f"{out}->{kept}"}) if kept != out else dy
    summed = [k for k, c in enumerate(a) if c not in out]
    if summed:
        da = g.emit("Unsqueeze", [da, g.const(summed, np.int64, "axes")])
        da = g.emit("Expand", [da, g.shape_of(g.x(0))])
    return [da]


EINSUM = OpDef("Einsum", _einsum, since=12, kernel="einsum.einsum", workspace=_workspace, vjp=_einsum_vjp,
               attrs={"equation": Text(REQUIRED, string.ascii_letters + ",.-> ")},
               doc="one or two operands; two run as one batched np.matmul between permuted copies")

OPS = (EINSUM,)
