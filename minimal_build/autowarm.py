"""The warm set built by default: a process that ran artifact folders' kernels under the JIT starts, as it
exits, a detached low-priority ``edgetrain warm`` of those folders; later processes load the set and never
import Numba.

What decides (``decide``): the JIT ran in this process (Numba loaded and a kernel compiled or came from
Numba's cache), at least one training model was read from an artifact folder the current set (``_warm``'s
key) does not already hold, and no earlier automatic build of the same folders under the same key failed.
Checked before spawning: a C compiler and Python's headers (``numba.pycc`` needs both; without them nothing
runs), ``EDGETRAIN_NO_AUTOWARM`` unset, the warm path itself on (``EDGETRAIN_NO_AOT``, ``NUMBA_DISABLE_JIT``).
``api`` calls ``at_exit`` only in a process that imported Numba: a process the set served imports none of this.

The background process (``python -m edgetrain.minimal_build.autowarm FOLDER...``) runs at nice 19 in its own
session, takes the build lock without waiting (a build already running wins; the folders it lacks are asked
for again by the next process that needs them), and calls ``warm.build``: staged in the cache, then put in
place whole, so a process starting meanwhile sees the old set or none, never half of one.
``<cache>/aot/autowarm.json`` says how the last automatic build went (folders, state, seconds, error),
``autowarm.log`` what it printed.

Only folders the user's own process opened are built, and ``warm.build`` runs them through the same checked
loaders as any training run: nothing in a model becomes code, and the set's manifest is checked as data when
it is loaded (``_warm._load``).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .. import config

OPT_OUT = "EDGETRAIN_NO_AUTOWARM"
STATUS = "autowarm.json"
LOG = "autowarm.log"
NICENESS = 19

def enabled() -> bool:
    from ..kernels import _warm

    return not config.flag(OPT_OUT) and _warm.enabled()


def decide(noted, jit_ran: bool, warmed, failed) -> list[str]:
    """The folders to build, or [] for none.

    ``noted``: artifact folders this process trained from; ``jit_ran``: whether kernels ran under the JIT;
    ``warmed``: folders the current set holds; ``failed``: folders an automatic build under this key failed
    for."""
    if not jit_ran:
        return []
    wanted = sorted(set(noted) - set(warmed))
    if not wanted or set(wanted) <= set(failed):
        return []
    return wanted


def compiler_missing() -> str | None:
    """Why ``numba.pycc`` could not build here (no C compiler, no Python headers, no setuptools), or None."""
    import importlib.util
    import shlex
    import shutil
    import sysconfig

    cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")
    if not cc or shutil.which(cc[0]) is None:
        return f"no C compiler ({cc[0] if cc else 'CC is empty'})"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers (Python.h)"
    if importlib.util.find_spec("setuptools") is None:
        return "no setuptools (numba.pycc needs it)"
    return None


def status_file() -> Path:
    return config.cache_folder("aot") / STATUS


def read_status(path: Path) -> dict | None:
    """The last automatic build's status (a mapping), or None when there is none or it is not one."""
    import json

    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return status if isinstance(status, dict) else None


def _failed_before(set_key: str) -> list[str]:
    status = read_status(status_file())
    if not status or status.get("key") != set_key or status.get("state") != "failed":
        return []
    folders = status.get("folders")
    return [f for f in folders if isinstance(f, str)] if isinstance(folders, list) else []


def _jit_ran() -> bool:
    jit = sys.modules.get("edgetrain.kernels._jit")
    if jit is None or jit.numba is None:
        return False
    stats = jit.compile_stats()
    return stats["hits"] + stats["misses"] > 0


def artifact_folders(folders) -> list[str]:
    from ..errors import EdgetrainError
    from .exercise import artifact_files

    kept = []
    for f in folders:
        try:
            artifact_files(f)
        except (EdgetrainError, OSError):
            continue          # a model file outside a complete artifact folder: nothing to warm from
        kept.append(f)
    return kept


def plan(model_files) -> list[str]:
    """What this process would build now ([] for nothing): ``decide`` on this process's facts
    (``model_files``: the training models it read)."""
    if not model_files or not enabled() or not _jit_ran():
        return []
    from ..kernels import _warm
    from .warm import warmed_before

    set_key = _warm.key()
    noted = sorted({str(Path(f).resolve().parent) for f in model_files})
    return decide(artifact_folders(noted), True, warmed_before(set_key), _failed_before(set_key))


def start(folders: list[str]):
    """Spawn the detached background build of ``folders``; returns the Popen, or None (no compiler)."""
    import subprocess

    missing = compiler_missing()
    if missing:
        if config.debug():
            print(f"edgetrain: no automatic warm kernel set: {missing}", file=sys.stderr)
        return None
    env = dict(os.environ, **{OPT_OUT: "1"})     # the build's own processes start no build
    return subprocess.Popen([sys.executable, "-m", "edgetrain.minimal_build.autowarm", *folders],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True, env=env)


def at_exit(model_files) -> None:
    """``api``'s exit hook (in a process that imported Numba): start the build ``plan`` asks for, if any."""
    from ..errors import EdgetrainError

    try:
        folders = plan(model_files)
        if folders:
            start(folders)
    except (OSError, EdgetrainError) as e:     # the run itself succeeded: its exit must not fail for this
        if config.debug():
            print(f"edgetrain: could not start the automatic warm kernel set: {e}", file=sys.stderr)


def main(argv=None) -> int:
    """The background build (a detached process, see the module docstring)."""
    import json
    import time

    from .. import atomic
    from ..errors import EdgetrainError
    from ..kernels import _warm
    from . import warm

    try:
        os.nice(NICENESS)
    except OSError:
        pass                     # already at the lowest priority allowed
    folders = list(sys.argv[1:] if argv is None else argv)
    set_key = _warm.key()
    aot = config.cache_folder("aot")
    with warm.build_lock(wait=False) as held:
        if not held:
            return 0             # another build runs
        folders = sorted(set(folders) - set(warm.warmed_before(set_key)))
        if not folders:
            return 0
        started = time.time()
        status = {"key": set_key, "folders": folders, "state": "running", "started": started,
                  "pid": os.getpid()}
        atomic.write_text(aot / STATUS, json.dumps(status))
        with open(aot / LOG, "w") as log:
            try:
                warm.build(folders, log=lambda msg: print(msg, file=log, flush=True), locked=True)
                status.update(state="done")
            except EdgetrainError as e:
                status.update(state="failed", error=str(e)[-2000:])
        status["seconds"] = round(time.time() - started, 1)
        atomic.write_text(aot / STATUS, json.dumps(status))
    return 0 if status["state"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main())
