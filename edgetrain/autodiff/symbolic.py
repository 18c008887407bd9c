"""Symbolic shape typing at artifact time: which dims a graph leaves free, which it fixes, which it ties.

A model's inputs may declare symbolic dims ('batch', 'features', or a dim with no name at all). Every op's
shape rule (``OpDef.infer``) is written for concrete sizes, and planning stays concrete; so typing a graph
symbolically *probes* it: each free symbol is bound to a prime, the graph is specialized (every shape rule
runs, shape arithmetic folds) and the concrete results are read back as formulas over the symbols. The op
rules are the single source of shape truth; nothing here knows any op.

unify
    When a shape rule rejects a probe, its node holds a symbolic dim that the graph forces to equal another
    dim of that node: a Gemm's K against its 784-row weight, BatchNorm's or Conv's channels, broadcasting
    against a constant, labels [L] against logits [N*T, V]. ``solve`` tries binding each symbol of the node to
    each other dim of the node (constants first, 1 last; one binding, then pairs), keeps the first binding
    with which the probe gets past the node, and repeats until the graph types. A bound symbol is gone: it
    is a constant (784) or a formula over the symbols still free (N*T). When no binding helps, the shape
    rule's own error stands (it names the node and its input shapes), with the probe sizes of the symbols.
read back
    With the bindings fixed, the graph is probed once at base primes, once per free symbol with only that
    symbol moved, and once with all moved. A dim is read as ``c * N * T ...`` or ``c0 + c1 * N + ...`` when
    that formula holds in every probe; otherwise (a floor division of a symbolic size, as a strided Conv makes)
    it is unknown (None), as ONNX shape inference leaves it. Dims made from an input dim that declares no
    name are unknown too: there is no name to write.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from ..errors import ShapeError, UnsupportedOpError
from ..ir import Graph, TensorType
from ..plan.specialize import Specialized, specialize

ANONYMOUS = "?"     # prefix of the symbol made for an input dim declared without a name


@dataclass(frozen=True)
class Expr:
    """A polynomial over symbols with integer coefficients: ``terms`` is ((symbols, coefficient), ...), each
    ``symbols`` a sorted tuple (a repeat is a power; () is the constant term)."""
    terms: tuple

    @staticmethod
    def of(terms: dict) -> Expr:
        return Expr(tuple(sorted((tuple(sorted(s)), int(c)) for s, c in terms.items() if c)))

    @property
    def symbols(self) -> set[str]:
        return {s for mono, _ in self.terms for s in mono}

    @property
    def constant(self) -> int | None:
        """The value if the formula has no symbol, else None."""
        if self.symbols:
            return None
        return self.terms[0][1] if self.terms else 0

    def value(self, env: dict[str, int]) -> int:
        return sum(c * int(np.prod([env[s] for s in mono], dtype=object)) for mono, c in self.terms)

    def __str__(self) -> str:
        text = ""
        for mono, c in sorted(self.terms, key=lambda t: (-len(t[0]), t[0])):
            factors = ([] if abs(c) == 1 and mono else [str(abs(c))]) + list(mono)
            sign = ("-" if c < 0 else "") if not text else (" - " if c < 0 else " + ")
            text += sign + "*".join(factors)
        return text or "0"


def _primes(start: int):
    n = start
    while True:
        if all(n % p for p in range(2, int(n ** 0.5) + 1)):
            yield n
        n += 1


@dataclass
class Typing:
    """A graph whose symbolic input dims are unified: ``bound`` maps each eliminated symbol to its formula
    (over symbols free when it was bound), ``free`` lists the symbols left free."""
    graph: Graph
    wrt: tuple
    outputs: list | None
    dims: dict            # input name -> tuple of int | symbol name
    free: list
    bound: dict

    def env(self, sizes: dict[str, int]) -> dict[str, int]:
        """Every symbol's size when the free symbols take ``sizes``."""
        env, pending = dict(sizes), dict(self.bound)
        while pending:      # a formula names symbols free when it was made, some bound since: resolve those first
            for name, formula in list(pending.items()):
                if formula.symbols <= env.keys():
                    env[name] = formula.value(env)
                    del pending[name]
        return env

    def probe(self, sizes: dict[str, int]) -> Specialized:
        env = self.env(sizes)
        inputs = {name: TensorType(self._dtype(name), tuple(d if isinstance(d, int) else env[d] for d in dims))
                  for name, dims in self.dims.items()}
        consts = {k: a for k, a in self.graph.initializers.items() if k not in self.wrt}
        outputs = self.outputs if self.outputs is not None else [v.name for v in self.graph.outputs]
        return specialize(self.graph, inputs, outputs, consts)

    def _dtype(self, name: str):
        if name in self.graph.initializers:
            return self.graph.initializers[name].dtype
        return next(v.type.dtype for v in self.graph.inputs if v.name == name)

    def sizes(self, offset: int = 0, moved: str | None = None) -> dict[str, int]:
        """Probe sizes: a distinct prime > 100 per free symbol (never 1, never a power of two); ``offset``
        picks another set of primes, for every symbol or (``moved``) for that one only."""
        primes = list(itertools.islice(_primes(101), 3 * len(self.free)))
        base = dict(zip(self.free, primes))
        if moved is not None:
            return base | {moved: primes[offset * len(self.free) + self.free.index(moved)]}
        return dict(zip(self.free, primes[offset * len(self.free):]))

    @cached_property
    def concrete(self) -> Specialized:
        """The graph specialized at the base probe sizes (what gradient rules see)."""
        return self.probe(self.sizes())

    def shape_free_constants(self) -> dict[str, np.ndarray]:
        """Values known when planning whatever the free symbols are (initializers, Constant nodes and what
        folds from them): the same at two different probe sizes."""
        first, second = self.concrete.consts, self.probe(self.sizes(2)).consts
        return {k: v for k, v in first.items()
                if k in second and v.shape == second[k].shape and np.array_equal(v, second[k], equal_nan=True)}

    def types(self) -> dict[str, TensorType]:
        """Every value's type with its dims as ints, formulas (str, e.g. 'N*T') or None (unknown)."""
        base, first = self.sizes(), self.concrete.types
        others = [(sizes, self.probe(sizes).types) for sizes in [self.sizes(1, s) for s in self.free] + [self.sizes(2)]]
        types = {}
        for name, t in first.items():
            if not isinstance(t, TensorType):
                types[name] = t
                continue
            seen = [(base, t.shape)] + [(sizes, probed[name].shape) for sizes, probed in others]
            if any(len(shape) != len(t.shape) for _, shape in seen):
                types[name] = TensorType(t.dtype, (None,) * len(t.shape))
                continue
            types[name] = TensorType(t.dtype, tuple(
                _written(self._read([(sizes, shape[j]) for sizes, shape in seen])) for j in range(len(t.shape))))
        return types

    def _read(self, seen: list[tuple[dict, int]]) -> Expr | None:
        """The formula over the free symbols that gives each probe's size, if a product or an affine one."""
        (base, v0), moved = seen[0], seen[1:1 + len(self.free)]
        candidates = [_monomial(v0, base)]
        slopes = {}
        for (sizes, v), s in zip(moved, self.free):
            step = sizes[s] - base[s]
            if (v - v0) % step:
                break
            slopes[s] = (v - v0) // step
        else:
            terms = {(s,): c for s, c in slopes.items()}
            terms[()] = v0 - sum(c * base[s] for s, c in slopes.items())
            candidates.append(Expr.of(terms))
        for formula in candidates:
            if formula is not None and all(formula.value(sizes) == v for sizes, v in seen):
                return formula
        return None


