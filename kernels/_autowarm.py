"""Whether a process builds the warm kernel set as it exits, and starting that build (``minimal_build/autowarm.py``
is the build itself): the warm set by default.

``api`` remembers each artifact folder a training run read its training and optimizer models from, and, in a
process that imported Numba, calls ``at_exit`` with them. What decides (``decide``): kernels ran under the JIT
(Numba's dispatchers compiled or loaded one), a folder is not in the current set (``_warm``'s key), and no
automatic build under this key failed for it. Checked before spawning: ``EDGETRAIN_NO_AUTOWARM`` unset, the warm
path on (``EDGETRAIN_NO_AOT``, ``NUMBA_DISABLE_JIT``), a C compiler, Python's headers and setuptools (what
``numba.pycc`` needs; without them nothing starts). A process the warm set served has no Numba and never
imports this module.

The build is a detached process (its own session, so it outlives the terminal or service that started the run)
at nice 19: ``python -m edgetrain.minimal_build.autowarm [--feeds JSON] FOLDER...``. ``--feeds`` carries the
input shapes and dtypes the run bound per folder and model (numbers and names only, checked by the build as any
file is): the build runs each folder with exactly those, since a batch size cannot give every symbolic dim
(labels shaped [N*T]).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from edgetrain import config

from . import _warm

OPT_OUT = "EDGETRAIN_NO_AUTOWARM"
STATUS = "autowarm.json"      # in <cache>/aot/: the last automatic build's folders, state, seconds, error
NICENESS = 19                 # the build yields the cores to any other work (the next training run)


def enabled() -> bool:
    return not config.flag(OPT_OUT) and _warm.enabled()


def decide(noted, jit_ran: bool, warmed, failed) -> list[str]:
    """The folders to build, or [] for none.

    ``noted``: artifact folders this process trained from; ``jit_ran``: whether kernels ran under the JIT;
    ``warmed``: folders the current set holds (a kernel of theirs that still falls back to the JIT is another
    dtype or broadcast pattern, which a rebuild would not add); ``failed``: folders an automatic build under
    this key failed for (not retried)."""
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
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return status if isinstance(status, dict) else None


def failed_before(set_key: str) -> list[str]:
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


def plan(folders) -> list[str]:
    """What this process would build now ([] for nothing): ``decide`` on its facts."""
    folders = [f for f in folders if os.path.isdir(f)]    # a temporary folder (``edgetrain demo``) is gone by now
    if not folders or not enabled() or not _jit_ran():
        return []
    set_key = _warm.key()
    return decide(folders, True, _warm.warmed_folders(set_key), failed_before(set_key))


def start(folders: list[str], feeds: dict | None = None):
    """Spawn the detached background build of ``folders``; the Popen, or None (nothing to build it with).
    ``feeds``: folder -> {"train"|"eval": [{input: [shape, dtype name]}, ...]} (``TrainingProgram.fed_shapes``),
    for the folders whose shapes are known."""
    import subprocess

    missing = compiler_missing()
    if missing:
        if config.debug():
            print(f"edgetrain: no automatic warm kernel set: {missing}", file=sys.stderr)
        return None
    env = dict(os.environ, **{OPT_OUT: "1"})     # the build's own processes start no build
    if config.debug():
        print(f"edgetrain: building the warm kernel set of {', '.join(folders)} in the background "
              f"(nice {NICENESS}; {status_file()})", file=sys.stderr)
    shapes = {f: s for f, s in (feeds or {}).items() if f in folders and any(s.values())}
    return subprocess.Popen([sys.executable, "-m", "edgetrain.minimal_build.autowarm", "--feeds", json.dumps(shapes),
                             "--", *folders],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True, env=env)


def at_exit(folders, feeds: dict | None = None) -> None:
    """``api``'s exit hook: start the build ``plan`` asks for, if any (``feeds`` as ``start`` takes them)."""
    from edgetrain.errors import EdgetrainError

    try:
        wanted = plan(folders)
        if wanted:
            start(wanted, feeds)
    except (OSError, EdgetrainError) as e:     # the run itself succeeded: its exit must not fail for this
        if config.debug():
            print(f"edgetrain: could not start the automatic warm kernel set: {e}", file=sys.stderr)
