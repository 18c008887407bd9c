"""The warm path: kernels that ``edgetrain warm`` compiled ahead of time for this machine, found in the cache
folder and called without importing Numba (``_jit`` asks ``find()`` once, when the kernels are imported).

A kernel set lives in ``<cache>/aot/<key>/``: the extension module ``_aot_kernels<ext>`` and ``manifest.json``
(kernel id -> exports with their argument keys). ``key()`` hashes what the compiled code depends on: the
sources of the kernels and of what they read at compile time, the Numba, llvmlite and numpy versions, Numba's
environment switches, this CPU (name and features as the OS reports them) and the Python ABI. Any change gives
another folder, so a set compiled before it is never used: the JIT runs until ``edgetrain warm`` runs again.

The manifest is data: the module's path is computed here, never read; the manifest must carry the same key;
each export name must be the one ``export_name`` gives its kernel and signature (a manifest cannot point a
kernel at another's code); and the module holds a digest of (key, kernel table) that must equal the
manifest's. A set failing any check is ignored with the reason logged, and the JIT runs.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from edgetrain import __version__, config

from ._aot import DIGEST_EXPORT, export_name, parse_key

MODULE_NAME = "_aot_kernels"
MANIFEST = "manifest.json"
MAX_MANIFEST_BYTES = 32 << 20


def logger():
    """The ``edgetrain.warm`` logger; ``logging`` (~10 ms to import) is imported only when there is something to
    say, not on every warm start."""
    import logging

    return logging.getLogger("edgetrain.warm")


# what jitted code reads when it compiles: the kernels, the op modules and config they take constants from,
# the generated loops' templates, and the build's per-export options
_SOURCE_ROOTS = (("edgetrain.kernels", "*.py"), ("edgetrain.ops", "*.py"), ("edgetrain.codegen", "*.py"),
                 ("edgetrain.minimal_build", "aot.py"))
_VERSIONED = ("numba", "llvmlite")        # their _version.py, read without importing them
_CPU_FIELDS = ("vendor_id", "cpu family", "model", "model name", "flags", "Features", "CPU implementer",
               "CPU architecture", "CPU variant", "CPU part")
# Numba switches this package sets itself: they do not change compiled code
_NOT_CODEGEN = ("NUMBA_CACHE_DIR", "NUMBA_NUM_THREADS")


def enabled() -> bool:
    """Off with ``EDGETRAIN_NO_AOT=1`` (and under ``NUMBA_DISABLE_JIT``: kernels then run as Python)."""
    return not (config.flag("EDGETRAIN_NO_AOT") or config.flag("NUMBA_DISABLE_JIT"))


def _package_dir(name: str) -> Path:
    return Path(importlib.util.find_spec(name).submodule_search_locations[0])


def _cpu() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        text = ""
    fields = sorted({line.strip() for line in text.splitlines() if line.split(":")[0].strip() in _CPU_FIELDS})
    return "\n".join([platform.machine(), *fields])     # not platform.processor(): it may run `uname -p`


def key() -> str:
    """The kernel set's key for this installation on this machine (32 hex digits)."""
    h = hashlib.sha256(f"edgetrain {__version__}\n".encode())
    for package, pattern in _SOURCE_ROOTS:
        folder = _package_dir(package)
        for path in sorted(folder.glob(pattern)):
            h.update(f"{package}/{path.name}\n".encode() + path.read_bytes())
    import numpy

    h.update(f"numpy {numpy.__version__}\n".encode())
    for name in _VERSIONED:
        spec = importlib.util.find_spec(name)
        version = Path(spec.origin).parent / "_version.py" if spec and spec.origin else None
        h.update(f"{name}\n".encode() + (version.read_bytes() if version and version.exists() else b"missing"))
    switches = sorted((k, v) for k, v in os.environ.items() if k.startswith("NUMBA_") and k not in _NOT_CODEGEN)
    h.update(repr(switches).encode())
    h.update(_cpu().encode())
    h.update(f"{sys.implementation.cache_tag} {sysconfig.get_config_var('EXT_SUFFIX')}\n".encode())
    return h.hexdigest()[:32]


def folder(set_key: str) -> Path:
    return config.cache_folder("aot") / set_key


def module_path(set_key: str) -> Path:
    return folder(set_key) / (MODULE_NAME + sysconfig.get_config_var("EXT_SUFFIX"))


def digest(set_key: str, kernels: dict) -> int:
    """What the module is compiled to return from ``DIGEST_EXPORT``: 60 bits of a hash of key and table."""
    text = json.dumps([set_key, kernels], sort_keys=True, separators=(",", ":"))
    return int(hashlib.sha256(text.encode()).hexdigest()[:15], 16)


