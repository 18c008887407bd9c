"""Issue 11, item 5: the kernel cache is private and checked, generated code is what edgetrain generated, every
file edgetrain writes goes through the atomic writer (random O_EXCL|O_NOFOLLOW temporary names, fsync), and only
regular files are read as models, checkpoints or data."""
import ast
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from edgetrain import atomic, codegen, compact, config
from edgetrain.api import CheckpointState
from edgetrain.checkpoint.state import CheckpointError
from edgetrain.cli.train import load_arrays
from edgetrain.errors import CacheFolderError, EdgetrainError, InputError, ModelLoadError
from edgetrain.onnx_io import save_model, to_graph

REPO = Path(__file__).resolve().parents[2]
# a kernel as codegen.generate writes them; loading it runs its module code, calling it compiles it
SOURCE = ("import numpy as np\nfrom numba import njit\n\n\n@njit(cache=True, nogil=True)\n"
          "def kernel(a0, o0):\n    n0, = o0.shape\n    for i0 in range(n0):\n        o0[i0] = a0[i0] + {k}\n")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh cache folder (not created yet) under folders that do not exist yet either."""
    folder = tmp_path / "home" / "cache" / "edgetrain"
    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(folder))
    monkeypatch.setattr(codegen, "_LOADED", {})
    return folder


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- the cache folder ---------------------------------------------------------------------------------------------
def test_cache_folders_and_the_parents_edgetrain_creates_are_0700(cache, tmp_path):
    old = os.umask(0)                  # the most permissive umask: the mode must come from edgetrain
    try:
        gen = config.cache_folder("gen")
        numba_folder = config.cache_folder("numba")
    finally:
        os.umask(old)
    assert gen == cache / "gen" and numba_folder == cache / "numba"
    for folder in (tmp_path / "home", tmp_path / "home" / "cache", cache, gen, numba_folder):
        assert _mode(folder) == 0o700, folder


@pytest.mark.parametrize("sub", ["", "gen", "numba"])
@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_a_cache_folder_writable_by_others_is_refused(cache, sub, mode):
    folder = cache / sub if sub else cache
    folder.mkdir(parents=True)
    os.chmod(folder, mode)
    with pytest.raises(CacheFolderError, match="writable by group or others") as e:
        config.cache_folder(sub or "gen")
    message = str(e.value)
    assert f"'{folder}'" in message and "chmod" in message and "EDGETRAIN_CACHE_DIR" in message


def test_a_cache_folder_owned_by_another_user_is_refused(cache, monkeypatch):
    cache.mkdir(parents=True, mode=0o700)
    other = os.stat(cache).st_uid + 1
    monkeypatch.setattr(os, "geteuid", lambda: other)
    with pytest.raises(CacheFolderError, match=f"'{cache}' is owned by user id"):
        config.cache_folder("gen")


def test_a_cache_path_that_is_a_file_is_refused(cache):
    cache.parent.mkdir(parents=True)
    cache.write_text("not a folder")
    with pytest.raises(CacheFolderError, match="is not a folder"):
        config.cache_folder("gen")


def test_a_planted_kernel_in_a_folder_others_can_write_never_runs(cache, tmp_path):
    marker = tmp_path / "ran"
    (cache / "gen").mkdir(parents=True)
    os.chmod(cache, 0o777)
    for k in range(3):       # whatever name the kernel gets: every plausible file is planted
        (cache / "gen" / f"fused_{k}.py").write_text(f"open({str(marker)!r}, 'w')\n")
    with pytest.raises(CacheFolderError):
        codegen.load(SOURCE.format(k=1))
    assert not marker.exists()


def _plant_file(path, payload):
    path.write_text(payload)


def _plant_symlink(path, payload):
    target = path.with_name("elsewhere.py")
    target.write_text(payload)
    path.symlink_to(target)


def _plant_fifo(path, payload):
    os.mkfifo(path)


@pytest.mark.parametrize("plant", [_plant_file, _plant_symlink, _plant_fifo])
def test_a_generated_file_that_differs_from_its_source_is_replaced_not_run(cache, tmp_path, alarm, plant):
    """Defence in depth: even in a private folder, a file with another content at the kernel's name is
    replaced atomically and never imported."""
    source = SOURCE.format(k=2)
    codegen.load(source)
    (path,) = (cache / "gen").glob("fused_*.py")
    path.unlink()
    marker = tmp_path / "ran"
    plant(path, f"open({str(marker)!r}, 'w')\n" + source)
    codegen._LOADED.clear()
    kernel = codegen.load(source)
    assert not marker.exists()
    assert path.is_file() and not path.is_symlink() and path.read_text() == source
    out = np.empty(3)
    kernel(np.arange(3.0), out)
    np.testing.assert_array_equal(out, np.arange(3.0) + 2)


def test_an_unchanged_generated_file_is_not_rewritten(cache):
    """Numba's disk cache is keyed on the file's modification time: a correct file must stay as it is."""
    source = SOURCE.format(k=3)
    codegen.load(source)
    (path,) = (cache / "gen").glob("fused_*.py")
    os.utime(path, ns=(1, 1))
    codegen._LOADED.clear()
    codegen.load(source)
    assert os.stat(path).st_mtime_ns == 1


@pytest.mark.native
def test_numba_cache_folder_writable_by_others_is_refused_before_numba_uses_it(tmp_path):
    folder = tmp_path / "numba"
    folder.mkdir()
    os.chmod(folder, 0o777)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(folder), EDGETRAIN_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.run([sys.executable, "-c", "import edgetrain.kernels._jit"], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode != 0
    assert f"CacheFolderError: kernel cache folder '{folder}' is writable by group or others" in proc.stderr


# -- the atomic writer and its temporary names -------------------------------------------------------------------
def test_codegen_temporary_file_does_not_follow_a_symlink_at_the_old_predictable_name(cache, tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    source = SOURCE.format(k=4)
    codegen.load(source)                        # learn the kernel's file name, then start over without the file
    (path,) = (cache / "gen").glob("fused_*.py")
    path.unlink()
    codegen._LOADED.clear()
    (path.parent / f".{path.stem}.{os.getpid()}.tmp").symlink_to(victim)    # what codegen used to write to
    codegen.load(source)
    assert victim.read_text() == "precious"
    assert path.read_text() == source


def test_save_model_does_not_follow_a_symlink_at_the_old_predictable_name(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (tmp_path / f".model.onnx.{os.getpid()}.tmp").symlink_to(victim)
    model = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], []))
    save_model(model, tmp_path / "model.onnx")
    assert victim.read_text() == "precious"
    assert (tmp_path / "model.onnx").read_bytes() == model.SerializeToString()


@pytest.mark.parametrize("planted", ["symlink", "file"])
def test_write_atomic_refuses_a_planted_temporary_name(tmp_path, monkeypatch, planted):
    """Names are random; if one is guessed anyway, O_CREAT|O_EXCL|O_NOFOLLOW fails instead of writing through."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    monkeypatch.setattr(atomic, "token_hex", lambda n: "guessed")
    tmp = tmp_path / f".out.{os.getpid()}.guessed.tmp"
    tmp.symlink_to(victim) if planted == "symlink" else tmp.write_text("planted")
    with pytest.raises(FileExistsError):
        atomic.write_atomic(tmp_path / "out", b"new")
    assert victim.read_text() == "precious" and not (tmp_path / "out").exists()


