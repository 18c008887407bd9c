"""The automatic warm-set build: the detached process ``kernels/_autowarm.py`` starts when a process that ran
artifact folders under the JIT exits.

    python -m edgetrain.minimal_build.autowarm [--feeds JSON] [--] FOLDER...

It lowers its priority (nice 19), takes the cache's build lock without waiting (a build already running wins;
the folders it lacks are asked for again by the next process that needs them), keeps the folders that are
complete artifact folders (``exercise.artifact_files``) and not in the set yet, and calls ``warm.build``: staged
in the cache, then put in place whole, so a process starting meanwhile (or after this one was killed) sees the
old set or none, never half of one. ``<cache>/aot/autowarm.json`` says how it went (folders, state, seconds,
error), ``autowarm.log`` what it printed.

``--feeds`` (folder -> the input shapes the run bound, ``exercise.check_feeds``'s form) is checked before use,
like a file: a folder with shapes is run with exactly those, the others at batch sizes.

Only folders the user's own processes trained from are built, through the same checked loaders as any training
run: nothing in a model becomes code, and the set's manifest is checked as data when it is loaded.
"""
from __future__ import annotations

import json
import os
import sys
import time

from .. import atomic, config
from ..errors import EdgetrainError
from ..kernels import _warm
from ..kernels._autowarm import (NICENESS, OPT_OUT, STATUS, compiler_missing, decide, enabled,  # noqa: F401
                                 read_status, start)
from . import warm
from .exercise import artifact_files

__all__ = ["OPT_OUT", "STATUS", "artifact_folders", "compiler_missing", "decide", "enabled", "main", "read_status",
           "start"]    # the decision and start live with the warm path (kernels/), which api may import

LOG = "autowarm.log"


def artifact_folders(folders) -> tuple[list[str], list[str]]:
    """(complete artifact folders, the others)."""
    kept, refused = [], []
    for f in folders:
        try:
            artifact_files(f)
        except (EdgetrainError, OSError):
            refused.append(f)
            continue
        kept.append(f)
    return kept, refused


def parse_args(argv=None):
    import argparse

    p = argparse.ArgumentParser(prog="python -m edgetrain.minimal_build.autowarm")
    p.add_argument("--feeds", default="{}", help="JSON: artifact folder -> input shape sets the run bound")
    p.add_argument("folders", nargs="*")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        args.feeds = json.loads(args.feeds)
    except ValueError:
        args.feeds = None
    if not isinstance(args.feeds, dict):
        p.error("--feeds is not a JSON mapping of artifact folders")
    return args


def main(argv=None) -> int:
    try:
        os.nice(NICENESS)
    except OSError:
        pass                     # already at the lowest priority allowed
    args = parse_args(argv)
    asked = args.folders
    set_key = _warm.key()
    aot = config.cache_folder("aot")
    with warm.build_lock(wait=False) as held:
        if not held:
            return 0             # another build runs
        folders, refused = artifact_folders(sorted(set(asked) - set(_warm.warmed_folders(set_key))))
        if not folders and not refused:
            return 0
        started = time.time()
        status = {"key": set_key, "folders": folders or refused, "state": "running", "started": started,
                  "pid": os.getpid()}
        atomic.write_text(aot / STATUS, json.dumps(status))
        if not folders:          # remembered as failed: those processes do not ask again under this key
            status.update(state="failed", error=f"not complete artifact folders: {refused}")
        else:
            lines: list[str] = []
            try:
                feeds = {f: s for f, s in args.feeds.items() if f in folders}    # checked by the build
                warm.build(folders, log=lines.append, locked=True, feeds=feeds)
                status.update(state="done")
            except (EdgetrainError, OSError, ValueError, KeyError) as e:   # recorded: not retried
                status.update(state="failed", error=f"{type(e).__name__}: {str(e)[-2000:]}")
            atomic.write_text(aot / LOG, "\n".join(lines) + "\n")
        status["seconds"] = round(time.time() - started, 1)
        atomic.write_text(aot / STATUS, json.dumps(status))
    return 0 if status["state"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
