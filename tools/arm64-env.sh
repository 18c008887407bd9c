#!/usr/bin/env bash
# Build an emulated 64-bit ARM test environment: Debian bookworm's arm64 python3.11 (the Python of
# Raspberry Pi OS bookworm) with aarch64 wheels of edgetrain's dependencies and of edgetrain itself,
# run under qemu user-mode emulation. No chroot, debootstrap or binfmt_misc; the host's dpkg is untouched.
#
# usage: tools/arm64-env.sh [ENV_DIR]          (default: .arm64 at the top of the repository)
#   ENV_DIR/root     the unpacked arm64 root (rebuilt on every call, ~12 s)
#   ENV_DIR/kernels  edgetrain's kernel cache for emulated runs (kept; tools/run-arm64.sh points
#                    EDGETRAIN_CACHE_DIR at it, so aarch64 kernels never mix with the host's)
# then: tools/run-arm64.sh [ENV_DIR] python -m pytest ...
#
# env (all optional):
#   ARM64_CACHE        downloads reused between runs (apt lists, .debs, wheels)
#                      default: ${XDG_CACHE_HOME:-$HOME/.cache}/edgetrain-arm64
#   ARM64_CONSTRAINTS  a pip constraints file (e.g. the native venv's `pip freeze`) so both stages
#                      test the same versions; default: the newest aarch64 wheels pyproject.toml allows
#   ARM64_EXCLUDE      requirements left out (default "torch matplotlib onnxscript flwr scikit-learn": PyPI's
#                      aarch64 torch is a 430 MB CUDA build; matplotlib serves only `edgetrain train`'s curves,
#                      onnxscript only torch's dynamo exporter, flwr only the federated tests (processes:
#                      native) and scikit-learn only the estimators' oracle (with scipy: ~100 MB), all tested
#                      natively);
#                      each becomes a placeholder module, so tests that use it as an oracle skip, saying why
#   ARM64_SOURCES      an apt sources file to use instead of the host's (needed on a non-bookworm host)
#   ARM64_DEBS         extra arm64 Debian packages to unpack into the root
#   HOST_PYTHON        host CPython 3.11 with pip >= 22 (default: python3); downloads and installs the
#                      wheels and byte-compiles natively (same .pyc magic as Debian's 3.11)
# Host needs: qemu-user-static (installed with apt-get when missing; root or sudo), apt-get, dpkg-deb.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
ENV_DIR=${1:-$REPO/.arm64}
CACHE=${ARM64_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/edgetrain-arm64}
HOST_PYTHON=${HOST_PYTHON:-python3}
EXCLUDE=${ARM64_EXCLUDE-torch matplotlib onnxscript flwr scikit-learn}
DEBS="python3.11 libstdc++6 libgcc-s1 libgomp1 ${ARM64_DEBS:-}"
PYVER=3.11

t0=$EPOCHREALTIME
stamp() { awk -v a="$t0" -v b="$EPOCHREALTIME" -v s="$1" 'BEGIN{printf "[arm64-env] %-36s %6.1fs\n", s, b-a}'; }

mkdir -p "$ENV_DIR" "$CACHE"
ENV_DIR=$(cd "$ENV_DIR" && pwd)
CACHE=$(cd "$CACHE" && pwd)
ROOT=$ENV_DIR/root

# 0. host tool: qemu-user-static (~15 s on a new machine) -------------------------------------------
if ! command -v qemu-aarch64-static >/dev/null; then
  SUDO=; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q >/dev/null
  $SUDO apt-get install -y -q --no-install-recommends qemu-user-static >/dev/null
fi
stamp "host tools ($(qemu-aarch64-static --version | head -1 | awk '{print $3}'))"

# 1. arm64 .debs through a private apt state in the cache (no dpkg --add-architecture) ----------------
A=$CACHE/apt
mkdir -p "$A/lists/partial" "$A/archives/partial" "$A/prefs.d"
: > "$A/status"                     # an empty system: apt resolves the whole dependency closure
cat > "$A/apt.conf" <<CONF
APT::Architecture "arm64";
APT::Architectures { "arm64"; };
APT::Install-Recommends "false";
Dir::State "$A";
Dir::State::Lists "$A/lists";
Dir::State::status "$A/status";
Dir::Cache "$A";
Dir::Cache::archives "$A/archives";
Dir::Etc::Preferences "$A/prefs";
Dir::Etc::PreferencesParts "$A/prefs.d";
Debug::NoLocking "true";
APT::Sandbox::User "root";
CONF
if [ -n "${ARM64_SOURCES:-}" ]; then           # otherwise the host's own Debian sources are reused
  mkdir -p "$A/none.d"
  printf 'Dir::Etc::SourceList "%s";\nDir::Etc::SourceParts "%s";\n' \
    "$(cd "$(dirname "$ARM64_SOURCES")" && pwd)/$(basename "$ARM64_SOURCES")" "$A/none.d" >> "$A/apt.conf"