def test_write_atomic_uses_random_names_and_fsyncs_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_open, real_fsync, real_replace = os.open, os.fsync, os.replace
    monkeypatch.setattr(os, "open", lambda p, flags, *a: events.append(("open", p, flags)) or real_open(p, flags, *a))
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync",)) or real_fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b: events.append(("replace", a, b)) or real_replace(a, b))
    atomic.write_atomic(tmp_path / "a", b"1")
    atomic.write_atomic(tmp_path / "a", b"2")
    opens = [e for e in events if e[0] == "open" and e[1].endswith(".tmp")]
    assert len(opens) == 2 and opens[0][1] != opens[1][1]
    for _, _, flags in opens:
        want = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_WRONLY
        assert flags & want == want
    kinds = [e[0] for e in events]
    assert kinds.index("fsync") < kinds.index("replace")
    assert (tmp_path / "a").read_bytes() == b"2"


def _write_outside_atomic(node: ast.Call, filename: str, source: str) -> str | None:
    """What ``node`` (in ``source``) writes to a file without ``edgetrain.atomic`` (None: nothing)."""
    fn = node.func
    name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
    owner = getattr(fn.value, "id", "") if isinstance(fn, ast.Attribute) else ""
    modes = [a.value for a in node.args[1:2] + [k.value for k in node.keywords if k.arg == "mode"]
             if isinstance(a, ast.Constant) and isinstance(a.value, str)]
    mode = modes[0] if modes else "r"
    to = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
    in_memory = bool(node.args) and f"{ast.unparse(node.args[0])} = io.BytesIO()" in source
    rules = (
        (name == "open" and owner != "os" and set(mode) & set("wax+"), f"open(..., {mode!r})"),
        (name == "ZipFile" and set(mode) & set("wax") and not in_memory, f"ZipFile(..., {mode!r})"),
        (owner == "json" and name == "dump" and "stdout" not in to, "json.dump to a file"),
        (name in ("write_bytes", "write_text", "tofile") and owner != "atomic", f"{name}()"),
        (owner == "shutil" and name in ("copy", "copy2", "copyfile", "copytree", "move"), f"shutil.{name}()"),
        (owner in ("np", "numpy", "onnx") and name in ("save", "savez", "savez_compressed", "save_model"),
         f"{owner}.{name}()"),
        (owner == "os" and name == "open" and "O_CREAT" in ast.unparse(node) and filename != "atomic.py",
         "os.open(O_CREAT)"),
    )
    return next((f"{filename}:{node.lineno} {label}" for hit, label in rules if hit), None)


def _writes_outside_atomic(path: Path) -> list[str]:
    source = path.read_text()
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    return [w for w in (_write_outside_atomic(c, path.name, source) for c in calls) if w]


