"""Fused element-wise steps -> Numba source in real module files in the cache dir -> kernels.

Numba caches compiled code per source file, so each kernel is written once, atomically, to
``<cache>/gen/fused_<hash>.py`` (the name hashes the source and library versions; the file is not rewritten
while it holds that source, since a new mtime would invalidate Numba's cache) and compiled with that file name.
Sizes are not part of the source: the same kernel serves every shape with the same broadcast pattern.
"""
from __future__ import annotations

import hashlib
import math
import sys
import types
from dataclasses import dataclass

import numpy as np

from .. import __version__, atomic, config
from ..errors import AttributeValueError
from ..plan.fusion import Step
from ..plan.specialize import Specialized


@dataclass
class FusedKernel:
    source: str
    inputs: list[str]                      # the step's inputs in the kernel's argument order
    input_shapes: list[tuple[int, ...]]    # collapsed shape each input is viewed with
    output_shape: tuple[int, ...]          # collapsed iteration shape
    scratch_rows: int = 0                  # trailing arguments: float rows of SCRATCH elements (in-place kernels)


# Binary ops whose operands may swap without changing a bit of the result (IEEE + and * of two operands): the
# source takes their operands in a fixed order, so ``a + bias`` and ``bias + a`` are one kernel (one compile)
COMMUTATIVE = frozenset({"Add", "Mul"})


SCRATCH = 256   # elements per scratch row: a chunk of the innermost loop, L1-resident


class _Scalar:
    """What a scalar template sees: the compute type and the node's (validated) attributes. Attribute values
    enter the source only through ``const``, as literals formatted here from numbers."""
    def __init__(self, dtype: np.dtype, ctx):
        self.T = f"np.{np.dtype(dtype).name}" if np.dtype(dtype) != np.bool_ else "np.bool_"
        self.is_int = np.issubdtype(dtype, np.integer)
        self.domain = ctx.node.domain      # ops of one name in two domains (Gelu) share a template
        self._ctx = ctx

    def attr(self, name: str):
        """The attribute's value, for choosing a template's form (never pasted into the source)."""
        return self._ctx.attr(name)

    def const(self, name: str) -> str:
        """The attribute as a literal of the compute type, e.g. ``np.float32(0.01)``."""
        return f"{self.T}({number_literal(self._ctx.attr(name), f'{self._ctx.node} attribute {name!r}')})"