fi
export APT_CONFIG=$A/apt.conf
apt-get -q update >/dev/null
# shellcheck disable=SC2086
apt-get -q -y install --download-only $DEBS >/dev/null
apt-get -q autoclean >/dev/null 2>&1 || true   # drop superseded .debs
stamp "arm64 debs downloaded"

# 2. unpack: no maintainer scripts run, none are needed for python --------------------------------------
rm -rf "$ROOT"; mkdir -p "$ROOT"
# shellcheck disable=SC2086
apt-get -q -y -s install $DEBS \
  | sed -n 's/^Inst \([^ ]*\) (\([^ ]*\) .*\[\([a-z0-9]*\)\]).*$/\1_\2_\3.deb/p' \
  | sed 's/:/%3a/' | sed "s|^|$A/archives/|" > "$ENV_DIR/debs.txt"
unset APT_CONFIG
[ -s "$ENV_DIR/debs.txt" ] || { echo "[arm64-env] apt resolved no packages" >&2; exit 1; }
while read -r d; do dpkg-deb -x "$d" "$ROOT"; done < "$ENV_DIR/debs.txt"
ln -sf python$PYVER "$ROOT/usr/bin/python3"
stamp "root unpacked ($(wc -l < "$ENV_DIR/debs.txt") debs)"

# 3. requirements from pyproject.toml: dependencies + the test extra, less ARM64_EXCLUDE -----------------
"$HOST_PYTHON" - "$REPO/pyproject.toml" "$EXCLUDE" > "$ENV_DIR/requirements.txt" <<'PY'
import re, sys, tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
excluded = set(sys.argv[2].lower().split())
for req in project["dependencies"] + project.get("optional-dependencies", {}).get("test", []):
    if re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower() not in excluded:
        print(req)
PY
CONSTRAINTS=()
if [ -n "${ARM64_CONSTRAINTS:-}" ]; then
  # local versions (torch==2.13.0+cpu) have no aarch64 twin; editable lines are not constraints
  grep -v -e '+' -e '^-e ' -e '^#' -e ' @ ' "$ARM64_CONSTRAINTS" > "$ENV_DIR/constraints.txt" || true
  CONSTRAINTS=(-c "$ENV_DIR/constraints.txt")
fi

# 4. aarch64 wheels, downloaded and installed by the host's pip --------------------------------------------
# pip matches platform tags literally: protobuf's aarch64 wheel is tagged only manylinux2014_aarch64.
SITE=$ROOT/usr/lib/python3/dist-packages      # on sys.path of Debian's python3.11
mkdir -p "$SITE" "$CACHE/wheels"
PIP=("$HOST_PYTHON" -m pip --disable-pip-version-check -q)
PLAT=(--platform manylinux_2_28_aarch64 --platform manylinux_2_27_aarch64
      --platform manylinux_2_26_aarch64 --platform manylinux_2_17_aarch64
      --platform manylinux2014_aarch64 --only-binary=:all:
      --python-version $PYVER --implementation cp --abi cp311)
"${PIP[@]}" download --dest "$CACHE/wheels" "${PLAT[@]}" "${CONSTRAINTS[@]}" -r "$ENV_DIR/requirements.txt" 2>&1 \
  | { grep -v "is ignored: it is neither a file nor a directory" || true; }
