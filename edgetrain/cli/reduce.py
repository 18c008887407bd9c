"""Minimal build: the ops a set of artifacts needs (ORT's reduced-build configs), compact artifacts, trimmed runtime.

Writes OUT/required_operators.config and OUT/required_operators_and_types.config from every model of the given
artifact folders and model files; then (unless --configs-only) the artifacts as compact models under
OUT/artifacts/ (one folder given: OUT/artifacts/; several: OUT/artifacts/<folder name>/; a model file:
OUT/artifacts/<name>.etm), and the trimmed runtime.
"""
from __future__ import annotations

from pathlib import Path


def add_arguments(p):
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="artifact folders (training/eval/optimizer models and checkpoint) or model files")
    p.add_argument("-o", "--output", required=True, help="folder to write the configs and artifacts to")
    p.add_argument("--configs-only", action="store_true",
                   help="write only the two config files: no compact artifacts, no trimmed runtime")
    p.add_argument("--dim", action="append", default=[], metavar="NAME=SIZE",
                   help="size of a symbolic dimension when computing types (default 1)")
    p.add_argument("--batch-size", type=int, nargs="+", default=[1, 32], metavar="N",
                   help="batch sizes the trimmed runtime is compiled and checked for (default 1 32; a symbolic "
                        "batch of 1 and of any other size use different fused loops)")


def run(args) -> int:
    from ..errors import InputError
    from ..minimal_build import reduce

    try:
        dims = {name: int(size) for name, size in (d.split("=", 1) for d in args.dim)}
    except ValueError:
        raise InputError(f"--dim takes NAME=SIZE with an integer size, got {args.dim}") from None
    out = Path(args.output)
    required = reduce.collect(args.paths, dims)
    ops_path, types_path = reduce.write_configs(required, out)
    print(f"{len(required.ops)} ops from {len(required.models)} models -> {ops_path}, {types_path}")
    if args.configs_only:
        return 0
    folders = write_artifacts(args.paths, out / "artifacts")
    build_runtime(args, folders)
    return 0


def write_artifacts(paths, target: Path) -> list[Path]:
    """Compact artifacts for each path; returns the artifact folders written."""
    from ..errors import InputError
    from ..minimal_build import reduce

    paths = [Path(p) for p in paths]
    folders = [p for p in paths if p.is_dir()]
    names = [p.resolve().name for p in folders] + [p.stem for p in paths if not p.is_dir()]
    clashes = sorted({n for n in names if names.count(n) > 1})
    if clashes:
        raise InputError(f"several inputs are named {clashes}; their artifacts would overwrite each other under "
                         f"{target}: rename them or reduce them separately")
    written = []
    for p in paths:
        if p.is_dir():
            dest = target if len(paths) == 1 else target / p.resolve().name
            files = reduce.compact_artifacts(p, dest)
            written.append(dest)
        else:
            files = [reduce.compact_model(p, target / f"{p.stem}.etm")]
        print(f"{p} -> {', '.join(str(f) for f in files)}")
    return written


def build_runtime(args, folders: list[Path]) -> None:
    """The trimmed runtime for the compact artifact folders (edgetrain.minimal_build.runtime)."""
    import shlex

    from ..minimal_build import runtime

    if not folders:
        print("note: the trimmed runtime was not built: it is built from artifact folders, and none was given")
        return
    rebuild = "edgetrain " + " ".join(shlex.quote(a) for a in args.argv)
    build = runtime.build(folders, Path(args.output), batch_sizes=args.batch_size, rebuild_command=rebuild,
                          log=print)     # its log ends with the build's summary
    print(f"install on the device: pip install {build.wheel}   (or pip install {Path(args.output)})")
