"""ONNX's node conformance suite through edgetrain.InferenceSession (tests/conformance.py): every case whose ops
are in the table (or run through their ONNX function body) passes or has the outcome
tests/conformance_expected.txt lists; none crashes or is wrong.

One process, one kernel cache. Measured on 2 busy cores: onnx generating its cases ~28 s, then the ~1,590 cases
~15 s with a warm kernel cache (about a minute cold). Cases are collected when the first test runs,
not when pytest collects, so runs of other files do not pay for them."""
import collections

import pytest

import conformance

EXPECTED = conformance.read_expected()


@pytest.fixture(scope="module")
def cases():
    return [c for c in conformance.cases() if conformance.in_table(c)]


@pytest.fixture(scope="module")
def outcomes(cases):
    return {c.name: conformance.run_case(c) for c in cases}


def test_no_case_crashes_or_is_wrong(outcomes):
    bad = {n: o for n, o in outcomes.items() if o[0] in ("crash", "wrong")}
    assert not bad, "\n".join(f"{n}: {o} {d[:300]}" for n, (o, d) in sorted(bad.items()))


def test_outcomes_match_the_expectations_file(outcomes):
    """A case that newly passes, or newly fails, or fails otherwise than listed, fails here: the file stays true."""
    diff = {n: (EXPECTED.get(n, "pass"), o, d) for n, (o, d) in outcomes.items() if o != EXPECTED.get(n, "pass")}
    assert not diff, "\n".join(f"{n}: expected {e}, got {o} {d[:200]}" for n, (e, o, d) in sorted(diff.items()))


def test_expectations_name_only_cases_that_run(cases):
    stale = sorted(set(EXPECTED) - {c.name for c in cases})
    assert not stale, f"listed but not run (op left the table or case renamed): {stale}"


def test_refusals_are_clear(outcomes):
    """Refusals come from edgetrain's own errors and name the node or tensor."""
    counts = collections.Counter(o for o, _ in outcomes.values())
    assert counts["pass"] >= 1000
    for name, (o, detail) in outcomes.items():
        if o.startswith("refused:"):
            assert "node '" in detail or "'" in detail, f"{name}: {detail}"