stamp "wheels downloaded"
# edgetrain itself: a pure-Python wheel of this checkout (as a Pi user installs it), built from a copy of the
# files git does not ignore, so no build/ lands in the checkout and no stale build/lib reaches the wheel
rm -rf "$ENV_DIR/dist" "$ENV_DIR/src"; mkdir -p "$ENV_DIR/src"
if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
  (cd "$REPO" && git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$ENV_DIR/src" 2>/dev/null) || true
else
  cp -r "$REPO"/. "$ENV_DIR/src"
fi
"${PIP[@]}" wheel --no-deps --wheel-dir "$ENV_DIR/dist" "$ENV_DIR/src" >/dev/null 2>&1 \
  || "${PIP[@]}" wheel --no-deps --wheel-dir "$ENV_DIR/dist" "$ENV_DIR/src"
# every module of the source tree must be in the wheel (pyproject.toml lists packages by hand; an
# editable install hides a missing one, a Pi user's `pip install` does not)
"$HOST_PYTHON" - "$REPO" "$ENV_DIR"/dist/edgetrain-*.whl <<'PY'
import pathlib, sys, zipfile
repo = pathlib.Path(sys.argv[1])
have = set(zipfile.ZipFile(sys.argv[2]).namelist())
missing = sorted(p.relative_to(repo).as_posix() for p in (repo / "edgetrain").rglob("*.py")
                 if "__pycache__" not in p.parts and p.relative_to(repo).as_posix() not in have)
if missing:
    sys.exit(f"[arm64-env] the edgetrain wheel lacks {len(missing)} source module(s), e.g. {missing[:3]}: "
             "add their packages to [tool.setuptools] packages in pyproject.toml")
PY
"${PIP[@]}" install --no-warn-script-location --root-user-action=ignore --no-index \
  --find-links "$CACHE/wheels" --target "$SITE" --no-compile "${PLAT[@]}" "${CONSTRAINTS[@]}" \
  -r "$ENV_DIR/requirements.txt" "$ENV_DIR"/dist/edgetrain-*.whl
# each excluded requirement becomes a placeholder module, so test modules that import it at the top still
# collect; any use skips (the test, or the module if used at import time) saying why
for name in $EXCLUDE; do
  mkdir -p "$SITE/$name"
  cat > "$SITE/$name/__init__.py" <<STUB
"""Placeholder for '$name', which tools/arm64-env.sh leaves out of the emulated arm64 environment
(ARM64_EXCLUDE). Importing works (also submodules); using anything skips the test that uses it."""
import importlib.abc, importlib.machinery, sys, types

REASON = "'$name' is not installed in the emulated arm64 environment (ARM64_EXCLUDE in tools/arm64-env.sh)"


class _Missing(types.ModuleType):
    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        import pytest
        pytest.skip(REASON, allow_module_level=True)


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("$name."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec):
        return _Missing(spec.name)

    def exec_module(self, module):
        module.__path__ = []


sys.meta_path.insert(0, _Finder())
sys.modules[__name__].__class__ = _Missing
STUB
done
stamp "wheels installed"

# 5. byte-compile natively: Debian's debs ship no .pyc, and compiling them emulated costs ~9 s per run ----
if "$HOST_PYTHON" -c "import sys; sys.exit(sys.version_info[:2] != (3, 11))"; then
  "$HOST_PYTHON" -m compileall -q -j0 "$ROOT/usr/lib/python$PYVER" "$SITE" >/dev/null 2>&1 || true
else
  echo "[arm64-env] $HOST_PYTHON is not 3.11: byte-compiling under emulation (slow)" >&2
  QEMU_LD_PREFIX=$ROOT qemu-aarch64-static "$ROOT/usr/bin/python$PYVER" -m compileall -q \
    "$ROOT/usr/lib/python$PYVER" "$SITE" >/dev/null 2>&1 || true
fi
stamp "byte-compiled"

# 6. smoke test under emulation, with the CPU model tools/run-arm64.sh emulates
"$REPO/tools/run-arm64.sh" "$ENV_DIR" python -c "
import platform, sys, llvmlite.binding as ll, numba, numpy, onnx, onnxruntime, edgetrain
assert platform.machine() == 'aarch64', platform.machine()
assert ll.get_host_cpu_name() != 'generic', 'LLVM sees no ARM core: /proc/cpuinfo is the host one'
print('[arm64-env] ok:', platform.machine(), ll.get_host_cpu_name(), 'python', sys.version.split()[0],
      'numba', numba.__version__, 'numpy', numpy.__version__, 'onnx', onnx.__version__,
      'onnxruntime', onnxruntime.__version__, 'edgetrain', edgetrain.__version__, 'at', edgetrain.__file__)"
stamp "done"
