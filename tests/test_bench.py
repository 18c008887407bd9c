"""bench/train.py end to end on digits (--quick), so the training benchmark harness cannot rot unnoticed.

Checks what the harness reports, against ORT 1.19.2 and torch (not against edgetrain): every system ran and
reported numbers, and they all start from the same loss (same weights, same batch); never timings.
"""
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "train.py"


@pytest.mark.native
@pytest.mark.slow
@pytest.mark.ort119
def test_training_bench_quick_run_on_digits(ort, tmp_path):
    out = subprocess.run([sys.executable, str(BENCH), "--quick", "--models", "digits", "--out",
                          str(tmp_path / "RESULTS.md"), "--json", str(tmp_path / "results.json")],
                         check=False, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads((tmp_path / "results.json").read_text())
    rows = found["table"]["digits"]
    assert found["systems"] == ["edgetrain", "edgetrain@ort", "ort", "ort@edgetrain", "torch"]
    for name in ("edgetrain", "edgetrain@ort", "ort", "torch"):
        row = rows[name]
        assert row.get("error") is None, f"{name}: {row.get('error')}"
        assert row["ms"] > 0 and row["p10"] <= row["ms"] <= row["p90"] and row["rss"] > 0 and row["start"] > 0
    assert "ms" in rows["ort@edgetrain"] or rows["ort@edgetrain"]["error"]   # numbers, or ORT's refusal
    for name in ("edgetrain", "edgetrain@ort"):
        assert rows[name]["cold"] > 0 and rows[name]["cold_error"] is None
    assert rows["edgetrain"]["profile"]["calls_ms"], "no per-call breakdown"
    ort_loss = rows["ort"]["loss_first"]
    for name in ("edgetrain", "edgetrain@ort", "torch"):
        assert rows[name]["loss_first"] == pytest.approx(ort_loss, rel=1e-5), name
    # same update rule as ORT (HF AdamW) on the same batch: the last of the 25 steps agrees too
    assert rows["edgetrain"]["loss_last"] == pytest.approx(rows["ort"]["loss_last"], rel=1e-3, abs=1e-5)
    report = (tmp_path / "RESULTS.md").read_text()
    assert "| digits | ort | " in report and "## Targets" in report
    assert "| digits | edgetrain | " in out.stdout
