"""Mutation testing over a curated list: each mutant is one small, plausible bug in the kernels, gradient rules,
planner, optimizers, training API or checkpoint code; the tests that guard that code must fail on it.

    python tools/mutation.py            # run every mutant, print each result and the score (several minutes)
    python tools/mutation.py --check    # only check that every original snippet is still in its file, once
    python tools/mutation.py ID...      # run the named mutants

For each mutant the file's snippet is replaced, the mutant's test selection runs (pytest -x, stop at the first
failure), and the file is restored byte for byte, also on Ctrl-C. Killed: the selection failed; survived: it
passed. A snippet no longer found (the code changed) is reported as stale, not scored: update the list.
Run it before closing an issue that touches these parts (README, "Mutation testing"); not in CI (slow).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutant:
    id: str
    path: str          # relative to the repository
    original: str      # must occur exactly once in the file
    mutated: str
    tests: tuple[str, ...]
    why: str


OPS_TRAINING = "tests/ops/test_training.py"
PLANNER = ("tests/test_planner.py", "tests/test_planner_switches.py")

MUTANTS = [
    # --- kernels -----------------------------------------------------------------------------------------------
    Mutant("sce-no-max", "kernels/softmax.py",
           "                m = np.float64(x[i, 0, j])\n"
           "                for k in range(1, c):\n                    if x[i, k, j] > m:\n"
           "                        m = np.float64(x[i, k, j])\n",
           "                m = np.float64(0.0)\n", ("tests/ops/test_softmax.py",), "log-sum-exp without max subtraction"),
    Mutant("sce-grad-sign", "kernels/softmax.py", "(p - (1.0 if k == lab else 0.0)) * scale",
           "(p + (1.0 if k == lab else 0.0)) * scale", ("tests/test_onnxblock.py",),
           "softmax cross-entropy gradient: p + onehot"),
    Mutant("sce-mean-by-count", "kernels/softmax.py",
           "loss[0] = np.divide(total, wsum)", "loss[0] = np.divide(total, n * d)",
           ("tests/ops/test_softmax.py",), "weighted mean divided by the sample count"),
    Mutant("relu-grad-ge", "kernels/elementwise.py", "f\"({a[0]} if {a[1]} > 0 else {k.T}(0))\"",
           "f\"({a[0]} if {a[1]} >= 0 else {k.T}(0))\"", ("tests/ops/test_elementwise.py",),
           "ReluGrad passes the gradient at y == 0"),
    Mutant("bn-dbias-sign", "kernels/normalization.py", "            dbias[ch] = s_dy",
           "            dbias[ch] = -s_dy", ("tests/ops/test_normalization.py",), "BatchNorm dB negated"),
    Mutant("conv-grad-batch-layout", "kernels/conv.py", "dy.reshape(y3).swapaxes(0, 1))]", "dy.reshape(m, n, ohw))]",
           ("tests/ops/test_conv.py::test_conv_grad_kernel_matches_torch",),
           "ConvGrad's batch-wide dY reshaped instead of its batch axis moved next to the pixels"),
    Mutant("pow-square-as-double", "edgetrain/plan/lower.py", 'e.emit(node, "Mul", [x, x], [y]',
           'e.emit(node, "Add", [x, x], [y]', ("tests/test_lower.py",), "Pow(X, 2) lowered to X + X"),
    Mutant("accumulate-overwrites", "kernels/training.py", "            np.add(buffer, value, out=buffer)",
           "            np.copyto(buffer, value)", (OPS_TRAINING,), "InPlaceAccumulatorV2 add path overwrites"),
    # --- optimizers --------------------------------------------------------------------------------------------
    Mutant("adamw-hf-decay-before", "kernels/training.py", "            p[i] = w - lr_wd * w",
           "            p[i] = w - lr_wd * p[i]", (OPS_TRAINING,), "HF AdamW decays the old weight"),
    Mutant("adamw-no-correction", "kernels/training.py", "    if correct_bias:\n        s[1] = math.pow(",
           "    if False:\n        s[1] = math.pow(", (OPS_TRAINING,), "bias correction never applied"),
    Mutant("adamw-eps-inside-sqrt", "kernels/training.py",
           "            w = p[i] - np.divide(lr_corr * mi, np.sqrt(vi) + eps)",
           "            w = p[i] - np.divide(lr_corr * mi, np.sqrt(vi + eps))", (OPS_TRAINING,),
           "epsilon inside the square root"),
    Mutant("sgd-nesterov-plain", "kernels/training.py", "            w = w - lr * (gi + mom * vi)",
           "            w = w - lr * vi", (OPS_TRAINING,), "Nesterov step taken as plain momentum"),
    Mutant("sgd-no-weight-decay", "kernels/training.py", "        gi = g[i] + wd * w", "        gi = g[i]",
           (OPS_TRAINING,), "SGD weight decay dropped"),
    Mutant("clip-eps-missing", "kernels/training.py", "    s[1] = s[0] + c[1]\n", "    s[1] = s[0]\n",
           (OPS_TRAINING,), "clip coefficient without ORT's 1e-6"),
    Mutant("onnxblock-sgd-nesterov", "edgetrain/onnxblock/optim.py", "\"nesterov\": int(self._nesterov)",
           "\"nesterov\": 0", (OPS_TRAINING,), "onnxblock.optim.SGD drops nesterov"),
    Mutant("onnxblock-adamw-correct-bias", "edgetrain/onnxblock/optim.py",
           "\"correct_bias\": int(bool(bias_correction))", "\"correct_bias\": 1", (OPS_TRAINING,),
           "onnxblock.optim.AdamW ignores bias_correction"),
    Mutant("lr-schedule-warmup", "edgetrain/api.py", "            factor = step / max(1, self._warmup)",
           "            factor = (step + 1) / max(1, self._warmup)", ("tests/test_api.py",),
           "linear warm-up one step ahead"),
    # --- gradient rules ----------------------------------------------------------------------------------------
    Mutant("gemm-bias-grad-sign", "edgetrain/ops/matmul.py", "dx[2] = dc if beta == 1.0 else",
           "dx[2] = g.emit(\"Neg\", [dc]) if beta == 1.0 else", ("tests/test_autodiff.py",), "Gemm dC negated"),
    Mutant("gemm-alpha-ignored", "edgetrain/ops/matmul.py",
           "dx[0] = (g.emit(\"Gemm\", [dy, b], {\"transA\": 0, \"transB\": 1 - tb, \"alpha\": alpha, \"beta\": 0.0})",
           "dx[0] = (g.emit(\"Gemm\", [dy, b], {\"transA\": 0, \"transB\": 1 - tb, \"alpha\": 1.0, \"beta\": 0.0})",
           ("tests/test_autodiff.py",), "Gemm dA ignores alpha"),
    Mutant("sub-grad-sign", "edgetrain/ops/elementwise.py",
           "return _per_input(g, [lambda: dys[0], lambda: g.emit(\"Neg\", [dys[0]])])",
           "return _per_input(g, [lambda: dys[0], lambda: dys[0]])", ("tests/test_autodiff.py",),
           "Sub's second input gets +dY"),
    Mutant("cos-grad-sign", "edgetrain/ops/elementwise.py",
           "(\"\", \"Cos\"): _unary(lambda g, dy: g.emit(\"Neg\", "
           "[g.emit(\"Mul\", [dy, g.emit(\"Sin\", [g.x(0)])])])),",
           "(\"\", \"Cos\"): _unary(lambda g, dy: g.emit(\"Mul\", [dy, g.emit(\"Sin\", [g.x(0)])])),",
           ("tests/test_autodiff.py",), "d cos = +sin"),
    # --- planner -----------------------------------------------------------------------------------------------
    Mutant("overlap-strict", "edgetrain/plan/memory.py",
           "return self.start <= other.end and other.start <= self.end",
           "return self.start < other.end and other.start < self.end", PLANNER, "touching lifetimes share bytes"),
    Mutant("last-use-early", "edgetrain/plan/memory.py", "                last_use[i] = s\n",
           "                last_use[i] = max(s - 1, 0)\n", PLANNER, "liveness ends one step early"),
    Mutant("in-place-too-early", "edgetrain/plan/memory.py", "and buf.nbytes == t.nbytes and buf.end <= s):",
           "and buf.nbytes == t.nbytes and buf.end <= s + 1):", PLANNER,
           "in-place over an input still read by the next step"),
    Mutant("best-fit-short-gap", "edgetrain/plan/memory.py", "            if gap >= size and",
           "            if gap >= size - 64 and", PLANNER, "a gap one alignment unit too small"),
    Mutant("fusion-drops-graph-output", "edgetrain/plan/fusion.py",
           "if o and (o in graph_outputs or readers.get(o, 0) > inside_reads.get(o, 0))]",
           "if o and readers.get(o, 0) > inside_reads.get(o, 0)]", PLANNER,
           "a fused group does not write graph outputs read only inside it"),
    # --- training API ------------------------------------------------------------------------------------------
    Mutant("module-add-back-dropped", "edgetrain/runtime/state.py",
           "            np.add(spare, self.grads, out=spare)",
           "            pass", ("tests/test_api.py",), "accumulating step keeps only the last gradient"),
    Mutant("copy-buffer-order", "edgetrain/api.py", "        offset = 0\n        for p in self._train.params:",
           "        offset = 0\n        for p in sorted(self._train.params):", ("tests/test_api.py",),
           "copy_buffer_to_parameters(trainable_only=False) by name order"),
    Mutant("restore-no-moments", "edgetrain/api.py",
           "                if m is not None:\n                    np.copyto(",
           "                if False:\n                    np.copyto(", ("tests/test_api.py", "tests/test_golden.py"),
           "resumed optimizer starts from zero moments"),
    # --- checkpoint --------------------------------------------------------------------------------------------
    Mutant("reader-step-zero", "edgetrain/checkpoint/reader.py",
           "step=g.scalar(S.OptimizerGroup.step, \"i64\", 0)", "step=0 * g.scalar(S.OptimizerGroup.step, \"i64\", 0)",
           ("tests/test_golden.py",), "optimizer step read as 0"),
    Mutant("reader-moments-swapped", "edgetrain/checkpoint/reader.py", "            moments[mname] = value\n",
           "            moments[{\"momentum0\": \"momentum1\", \"momentum1\": \"momentum0\"}.get(mname, mname)]"
           " = value\n",
           ("tests/test_golden.py",), "first and second moments swapped on read"),
    Mutant("writer-float-props-as-int", "edgetrain/checkpoint/writer.py",
           "        elif isinstance(value, (bool, int, np.integer)):",
           "        elif isinstance(value, (bool, int, float, np.integer)):", ("tests/test_checkpoint.py",),
           "float properties written as ints"),
    Mutant("writer-lr-dropped", "edgetrain/checkpoint/writer.py",
           "b.PrependFloat32Slot(S.OptimizerGroup.initial_learning_rate, _f32(g.initial_learning_rate), 0.0)",
           "b.PrependFloat32Slot(S.OptimizerGroup.initial_learning_rate, 0.0, 0.0)",
           ("tests/test_api.py", "tests/test_checkpoint.py", "tests/test_golden.py"), "learning rate not saved"),
    Mutant("save-unsorted", "edgetrain/api.py",
           "trainable = {n: np.array(state._array(n)) for n in sorted(state._checkpoint.trainable)}",
           "trainable = {n: np.array(state._array(n)) for n in state._checkpoint.trainable}",
           ("tests/test_api.py",), "parameters saved in load order, not sorted as ORT saves them"),
    Mutant("atomic-no-folder-fsync", "edgetrain/atomic.py", "    _fsync_folder(folder)\n", "",
           ("tests/test_atomic.py",), "rename not made durable"),
]


def run_one(m: Mutant, timeout: float) -> str:
    path = ROOT / m.path
    source = path.read_bytes()
    text = source.decode()
    if text.count(m.original) != 1:
        return "stale"
    try:
        path.write_text(text.replace(m.original, m.mutated))
        try:
            r = _pytest(m.tests, timeout)
        except subprocess.TimeoutExpired:
            return "killed (timeout)"
        return "survived" if r.returncode == 0 else ("killed" if r.returncode == 1 else f"error {r.returncode}")
    finally:
        path.write_bytes(source)


def _pytest(tests, timeout: float) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ids", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--check", action="store_true", help="only check that each snippet occurs once")
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args(argv)
    chosen = [m for m in MUTANTS if not args.ids or m.id in args.ids]
    if args.check:
        stale = [m.id for m in chosen if (ROOT / m.path).read_text().count(m.original) != 1]
        print(f"{len(chosen) - len(stale)} of {len(chosen)} snippets found once" +
              (f"; stale: {', '.join(stale)}" if stale else ""))
        return 1 if stale else 0
    # a mutant counts as killed only if its tests pass without it: run every selection once, unmutated
    baseline = _pytest(sorted({t for m in chosen for t in m.tests}), args.timeout * 4)
    if baseline.returncode != 0:
        print("the unmutated tests fail; fix them first:\n" + baseline.stdout[-3000:])
        return 2
    results = {}
    for m in chosen:
        start = time.perf_counter()
        results[m.id] = run_one(m, args.timeout)
        print(f"{results[m.id]:16s} {m.id:30s} {time.perf_counter() - start:6.1f} s  {m.why}", flush=True)
    scored = [r for r in results.values() if r != "stale"]
    killed = sum(r.startswith("killed") for r in scored)
    print(f"mutation score: {killed}/{len(scored)} killed ({100 * killed / max(1, len(scored)):.0f}%)"
          + (f", {len(results) - len(scored)} stale" if len(scored) < len(results) else ""))
    return 0 if killed == len(scored) else 1


if __name__ == "__main__":
    sys.exit(main())
