"""ONNX's node conformance cases (``onnx.backend.test.case.node``) run through ``edgetrain.InferenceSession``.

Each case's outcome is ``pass``, ``refused:<category>`` (edgetrain raised one of its own errors; the category is
read from the error's class and message), ``wrong`` (an output differs from the case's expected one beyond the
case's own tolerances) or ``crash`` (any other exception). ``python -m tests.conformance`` prints the counts and
rewrites the expectations file from a fresh run (review its diff before committing).
"""
from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import numpy as np

EXPECTED = Path(__file__).with_name("conformance_expected.txt")

# (category, error class name or None for any, pattern in the message): the first match names the refusal
CATEGORIES = (
    ("feed", "InputError", r"must be a numpy array|is not a tensor|sequence|optional"),
    ("dtype", None, r"element type|dtype|not a supported ONNX element type"),
    ("const-input", None, r"must be a constant"),
    ("attribute", "AttributeValueError", r""),
    ("unsupported-form", "ShapeError", r"not supported"),
    ("opset", None, r"imports ai.onnx opset|definition changed between"),
    ("shape", "ShapeError", r""),
    ("other", None, r""),
)


def cases():
    """Every node case the installed onnx generates, sorted by name."""
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return sorted(collect_testcases(None), key=lambda c: c.name)


def case_ops(case) -> set[tuple[str, str]]:
    """(domain, op_type) of every node of the case's model, subgraphs and local functions excluded."""
    return {("" if n.domain == "ai.onnx" else n.domain, n.op_type) for n in case.model.graph.node}


def in_table(case) -> bool:
    """Whether every op of the case is in the table or ONNX defines it by a function body (``edgetrain.inline``:
    run through that body)."""
    from edgetrain.inline import is_function_op
    from edgetrain.ops import OP_TABLE

    opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in case.model.opset_import}
    return all(key in OP_TABLE or is_function_op(key[1], key[0], opsets.get(key[0])) for key in case_ops(case))


def category(e: Exception) -> str:
    msg = str(e)
    for name, cls, pattern in CATEGORIES:
        if (cls is None or type(e).__name__ == cls) and re.search(pattern, msg):
            return name
    return "other"


def _feeds(case, inputs):
    names = [i.name for i in case.model.graph.input]
    inits = {t.name for t in case.model.graph.initializer}
    names = [n for n in names if n not in inits]
    return {n: _array(x) for n, x in zip(names, inputs)}


def _array(x):
    from onnx import TensorProto, numpy_helper

    # some cases give a TensorProto (float8 and friends); onnx's backend runner converts them the same way
    return numpy_helper.to_array(x) if isinstance(x, TensorProto) else x


def _close(got, want, rtol, atol) -> bool:
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        return False
    if want.dtype.kind in "fcV":      # ml_dtypes' types (bfloat16, float8, int4, ...) have kind "V" or "f"
        if want.dtype.kind == "V" or want.dtype.itemsize < 2:
            got, want = got.astype(np.float32), want.astype(np.float32)
        return bool(np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True))
    return bool(np.array_equal(got, want))


# cases whose expected outputs come from a random generator (training-mode Dropout): only types are compared
RANDOM = re.compile(r"^test_training_dropout")


def run_case(case) -> tuple[str, str]:
    """(outcome, detail): outcome is pass, refused:<category>, random (types right, values drawn at random),
    as-onnxruntime (differs from the case's expected output, agrees with onnxruntime), wrong or crash."""
    import edgetrain
    from edgetrain.errors import EdgetrainError

    try:
        sess = edgetrain.InferenceSession(case.model.SerializeToString())
        out_names = [o.name for o in case.model.graph.output]
        for inputs, expected in case.data_sets:
            expected = [_array(w) for w in expected]
            feeds = _feeds(case, inputs)
            got = sess.run(out_names, feeds)
            if len(got) != len(expected):
                return "wrong", f"{len(got)} outputs, expected {len(expected)}"
            if RANDOM.match(case.name):
                same = all(np.asarray(g).shape == w.shape and np.asarray(g).dtype == w.dtype
                           for g, w in zip(got, expected))
                return ("random", "") if same else ("wrong", "types differ")
            for name, g, w in zip(out_names, got, expected):
                if not _close(g, w, case.rtol, case.atol):
                    if _as_onnxruntime(case, feeds, got):
                        return "as-onnxruntime", f"output '{name}' differs from the case, agrees with ORT"
                    g, w = np.asarray(g), np.asarray(w)
                    return "wrong", f"output '{name}': got {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}"
    except EdgetrainError as e:
        return f"refused:{category(e)}", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - a crash is an outcome to report, not to hide
        return "crash", f"{type(e).__name__}: {e}"
    return "pass", ""


def _as_onnxruntime(case, feeds, got) -> bool:
    """Whether onnxruntime gives edgetrain's answer where both differ from the case (ONNX's reference and
    onnxruntime disagree on a few corner cases, e.g. align_corners with a non-integer scaled size)."""
    import onnxruntime as ort

    try:
        want = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, feeds)
    except Exception:  # noqa: BLE001 - onnxruntime refusing the case settles nothing
        return False
    return all(_close(g, w, case.rtol, case.atol) for g, w in zip(got, want))


EXPECTABLE = ("random", "as-onnxruntime")    # outcomes besides refusals the expectations file may list


def read_expected(path: Path = EXPECTED) -> dict[str, str]:
    """case name -> its expected outcome (cases not listed must pass)."""
    expected = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, cat = line.split()
            expected[name] = cat
    return expected


def write_expected(outcomes: dict[str, tuple[str, str]], path: Path = EXPECTED):
    lines = ["# ONNX node conformance cases (ops in edgetrain's table) that do not pass, with their outcome:",
             "# refused:<category> (edgetrain's clear error), random (values drawn at random: types checked),",
             "# as-onnxruntime (differs from ONNX's expected output, agrees with onnxruntime).",
             "# Every other such case must pass. Regenerate: python -m tests.conformance --write",
             ""]
    for name, (outcome, _) in sorted(outcomes.items()):
        if outcome in EXPECTABLE or outcome.startswith("refused:"):
            lines.append(f"{name} {outcome}")
    path.write_text("\n".join(lines) + "\n")


def main(argv):
    import collections
    import time

    t0 = time.perf_counter()
    all_cases = cases()
    outcomes, not_in_table = {}, 0
    for case in all_cases:
        if not in_table(case):
            not_in_table += 1
            continue
        outcomes[case.name] = run_case(case)
        if "-v" in argv:
            print(case.name, *outcomes[case.name], flush=True)
    counts = collections.Counter(o for o, _ in outcomes.values())
    print(f"{len(all_cases)} cases: {not_in_table} use an op outside the table; of the {len(outcomes)} others:",
          dict(sorted(counts.items())), f"({time.perf_counter() - t0:.0f} s)")
    for name, (o, detail) in sorted(outcomes.items()):
        if o in ("wrong", "crash") or ("-r" in argv and o.startswith("refused")):
            print(f"  {o:20} {name}: {detail[:300]}")
    if "--write" in argv:
        write_expected(outcomes)


if __name__ == "__main__":
    main(sys.argv[1:])
