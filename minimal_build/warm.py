"""``edgetrain warm``: compile the kernels of artifact folders ahead of time into the user's cache folder, so
later processes of the full package train them without importing Numba (``kernels/_warm.py`` finds the set,
``kernels/_jit.py`` calls it).

A fresh process with the warm path off runs every folder under the JIT at each batch size (``record.py``) and
compiles what ran with ``numba.pycc`` (``aot.py``) into a staging folder in the cache, with the manifest and
the digest the warm path checks; the staging folder then replaces the set whole (``atomic.replace_folder``).
There is one set per key (installation and machine): folders warmed before under the same key are compiled
again with the new ones, so the set keeps serving them.

    python -m edgetrain.minimal_build.warm STAGING_DIR --batch-size 1,32 [--feeds JSON] ARTIFACT_FOLDER...

(the fresh process). A folder with input shapes (``--feeds``: folder -> ``exercise.check_feeds``'s shape sets,
what the automatic build got from the run that trained it) runs with exactly those instead of batch sizes; the
manifest keeps them, so a later build that compiles the folder again runs it the same way.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .. import atomic, config
from ..errors import EdgetrainError
from ..kernels import _warm
from .exercise import check_feeds

DEFAULT_BATCH_SIZES = (1, 32)   # 1 and any other size cover both broadcast patterns of a symbolic batch dim
THREADS = (1, 2)                # 1 and any other count cover the kernels of unsplit and thread-split ops


def build_lock(wait: bool = True):
    """Hold the cache's build lock (one build at a time: each merges the folders warmed before, so two at once
    would drop one's folders); yields whether it is held (False only with ``wait=False`` when another holds it).
    The lock is on the ``aot`` folder itself: no lock file to create, replace or leave behind."""
    return atomic.locked(config.cache_folder("aot"), wait)


def build(artifact_folders, batch_sizes=DEFAULT_BATCH_SIZES, log=None, locked: bool = False, feeds=None) -> dict:
    """Compile the kernels of ``artifact_folders`` (and of those warmed before) at ``batch_sizes`` into this
    user's cache; returns the set's manifest. Needs a C compiler and Python's headers (``numba.pycc``).
    ``feeds``: folder -> input shapes (JSON data in ``exercise.check_feeds``'s form) to run it with instead.
    Waits for a build already running (``locked``: the caller holds ``build_lock``)."""
    log = log or (lambda msg: None)
    if not locked:
        with build_lock(wait=False) as held:
            if held:
                return build(artifact_folders, batch_sizes, log, locked=True, feeds=feeds)
        log("another build of the warm kernel set is running (an automatic one?); waiting for it")
        with build_lock(wait=True):
            return build(artifact_folders, batch_sizes, log, locked=True, feeds=feeds)
    folders = [str(Path(f).resolve()) for f in artifact_folders]
    sizes = sorted({int(b) for b in batch_sizes})
    if not folders:
        raise EdgetrainError("edgetrain warm needs at least one artifact folder")
    if not sizes or min(sizes) < 1:
        raise EdgetrainError(f"batch sizes must be positive integers, got {list(batch_sizes)}")
    for f in folders:
        if not Path(f).is_dir():
            raise EdgetrainError(f"artifact folder {f} does not exist")
    set_key = _warm.key()
    before = _warm.warmed_folders(set_key)
    everything = sorted(set(folders) | set(before))
    sizes = sorted(set(sizes).union(*before.values()))
    shapes = known_feeds(_warm.warmed_feeds(set_key), before, log)
    shapes |= {str(Path(f).resolve()): check_feeds(s, f"artifact folder {f}") for f, s in (feeds or {}).items()}
    if before:
        log(f"the warm set also holds {len(before)} folder(s) warmed before; compiling them again with the new ones")
    for stale in config.cache_folder("aot").glob(".stage-*"):
        shutil.rmtree(stale, ignore_errors=True)      # a build cut off (under this lock, no other build runs)
    stage = config.cache_folder("aot") / f".stage-{os.getpid()}-{secrets.token_hex(4)}"
    stage.mkdir(mode=0o700)
    try:
        fed = sum(f in shapes for f in everything)
        at = " and ".join(([f"{fed} with the input shapes a run fed"] if fed else [])
                          + ([f"{len(everything) - fed} at batch sizes {sizes}"] if fed < len(everything) else []))
        log(f"compiling the kernels of {len(everything)} artifact folder(s), {at} (tens of seconds)")
        # the recording process runs the JIT it records, and starts no automatic build of its own
        env = dict(os.environ, EDGETRAIN_NO_AOT="1", EDGETRAIN_NO_AUTOWARM="1")
        cmd = [sys.executable, "-m", "edgetrain.minimal_build.warm", str(stage), "--batch-size",
               ",".join(map(str, sizes)), "--feeds", json.dumps({f: s for f, s in shapes.items() if f in everything}),
               *everything]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        if proc.returncode != 0:
            raise EdgetrainError("compiling the warm kernel set failed:\n" + proc.stderr.strip()[-4000:])
        log(proc.stderr.strip())
        manifest = json.loads((stage / _warm.MANIFEST).read_text())
        if manifest["key"] != set_key:
            raise EdgetrainError("the kernel set was compiled under another key (edgetrain, Numba or the "
                                 "environment changed while it ran); run edgetrain warm again")
        atomic.replace_folder(stage, _warm.folder(set_key))
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    if not compile_bytecode():
        log("could not write the package's .pyc files (read-only install?): each process compiles its modules")
    n_sigs = sum(len(e) for e in manifest["kernels"].values())
    log(f"warm kernel set {_warm.folder(set_key)}: {len(manifest['kernels'])} kernels / {n_sigs} signatures "
        f"for {len(everything)} artifact folder(s), {at}")
    return manifest


def known_feeds(recorded: dict, folders, log) -> dict:
    """The shape sets a set's manifest recorded for ``folders``, checked as data (a folder whose entry fails
    the check runs at batch sizes, with the reason logged)."""
    kept = {}
    for f in folders:
        if f in recorded:
            try:
                kept[f] = check_feeds(recorded[f], f"artifact folder {f} (in the warm set's manifest)")
            except EdgetrainError as e:
                log(f"{e}; running it at batch sizes")
    return kept


def compile_bytecode() -> bool:
    """Write the .pyc files of the package's modules (kernels included), as ``pip install`` does for a wheel.

    An editable install, or one made with PYTHONDONTWRITEBYTECODE set, has none, and then every process
    compiles the ~70 modules a training step imports from source: 0.13-0.18 s of a 0.3 s warm start. Returns
    whether every folder could be written."""
    import compileall
    import importlib.util

    folders = {Path(importlib.util.find_spec("edgetrain").origin).parent,
               Path(importlib.util.find_spec("edgetrain.kernels").submodule_search_locations[0])}
    return all(compileall.compile_dir(str(f), quiet=1) for f in sorted(folders))


def main(argv=None) -> int:
    from .aot import compile_kernels
    from .record import record

    p = argparse.ArgumentParser(prog="python -m edgetrain.minimal_build.warm", description=__doc__.splitlines()[0])
    p.add_argument("stage", type=Path)
    p.add_argument("folders", type=Path, nargs="+")
    p.add_argument("--batch-size", default="1", help="comma-separated batch sizes for symbolic batch dims")
    p.add_argument("--feeds", default="{}", help="JSON: artifact folder -> input shape sets to run it with")
    args = p.parse_args(argv)
    if _warm.enabled():
        raise EdgetrainError("run with EDGETRAIN_NO_AOT=1: the kernels must run under the JIT to be recorded")
    import warnings

    warnings.filterwarnings("ignore", message=".*pycc.*")   # pending deprecation; pinned and tested here
    set_key = _warm.key()
    t0 = time.perf_counter()
    try:
        asked = json.loads(args.feeds)
    except ValueError as e:
        raise EdgetrainError(f"--feeds is not JSON: {e}") from None
    if not isinstance(asked, dict):
        raise EdgetrainError("--feeds must map artifact folders to input shapes")
    feeds = {str(f): check_feeds(s, f"artifact folder {f}") for f, s in asked.items()}
    rec = record(args.folders, [int(b) for b in args.batch_size.split(",") if b], THREADS, feeds)
    t1 = time.perf_counter()
    print(f"recorded {len(rec.kernels)} kernels in {t1 - t0:.1f} s", file=sys.stderr)
    manifest = compile_kernels(rec.kernels, args.stage, digest=lambda kernels: _warm.digest(set_key, kernels))
    if Path(manifest["file"]).name != _warm.module_path(set_key).name:
        raise EdgetrainError(f"pycc wrote {manifest['file']}, the warm path loads {_warm.module_path(set_key).name}")
    print(f"compiled {Path(manifest['file']).name} for {manifest['target_cpu']} in {time.perf_counter() - t1:.1f} s",
          file=sys.stderr)
    manifest["key"] = set_key
    manifest["file"] = Path(manifest["file"]).name    # the staging folder is renamed; the loader computes the path
    manifest["artifacts"] = {str(f): sorted(s or [1]) for f, s in rec.batch_sizes.items()}
    manifest["feeds"] = rec.feeds
    atomic.write_text(args.stage / _warm.MANIFEST, json.dumps(manifest, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except EdgetrainError as e:
        print(f"edgetrain: error: {e}", file=sys.stderr)
        sys.exit(2)