def warmed_folders(set_key: str) -> dict[str, list[int]]:
    """Artifact folders the current set for ``set_key`` was built from (those that still exist) with their batch
    sizes, or {} (what ``edgetrain warm`` merges, and the automatic build skips)."""
    try:
        manifest = json.loads((folder(set_key) / MANIFEST).read_text())
        artifacts = manifest["artifacts"] if manifest.get("key") == set_key else {}
        return {str(f): sorted({int(b) for b in sizes}) for f, sizes in artifacts.items() if Path(f).is_dir()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def warmed_feeds(set_key: str) -> dict:
    """The input shapes the current set's folders were run with, where a build knew them (``manifest["feeds"]``:
    folder -> shape sets), unchecked JSON data; {} when there are none."""
    try:
        manifest = json.loads((folder(set_key) / MANIFEST).read_text())
        feeds = manifest.get("feeds", {}) if manifest.get("key") == set_key else {}
        return feeds if isinstance(feeds, dict) else {}
    except (OSError, ValueError, AttributeError):
        return {}


@dataclass
class KernelSet:
    key: str
    kernels: dict          # kernel id -> [[export name, [argument key, ...]], ...]
    module: object         # the extension module
    artifacts: dict        # artifact folder -> batch sizes it was warmed with (what ``edgetrain warm`` merges)


class Refused(Exception):
    """Why a kernel set found in the cache is not used."""


def _check_table(kernels) -> dict:
    if not isinstance(kernels, dict):
        raise Refused("its kernel table is not a mapping")
    for kid, exports in kernels.items():
        if not isinstance(kid, str) or not isinstance(exports, list):
            raise Refused(f"kernel {kid!r} has no list of exports")
        for k, entry in enumerate(exports):
            ok = (isinstance(entry, list) and len(entry) == 2 and isinstance(entry[1], list)
                  and all(isinstance(a, str) for a in entry[1]))
            if not ok:
                raise Refused(f"kernel {kid!r} export {k} is not [name, [argument keys]]")
            try:
                expected = export_name(kid, k)
            except ValueError:
                raise Refused(f"{kid!r} is not a kernel id") from None
            if entry[0] != expected:
                raise Refused(f"kernel {kid!r} signature {k} names export {entry[0]!r}, not {expected!r}")
            for a in entry[1]:
                try:
                    parse_key(a)
                except (ValueError, TypeError):
                    raise Refused(f"kernel {kid!r} has an argument key {a!r} that is not one") from None
    return kernels


def _load(set_key: str) -> KernelSet | None:
    where = folder(set_key)
    manifest_file, so_file = where / MANIFEST, module_path(set_key)
    if not manifest_file.exists():
        return None
    if manifest_file.is_symlink() or manifest_file.stat().st_size > MAX_MANIFEST_BYTES:
        raise Refused(f"{manifest_file} is a symlink or larger than {MAX_MANIFEST_BYTES} bytes")
    try:
        manifest = json.loads(manifest_file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise Refused(f"{manifest_file} is not JSON: {e}") from None
    if not isinstance(manifest, dict) or manifest.get("key") != set_key:
        raise Refused(f"{manifest_file} was written for another key than its folder's ({set_key})")
    kernels = _check_table(manifest.get("kernels"))
    artifacts = manifest.get("artifacts", {})
    if not isinstance(artifacts, dict):
        raise Refused(f"{manifest_file}: 'artifacts' is not a mapping")
    if not so_file.is_file() or so_file.is_symlink():
        raise Refused(f"its module {so_file} is missing or not a regular file")
    spec = importlib.util.spec_from_file_location(f"edgetrain.kernels.{MODULE_NAME}", so_file)
    try:
        module = importlib.util.module_from_spec(spec)
    except ImportError as e:
        raise Refused(f"its module {so_file} does not load: {e}") from None
    stamp = getattr(module, DIGEST_EXPORT, None)
    if stamp is None or stamp() != digest(set_key, kernels):
        raise Refused(f"{manifest_file} does not match the digest compiled into {so_file.name} (edited after "
                      "the build?)")
    return KernelSet(set_key, kernels, module, artifacts)


def find() -> KernelSet | None:
    """The kernel set warmed for this installation and machine, or None (none, switched off, or refused: then
    the reason is logged as a warning)."""
    if not enabled():
        return None
    set_key = key()
    try:
        found = _load(set_key)
    except Refused as e:
        logger().warning("edgetrain: ignoring the warm kernel set in %s: %s; kernels compile with Numba (run "
                    "`edgetrain warm` again to rebuild it)", folder(set_key), e)
        return None
    except OSError as e:
        logger().warning("edgetrain: cannot read the warm kernel set in %s: %s; kernels compile with Numba",
                    folder(set_key), e)
        return None
    if found is not None and config.debug():
        print(f"edgetrain: warm kernels {found.module.__file__} ({len(found.kernels)} kernels)", file=sys.stderr)
    return found
