"""Switches read from the environment, and where edgetrain keeps its kernel cache."""
import os
import stat
import zlib
from pathlib import Path

from .errors import CacheFolderError


def flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def fusion_enabled() -> bool:
    return not flag("EDGETRAIN_NO_FUSION")


def planner_enabled() -> bool:
    return not flag("EDGETRAIN_NO_PLANNER")


def debug() -> bool:
    return flag("EDGETRAIN_DEBUG")


def cache_dir() -> Path:
    """``EDGETRAIN_CACHE_DIR``, else ``$XDG_CACHE_HOME/edgetrain``, else ``~/.cache/edgetrain``."""
    explicit = os.environ.get("EDGETRAIN_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "edgetrain"


def cache_folder(sub: str) -> Path:
    """``cache_dir() / sub`` (``gen``, ``numba``), created 0700 where missing and checked by ``secure_folder``:
    what is cached there is imported and run, so nobody else may be able to write it."""
    root = secure_folder(cache_dir())
    return secure_folder(root / sub)


def secure_folder(folder) -> Path:
    """``folder``, after creating it and its missing parents with mode 0700 and checking that it and every
    folder created here are owned by this user and not writable by group or others.

    Raises
    ------
    CacheFolderError
        Names the folder, what is wrong and the remedy (``chmod``, or ``EDGETRAIN_CACHE_DIR``).
    """
    folder = Path(folder)
    missing = []
    parent = folder
    while not os.path.lexists(parent) and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)            # the umask may have taken bits off; the exact mode is meant
        except FileExistsError:
            pass                             # made at the same moment by another process: checked below
        except OSError as e:
            raise CacheFolderError(f"cannot create the kernel cache folder '{path}': {e.strerror or e}; "
                                   "set EDGETRAIN_CACHE_DIR to a folder of yours") from None
    for path in [folder, *missing[1:]]:
        _check_private(path)
    return folder


# what makes a cache folder unsafe: (rule it must pass, what to say when it does not)
_PRIVATE_FOLDER_RULES = (
    (lambda st: stat.S_ISDIR(st.st_mode), lambda st: "is not a folder"),
    (lambda st: st.st_uid == os.geteuid(), lambda st: f"is owned by user id {st.st_uid}, not by you ({os.geteuid()})"),
    (lambda st: not st.st_mode & 0o022,
     lambda st: f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):o})"),
)


def _check_private(folder: Path) -> None:
    try:
        st = os.stat(folder)
    except OSError as e:
        raise CacheFolderError(f"cannot use the kernel cache folder '{folder}': {e.strerror or e}") from None
    for rule, problem in _PRIVATE_FOLDER_RULES:
        if not rule(st):
            raise CacheFolderError(f"kernel cache folder '{folder}' {problem(st)}: edgetrain imports and runs the "
                                   f"code cached there, so only you may write it; run `chmod go-w '{folder}'` if "
                                   "it is yours, or set EDGETRAIN_CACHE_DIR to a private folder")


def num_threads() -> int:
    """Threads for Numba and BLAS: ``EDGETRAIN_NUM_THREADS``, default 1 (threads only hurt on contended cores)."""
    return max(1, int(os.environ.get("EDGETRAIN_NUM_THREADS", "1")))


def spin_us() -> int:
    """Microseconds an intra-op thread busy-waits for its next job before it sleeps: ``EDGETRAIN_SPIN_US``,
    default 300 (0: sleep at once, the hand-off of a process without Numba)."""
    raw = os.environ.get("EDGETRAIN_SPIN_US", "300")
    try:
        return max(0, int(raw))
    except ValueError:
        raise ValueError(f"EDGETRAIN_SPIN_US must be a whole number of microseconds, got {raw!r}") from None


_SEED: list[int | None] = [None]


def set_seed(seed: int | None) -> None:
    """Seed every random op planned from now on (Dropout without its own seed attribute): runs repeat exactly.
    None (the default) draws fresh entropy per op, as onnxruntime does."""
    _SEED[0] = None if seed is None else int(seed)


def op_seed(node_name: str) -> list[int] | None:
    """The seed of a random op's generator: the run's seed and the node's name, so ops draw distinct streams."""
    if _SEED[0] is None:
        return None
    return [_SEED[0], zlib.crc32(node_name.encode())]