def test_every_file_write_in_the_package_goes_through_the_atomic_writer():
    sources = [p for folder in ("edgetrain", "kernels", "minimal_build") for p in (REPO / folder).rglob("*.py")]
    assert len(sources) > 50
    found = [w for p in sources for w in _writes_outside_atomic(p)]
    assert found == []


def test_the_survey_finds_direct_writes(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import json, numpy as np, os, shutil\nopen(p, 'w')\np.write_text('x')\nshutil.copy2(a, b)\n"
                     "np.savez(p, x=1)\njson.dump({}, f)\nos.open(p, os.O_WRONLY | os.O_CREAT)\nopen(p, 'rb')\n"
                     "zipfile.ZipFile(p, 'w')\nb = io.BytesIO()\nzipfile.ZipFile(b, 'w')\n")
    assert len(_writes_outside_atomic(probe)) == 7


def test_generated_artifacts_export_and_compact_models_are_written_atomically(shared, tmp_path, monkeypatch):
    from edgetrain import artifacts
    from edgetrain.api import Module

    written = []
    real = atomic.write_atomic
    monkeypatch.setattr(atomic, "write_atomic", lambda p, d, *a: written.append(Path(p).name) or real(p, d, *a))
    artifacts.generate_artifacts(str(shared / "models" / "mlp.onnx"), requires_grad=["fc1.weight"],
                                 loss=artifacts.LossType.CrossEntropyLoss, optimizer=artifacts.OptimType.AdamW,
                                 artifact_directory=tmp_path)
    assert sorted(written) == ["checkpoint", "eval_model.onnx", "optimizer_model.onnx", "training_model.onnx"]
    compact.save(to_graph(str(tmp_path / "eval_model.onnx")), tmp_path / "eval_model.etm")
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    Module(tmp_path / "training_model.onnx", state, tmp_path / "eval_model.onnx").export_model_for_inferencing(
        tmp_path / "inference.onnx", [to_graph(str(tmp_path / "eval_model.onnx")).outputs[0].name])
    assert written[-2:] == ["eval_model.etm", "inference.onnx"]


# -- only regular files are read ----------------------------------------------------------------------------------
def _checkpoint(p):
    CheckpointState.load_checkpoint(p)


def _onnx_model(p):
    to_graph(str(p))


def _etm_model(p):
    compact.load(p)


def _any_model(p):
    compact.load_graph(p)


def _npz_data(p):
    load_arrays(p, ["input"])


def _profile_data(p):
    from edgetrain.profiling import _load_data
    _load_data(str(p))


READERS = [("checkpoint", _checkpoint, CheckpointError), ("model.onnx", _onnx_model, ModelLoadError),
           ("model.etm", _etm_model, ModelLoadError), ("model.onnx", _any_model, ModelLoadError),
           ("data.npz", _npz_data, InputError), ("data.npz", _profile_data, InputError)]


@pytest.fixture
def alarm():
    """A reader that blocks (a FIFO with no writer) fails the test after 10 s instead of hanging it."""
    def expire(*_):
        raise TimeoutError("the reader blocked on a file that is not a regular file")
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.mark.parametrize("name, read, error", READERS, ids=[r[1].__name__ for r in READERS])
def test_a_fifo_is_refused_not_waited_on(tmp_path, alarm, name, read, error):
    path = tmp_path / name
    os.mkfifo(path)
    with pytest.raises(error, match="not a regular file \\(a FIFO\\)") as e:
        read(path)
    assert str(path) in str(e.value)
    assert isinstance(e.value, EdgetrainError)


@pytest.mark.parametrize("name, read, error", READERS, ids=[r[1].__name__ for r in READERS])
def test_a_directory_or_device_is_refused(tmp_path, alarm, name, read, error):
    if name == "checkpoint":
        (tmp_path / "dev").symlink_to("/dev/zero")
        path, kind = tmp_path / "dev", "a character device"
    else:
        path, kind = tmp_path / name, "a directory"
        path.mkdir()
    with pytest.raises(error, match=f"not a regular file \\({kind}\\)"):
        read(path)


def test_a_symlink_to_a_regular_checkpoint_still_loads(shared, tmp_path):
    (tmp_path / "checkpoint").symlink_to(shared / "ort_artifacts" / "mlp" / "checkpoint")
    state = CheckpointState.load_checkpoint(tmp_path / "checkpoint")
    assert len(list(state.parameters)) > 0


def test_a_claim_is_won_once_and_never_follows_a_planted_symlink(tmp_path):
    """The compile helper's claims (``atomic.claim``): one winner per name; a symlink at the name is taken, and
    the file it points at is not created."""
    assert atomic.claim(tmp_path / "0") and not atomic.claim(tmp_path / "0")
    assert stat.S_IMODE(os.stat(tmp_path / "0").st_mode) == 0o600
    os.symlink(tmp_path / "elsewhere", tmp_path / "1")
    assert not atomic.claim(tmp_path / "1") and not (tmp_path / "elsewhere").exists()