def _written(formula: Expr | None) -> int | str | None:
    """A dim as the artifacts write it: a size, a dim_param, or unknown."""
    if formula is None or any(s.startswith(ANONYMOUS) for s in formula.symbols):
        return None
    c = formula.constant
    return c if c is not None else str(formula)


def _monomial(value: int, sizes: dict[str, int]) -> Expr | None:
    """``value`` as c * (product of symbols) at ``sizes`` (distinct primes): factor the primes out."""
    if value == 0:
        return Expr.of({})
    mono = []
    for s, p in sizes.items():
        while value % p == 0:
            value //= p
            mono.append(s)
    return Expr.of({tuple(mono): value})


def _input_dims(graph: Graph, wrt) -> dict[str, tuple]:
    """Each graph input's dims, a symbolic one as its symbol name (an unnamed one gets its own name)."""
    dims = {}
    for v in graph.inputs:
        if not isinstance(v.type, TensorType):
            raise UnsupportedOpError(f"graph input '{v.name}' is not a tensor ({v.type})")
        dims[v.name] = tuple(d if isinstance(d, int) else (str(d) if d is not None else f"{ANONYMOUS}{v.name}:{k}")
                             for k, d in enumerate(v.type.shape))
    for name in wrt:
        if name in graph.initializers:
            dims[name] = tuple(graph.initializers[name].shape)
    return dims


