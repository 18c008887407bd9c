"""Compile recorded kernel signatures ahead of time into one extension module with ``numba.pycc``.

Each (kernel, signature) becomes one exported function, compiled with the same Numba options the JIT used
(fastmath flags, error model), for this machine's CPU (name and features, as the JIT targets it). The
manifest written beside the module maps each kernel id to its exports and their argument keys, which the
trimmed runtime's dispatcher (``device_jit.py``) matches calls against.

pycc compiles every export with one set of flags and a generic CPU; ``_per_export_options`` swaps two Numba
internals for the duration of the build (``numba.pycc.compiler.compile_extra``, the AOT codegen's CPU
features). tests/test_minimal_build.py checks the result trains exactly as the JIT does.

Run as a script in a fresh process (``runtime.build`` does), so only the artifacts' kernels are recorded:

    python -m edgetrain.minimal_build.aot OUT_DIR --batch-size 1,32 ARTIFACT_FOLDER...
"""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from .. import atomic
from ..errors import EdgetrainError
from ..kernels._aot import DIGEST_EXPORT, export_name
from .record import KernelUse, record

MODULE_NAME = "_aot_kernels"
MANIFEST = "aot_kernels.json"


def arg_key(t) -> str:
    """The key of a Numba argument type, as ``device_jit.value_key`` computes it from a Python value."""
    from numba.core import types
    from numba.np.numpy_support import as_dtype

    if isinstance(t, types.Array):
        return f"{np.dtype(as_dtype(t.dtype)).name}[{t.ndim}{t.layout}]" + ("" if t.mutable else "ro")
    if isinstance(t, types.Boolean):
        return "bool"
    if isinstance(t, (types.Integer, types.Float)):
        return str(t)
    if isinstance(t, types.NoneType):
        return "none"
    if isinstance(t, types.BaseTuple):
        return "(" + ",".join(arg_key(x) for x in t.types) + ")"
    raise EdgetrainError(f"argument type {t} has no key in the trimmed runtime's dispatcher")


@contextlib.contextmanager
def _per_export_options(options: dict, cpu_features: str):
    """pycc compiles every export with one default set of flags and no CPU features; compile each export
    with its kernel's own options instead (``options``: py_func -> Numba target options), for this CPU."""
    from numba.core.codegen import AOTCPUCodegen
    from numba.core.compiler import Flags
    from numba.core.cpu import CPUTargetOptions
    from numba.pycc import compiler as pycc_compiler

    real_compile = pycc_compiler.compile_extra
    real_features = AOTCPUCodegen._customize_tm_features

    def compile_extra(typingctx, targetctx, func, args, return_type, flags, locals, **kws):
        if func in options:        # not the manifest digest, which has no kernel options
            own = CPUTargetOptions.parse_as_flags(Flags(), options[func])
            for name in ("fastmath", "error_model", "boundscheck", "release_gil"):
                setattr(flags, name, getattr(own, name))
        return real_compile(typingctx, targetctx, func, args, return_type, flags, locals, **kws)

    pycc_compiler.compile_extra = compile_extra
    AOTCPUCodegen._customize_tm_features = lambda self: cpu_features
    try:
        yield
    finally:
        pycc_compiler.compile_extra = real_compile
        AOTCPUCodegen._customize_tm_features = real_features


def _constant(value: int):
    """A function returning ``value``: Numba freezes the closure's cell as a constant."""
    def constant():
        return value
    return constant


def compile_kernels(uses: list[KernelUse], out_dir: Path, target_cpu: str | None = None,
                    digest=None) -> dict:
    """Build ``out_dir/_aot_kernels<ext suffix>``; return the manifest's ``kernels`` and target.
    ``digest(kernels) -> int``: compiled in as the export ``DIGEST_EXPORT``, so a manifest edited after the
    build no longer matches its module (the warm path checks it)."""
    import llvmlite.binding as ll
    from numba.core.codegen import get_host_cpu_features
    try:
        from numba.pycc import CC
    except ImportError as e:         # pycc needs setuptools at build time
        raise EdgetrainError(f"building the trimmed runtime needs numba.pycc: {e}") from None

    cpu = target_cpu or ll.get_host_cpu_name()
    features = get_host_cpu_features() if target_cpu is None else ""
    cc = CC(MODULE_NAME)
    cc.output_dir = str(out_dir)
    cc.target_cpu = cpu
    kernels: dict[str, list] = {}
    options = {}
    for use in uses:
        options[use.py_func] = {k: v for k, v in use.options.items() if k != "inline"}
        exports = kernels[use.kernel_id] = []
        for k, sig in enumerate(use.signatures):
            name = export_name(use.kernel_id, k)
            exports.append([name, [arg_key(t) for t in sig.args]])
            cc.export(name, sig)(use.py_func)
    if digest is not None:
        cc.export(DIGEST_EXPORT, "i8()")(_constant(digest(kernels)))
    with _per_export_options(options, features):
        try:
            cc.compile()
        except Exception as e:
            if type(e).__name__ in ("CompileError", "LinkError", "DistutilsExecError", "DistutilsPlatformError"):
                raise EdgetrainError(f"building the kernel module needs a C compiler and Python's headers (e.g. "
                                     f"apt install gcc python3-dev): {e}") from None
            raise
    return {"module": MODULE_NAME, "file": cc.output_file, "target_cpu": cpu, "cpu_features": features,
            "kernels": kernels}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgetrain.minimal_build.aot", description=__doc__.splitlines()[0])
    p.add_argument("out_dir", type=Path)
    p.add_argument("folders", type=Path, nargs="+")
    p.add_argument("--batch-size", default="1", help="comma-separated batch sizes for symbolic batch dims")
    p.add_argument("--target-cpu", default=None, help="LLVM CPU name (default: this machine's, with its features)")
    args = p.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore", message=".*pycc.*")   # pending deprecation; pinned and tested here
    sizes = [int(b) for b in args.batch_size.split(",") if b]
    t0 = time.perf_counter()
    rec = record(args.folders, sizes)
    t1 = time.perf_counter()
    n_sigs = sum(len(u.signatures) for u in rec.kernels)
    print(f"recorded {len(rec.kernels)} kernels, {n_sigs} signatures, {len(rec.ops)} ops in {t1 - t0:.1f} s",
          file=sys.stderr)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    manifest = compile_kernels(rec.kernels, args.out_dir, args.target_cpu)
    print(f"compiled {manifest['file']} for {manifest['target_cpu']} in {time.perf_counter() - t1:.1f} s",
          file=sys.stderr)
    manifest["ops"] = sorted([d, o] for d, o in rec.ops)
    manifest["batch_sizes"] = rec.batch_sizes
    # kernel families whose launchers ran (imported lazily by the runtime), elementwise for codegen's templates;
    # not the private helpers (_jit, _aot, _warm)
    manifest["families"] = sorted(m.rsplit(".", 1)[1] for m in sys.modules
                                  if m.startswith("edgetrain.kernels.") and "._" not in m)
    atomic.write_text(args.out_dir / MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except EdgetrainError as e:
        print(f"edgetrain: error: {e}", file=sys.stderr)
        sys.exit(2)
