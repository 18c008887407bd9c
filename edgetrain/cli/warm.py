"""Compile the kernels of artifact folders ahead of time, so later processes train them without Numba.

The kernel set goes to the user's cache folder, keyed by this installation and machine (kernel sources, Numba
version, CPU, Python). Module and InferenceSession then call its kernels without importing Numba; a kernel or
signature it lacks imports Numba and compiles as before. Warming again adds folders: those warmed before are
compiled with them. Needs a C compiler, Python's headers (e.g. apt install gcc python3-dev) and
pip install 'edgetrain[reduce]'. EDGETRAIN_NO_AOT=1 ignores the set.
"""
from __future__ import annotations


def add_arguments(p):
    p.add_argument("folders", nargs="+", metavar="ARTIFACTS",
                   help="artifact folders (training/eval/optimizer models and checkpoint)")
    p.add_argument("--batch-size", type=int, nargs="+", default=[1, 32], metavar="N",
                   help="batch sizes to compile for when the inputs' batch dim is symbolic (default 1 32: a batch "
                        "of 1 and of any other size use different fused loops)")


def run(args) -> int:
    from ..minimal_build import warm

    warm.build(args.folders, args.batch_size, log=print)
    return 0