def number_literal(value, what: str) -> str:
    """Python source for a finite number: the only way a value taken from a model reaches generated code."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return str(int(value))
    if isinstance(value, (float, np.floating)) and math.isfinite(value):
        return repr(float(value))
    raise AttributeValueError(f"{what} must be a finite number to be compiled, got {type(value).__name__}")


def collapse(out_shape: tuple[int, ...], in_shapes: list[tuple[int, ...]]):
    """Merge adjacent dims where every input is either full on both or broadcast on both.

    Returns the collapsed iteration shape and, per input, its collapsed view shape (1 where broadcast).
    """
    rank = len(out_shape)
    padded = [(1,) * (rank - len(s)) + tuple(s) for s in in_shapes]
    dims = [d for d in range(rank) if out_shape[d] != 1]
    groups: list[list[int]] = []
    for d in dims:
        pattern = tuple(p[d] != 1 for p in padded)
        if groups and tuple(p[groups[-1][-1]] != 1 for p in padded) == pattern:
            groups[-1].append(d)
        else:
            groups.append([d])
    shape = tuple(int(np.prod([out_shape[d] for d in g])) for g in groups) or (1,)
    views = []
    for p in padded:
        views.append(tuple(int(np.prod([out_shape[d] for d in g])) if p[g[0]] != 1 else 1 for g in groups) or (1,))
    return shape, views


def generate(step: Step, spec: Specialized, in_place: bool = False) -> FusedKernel:
    """``in_place``: an output shares its buffer with an input. LLVM then finds the arrays overlapping and runs
    its scalar loop (4-13x slower, libm calls included), so the innermost loop runs in chunks computed into
    scratch rows (passed in, allocated once by the program) and copied out after each chunk: both vectorize."""
    from ..kernels.elementwise import HELPERS, SCALAR

    shape, views = collapse(step.shape, [spec.types[i].shape for i in step.inputs])
    # arguments in a canonical order (full dims before broadcast ones): with COMMUTATIVE's operand order, steps
    # that differ only in which operand is broadcast share a source
    order = sorted(range(len(step.inputs)), key=lambda k: [n == 1 for n in views[k]])
    inputs, views = [step.inputs[k] for k in order], [views[k] for k in order]
    rank = len(shape)
    idx = [f"i{d}" for d in range(rank)]
    args = [f"a{k}" for k in range(len(inputs))] + [f"o{k}" for k in range(len(step.outputs))]
    names = {v: f"x{k}" for k, v in enumerate(inputs)}
    body: dict[int, list[str]] = {d: [] for d in range(rank + 1)}
    last = rank - 1
    inner = []      # inputs read along the innermost dim: in-place kernels read them through chunk views
    for k, v in enumerate(views):   # load each input at the shallowest loop where its index is fixed
        full = [d for d in range(rank) if v[d] != 1]
        depth = full[-1] + 1 if full else 0
        if in_place and depth == rank:
            inner.append(k)
            body[rank].append(f"x{k} = r{k}[j]")
            continue
        index = ", ".join(idx[d] if v[d] != 1 else "0" for d in range(rank))
        body[depth].append(f"x{k} = a{k}[{index}]")
    temps = []
    for n, b in enumerate(step.nodes):
        node, op = b.node, b.op
        t_in = op.type_input if op.type_input < len(node.inputs) else 0
        k = _Scalar(b.ctx.in_types[t_in].dtype, b.ctx)
        operands = [names[i] if i else None for i in node.inputs]
        if node.op_type in COMMUTATIVE and len(operands) == 2 and None not in operands:
            operands.sort(key=lambda name: (name[0], int(name[1:])))
        expr = SCALAR[node.op_type](operands, k)
        names[node.outputs[0]] = f"t{n}"
        temps.append(f"t{n} = {expr}")
    n_out = len(step.outputs)
    if in_place:
        # one chunk of the innermost dim at a time, through 1-D views: LLVM vectorizes loops over 1-D views
        # (indexing the N-D arrays with a chunk offset stayed scalar: 9x slower on a [256, 192] bias add)
        args += [f"s{k}" for k in range(n_out)]
        stores = [f"s{k}[j] = {names[o]}" for k, o in enumerate(step.outputs)]
        outer = ", ".join(idx[:last] + ["c0:c1"])
        views_in = [f"r{k} = a{k}[{', '.join([idx[d] if views[k][d] != 1 else '0' for d in range(last)] + ['c0:c1'])}]"
                    for k in inner]
        copies = [line for k in range(n_out)
                  for line in (f"q{k} = o{k}[{outer}]", f"for j in range(c1 - c0):", f"    q{k}[j] = s{k}[j]")]
    else:
        out_index = ", ".join(idx)
        stores = [f"o{k}[{out_index}] = {names[o]}" for k, o in enumerate(step.outputs)]
    lines = [f"def kernel({', '.join(args)}):", f"    {', '.join(f'n{d}' for d in range(rank))}, = o0.shape"]
    indent = "    "
    for d in range(rank):
        lines += [indent + s for s in body[d]]
        if in_place and d == last:
            lines.append(f"{indent}for c0 in range(0, n{d}, {SCRATCH}):")
            lines.append(f"{indent}    c1 = min(c0 + {SCRATCH}, n{d})")
            lines += [f"{indent}    {v}" for v in views_in]
            lines.append(f"{indent}    for j in range(c1 - c0):")
            indent += "        "
        else:
            lines.append(f"{indent}for {idx[d]} in range(n{d}):")
            indent += "    "
    lines += [indent + s for s in body[rank] + temps + stores]
    if in_place:
        lines += [indent[:-4] + c for c in copies]
    func = "\n".join(lines) + "\n"
    helpers = "".join(src for name, src in HELPERS.items() if f"{name}(" in func)
    # numpy's error model: float x / 0 gives inf or nan, as numpy and onnxruntime do, not ZeroDivisionError
    source = ("import math\nimport numpy as np\nfrom numba import njit\n" + helpers
              + "\n\n@njit(cache=True, nogil=True, error_model=\"numpy\")\n" + func)
    return FusedKernel(source, inputs, views, shape, n_out if in_place else 0)


_LOADED: dict[str, object] = {}
_SOURCES: dict[str, str] = {}      # module name of a loaded generated kernel -> its source


def load(source: str):
    """Write ``source`` once to the cache dir and run it as the module ``kernel`` comes from (compiled code is
    cached on disk by Numba, keyed on the file's path and modification time).

    The folder is private to this user (``config.cache_folder``); a file found there that is not byte for byte
    ``source`` is replaced first, and the module is compiled from ``source`` itself, not from what the file
    holds, so a planted file never runs. On the warm path (``kernels/_jit.py``) a loop the warm kernel set
    holds comes from there instead, without Numba."""
    from ..kernels import _jit

    warm = _jit.warm_generated(source, _load_jit)
    return warm if warm is not None else _load_jit(source)


def source_of(module_name: str) -> str | None:
    """The source of the generated kernel module ``module_name`` loaded in this process, or None."""
    return _SOURCES.get(module_name)


def _load_jit(source: str):
    from ..kernels import _jit

    numba = _jit.load_numba()
    key = hashlib.sha256(f"{__version__}|{numba.__version__}|{source}".encode()).hexdigest()[:24]
    if key in _LOADED:
        return _LOADED[key]
    path = config.cache_folder("gen") / f"fused_{key}.py"
    atomic.ensure_content(path, source.encode())
    name = f"edgetrain_gen_fused_{key}"
    module = types.ModuleType(name)
    module.__file__ = str(path)
    sys.modules[name] = module
    _SOURCES[name] = source
    exec(compile(source, str(path), "exec"), module.__dict__)     # noqa: S102 -- edgetrain's own source
    _LOADED[key] = _jit.register(module.kernel)
    return _LOADED[key]