def solve(graph: Graph, wrt=(), outputs=None) -> Typing:
    """Unify ``graph``'s symbolic input dims until every shape rule accepts the graph (module docstring).
    ``wrt``: initializers typed as inputs (parameters); ``outputs``: the values to type (default the graph's
    outputs)."""
    dims = _input_dims(graph, wrt)
    symbols = list(dict.fromkeys(d for ds in dims.values() for d in ds if isinstance(d, str)))
    typing = Typing(graph, tuple(wrt), outputs, dims, symbols, {})
    while True:
        try:
            _ = typing.concrete       # every shape rule runs at the base probe sizes
            return typing
        except ShapeError as e:
            binding = _unifier(typing, e)
            if binding is None:
                if not typing.free:
                    raise
                probe = ", ".join(f"{s}={v}" for s, v in typing.env(typing.sizes()).items()
                                  if not s.startswith(ANONYMOUS))
                raise type(e)(f"{e}; symbolic dims were typed as {probe}") from e
            typing = binding


def _unifier(typing: Typing, error: ShapeError) -> Typing | None:
    """``typing`` with one or two more symbols bound so that the probe gets past the node that raised
    ``error`` (it fails later or not at all), or None."""
    ctx = getattr(error, "node_context", None)
    if ctx is None:
        return None
    where = _position(typing.graph, ctx.node)
    singles = _candidates(typing, ctx)
    tries = [[c] for c in singles] + [list(p) for p in itertools.combinations(singles, 2) if p[0][0] != p[1][0]]
    aligned = _aligned(typing, ctx)
    if len(aligned) > 2:          # more symbols than a pair, each tied to the dim beside it (broadcasting)
        tries.append(aligned)
    for bindings in tries:
        trial = Typing(typing.graph, typing.wrt, typing.outputs, typing.dims,
                       [s for s in typing.free if s not in {b[0] for b in bindings}],
                       typing.bound | dict(bindings))
        if any(b[1].symbols & {s for s, _ in bindings} for b in bindings):
            continue    # a pair binding one symbol to the other's formula and back
        try:
            _ = trial.concrete
            return trial
        except ShapeError as e:
            later = getattr(e, "node_context", None)
            if later is not None and _position(typing.graph, later.node) > where:
                return trial
    return None


def _aligned(typing: Typing, ctx) -> list[tuple[str, Expr]]:
    """Each free symbol of the node's tensor inputs bound to the dim at the same place, counted from the right,
    in another input (a dim of 1 broadcasts and binds nothing): a fully dynamic [a, b, c, d] added to a
    [2, 3, 4, 5] constant ties four symbols at one node, more than single and pair tries reach."""
    sizes = typing.sizes()
    by_size = {v: s for s, v in sizes.items() if s in typing.free}
    shapes = [t.shape for t in ctx.in_types if isinstance(t, TensorType)]
    found: dict[str, Expr] = {}
    for a, b in itertools.permutations(shapes, 2):
        for da, db in zip(reversed(a), reversed(b)):
            s = by_size.get(da)
            if s is not None and s not in found and db not in (da, 1):
                found[s] = _monomial(db, {k: v for k, v in sizes.items() if k != s})
    if any(f.symbols & set(found) for f in found.values()):
        return []       # a symbol tied to another symbol being bound: leave it to the single and pair tries
    return list(found.items())


def _position(graph: Graph, node) -> int:
    return next(k for k, n in enumerate(graph.nodes) if n is node)


def _candidates(typing: Typing, ctx) -> list[tuple[str, Expr]]:
    """(symbol, formula) bindings worth trying at the failing node: each free symbol whose probe size is a
    dim of the node, against each other dim of the node and each entry of its small integer constants
    (Reshape's target shape) read as a formula over the free symbols; constants first, 1 last."""
    sizes = typing.sizes()
    by_size = {v: s for s, v in sizes.items()}
    seen = [d for t in ctx.in_types if isinstance(t, TensorType) for d in t.shape]
    seen += [int(v) for c in ctx.consts if c is not None and c.dtype.kind in "iu" and c.ndim == 1 and c.size <= 8
             for v in c if v > 0]
    targets = list(dict.fromkeys(seen))
    symbols = sorted({by_size[d] for d in targets if d in by_size}, key=typing.free.index, reverse=True)
    out = []
    for s in symbols:
        for d in targets:
            if d == sizes[s]:
                continue
            out.append((s, _monomial(d, {k: v for k, v in sizes.items() if k != s})))
    return sorted(out, key=lambda b: (b[1].constant == 1, b[1].constant is None))
