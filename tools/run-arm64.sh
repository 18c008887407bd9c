#!/usr/bin/env bash
# Run a program inside the environment built by tools/arm64-env.sh, under qemu user-mode emulation
# of a Raspberry Pi 4 core (no chroot, no binfmt_misc).
#
# usage: tools/run-arm64.sh [ENV_DIR] PROGRAM [ARGS...]     (ENV_DIR default: .arm64 in the repository)
#   PROGRAM  python | python3 | python3.11  -> Debian bookworm's arm64 python3.11
#            /abs/path or name               -> an aarch64 binary inside ENV_DIR/root
# examples:
#   tools/run-arm64.sh python -m pytest -q -m "arm64 and not native and not ort119" -k "not bench_shape"
#   tools/run-arm64.sh .arm64 python -c "import edgetrain; print(edgetrain.__file__)"
#
# What it sets:
#   QEMU_CPU=cortex-a72      the emulated core: Raspberry Pi 4 (BCM2711). QEMU_CPU=cortex-a76 emulates
#                            a Pi 5 (BCM2712); no other value is accepted.
#   ENV_DIR/root/proc/cpuinfo  that board's /proc/cpuinfo (MIDR and Features lines), which qemu -L shows
#                            the program in place of the host's x86 one. Without it LLVM names the host
#                            CPU "generic" (Numba would compile for baseline armv8, not the Pi's core), and
#                            `import onnxruntime` segfaults: its cpuinfo library finds no ARM core in
#                            the x86 /proc/cpuinfo. With it Numba compiles for cortex-a72 with the Pi 4's
#                            features (+neon +crc, no aes/sha2), exactly as on the board.
#   EDGETRAIN_CACHE_DIR      ENV_DIR/kernels: aarch64 kernels never share the host's cache
#                            (override with ARM64_KERNEL_CACHE).
#   PYTHONSAFEPATH=1         `python -m pytest` in the checkout imports the installed edgetrain (the
#                            aarch64 environment's copy), not the source tree (whose kernels/ sits outside
#                            the package).
#   QEMU_LD_PREFIX           the env form of qemu's -L: absolute paths that exist inside ENV_DIR/root
#                            (libraries, /usr/lib/python3.11) resolve there; the checkout, /tmp and /proc
#                            stay the host's, so os.cpu_count() and psutil report the host.
# Pitfall: a child process that execs sys.executable (subprocess, multiprocessing "spawn") fails with
# "Exec format error" unless binfmt_misc has an aarch64 handler: such tests carry the `native` marker.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
ENV_DIR=$REPO/.arm64
if [ $# -gt 0 ] && [ -d "$1/root" ]; then ENV_DIR=$1; shift; fi
PROG=${1:?usage: run-arm64.sh [ENV_DIR] PROGRAM [ARGS...]}; shift
[ -d "$ENV_DIR/root" ] || { echo "run-arm64.sh: no environment at $ENV_DIR: run tools/arm64-env.sh first" >&2; exit 2; }
ENV_DIR=$(cd "$ENV_DIR" && pwd)
ROOT=$ENV_DIR/root
case "$PROG" in
  python|python3|python3.11) PROG=$ROOT/usr/bin/python3.11 ;;
  /*) PROG=$ROOT$PROG ;;
  *) for d in usr/bin bin usr/sbin sbin; do
       if [ -x "$ROOT/$d/$PROG" ]; then PROG=$ROOT/$d/$PROG; break; fi
     done ;;
esac
[ -x "$PROG" ] || { echo "run-arm64.sh: no such aarch64 program: $PROG" >&2; exit 127; }

export QEMU_LD_PREFIX=$ROOT
export QEMU_CPU=${QEMU_CPU:-cortex-a72}
case "$QEMU_CPU" in    # variant part revision features model, as the boards' kernels print them
  cortex-a72) cpu=(0x0 0xd08 3 "fp asimd evtstrm crc32 cpuid" "Raspberry Pi 4 Model B Rev 1.5") ;;
  cortex-a76) cpu=(0x4 0xd0b 1 "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp"
                   "Raspberry Pi 5 Model B Rev 1.0") ;;
  *) echo "run-arm64.sh: QEMU_CPU=$QEMU_CPU: use cortex-a72 (Pi 4) or cortex-a76 (Pi 5)" >&2; exit 2 ;;
esac
mkdir -p "$ROOT/proc"
{
  for ((i = 0; i < $(getconf _NPROCESSORS_CONF); i++)); do   # as many as the host's /sys lists
    printf 'processor\t: %d\nBogoMIPS\t: 108.00\nFeatures\t: %s\nCPU implementer\t: 0x41\n' "$i" "${cpu[3]}"
    printf 'CPU architecture: 8\nCPU variant\t: %s\nCPU part\t: %s\nCPU revision\t: %s\n\n' "${cpu[0]}" "${cpu[1]}" "${cpu[2]}"
  done
  printf 'Model\t\t: %s\n' "${cpu[4]}"
} > "$ROOT/proc/cpuinfo.$$" && mv -f "$ROOT/proc/cpuinfo.$$" "$ROOT/proc/cpuinfo"
export EDGETRAIN_CACHE_DIR=${ARM64_KERNEL_CACHE:-$ENV_DIR/kernels}
export PYTHONSAFEPATH=1
unset NUMBA_CACHE_DIR PYTHONHOME        # the host's would mix x86-64 and aarch64 objects
exec qemu-aarch64-static "$PROG" "$@"
