"""The validation table (docs/validation.md): published nccl-tests results for named machines
against gradsync's predictions from nominal presets. The stored predictions are what the model
gives today (the quick rows are predicted again here, every row with -m slow), the summary is
computed from them, and the docs show exactly that table."""

import json
from pathlib import Path

import pytest

from gradsync.model.published import error, markdown, predict, summarize

ROOT = Path(__file__).resolve().parents[1]
PUBLISHED = json.loads((ROOT / "docs" / "results" / "published_nccl.json").read_text())["rows"]
RESULT = ROOT / "docs" / "results" / "nccl_validation.json"
STORED = json.loads(RESULT.read_text())
QUICK_S = 2.0           # rows predicted in under this many seconds when the table was made: run in the default suite


def test_every_published_row_is_in_the_table_with_its_source_and_its_set():
    assert [r["id"] for r in STORED["rows"]] == [r["id"] for r in PUBLISHED]
    for r in PUBLISHED:
        assert r["source"].startswith("https://") and r["title"] and r["set"] in ("design", "held-out")
        assert ("busbw_GBps" in r) != ("time_us" in r)


def test_the_summary_is_computed_from_the_rows():
    for r in STORED["rows"]:
        assert r["prediction"]["error"] == pytest.approx(error(r, r["prediction"]), rel=1e-12)
    assert summarize(STORED["rows"]) == STORED["summary"]


def test_the_docs_show_the_stored_table():
    assert markdown(RESULT) in (ROOT / "docs" / "validation.md").read_text()


@pytest.mark.parametrize("row", [r for r in STORED["rows"] if r["prediction"]["seconds_to_predict"] < QUICK_S],
                         ids=lambda r: r["id"])
def test_quick_rows_are_predicted_again_as_stored(row):
    again = predict({k: v for k, v in row.items() if k != "prediction"})
    assert again["predicted"] == row["prediction"]["predicted"]
    assert again["time_us"] == pytest.approx(row["prediction"]["time_us"], rel=1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("row", [r for r in STORED["rows"] if r["prediction"]["seconds_to_predict"] >= QUICK_S],
                         ids=lambda r: r["id"])
def test_slow_rows_are_predicted_again_as_stored(row):
    again = predict({k: v for k, v in row.items() if k != "prediction"})
    assert again["time_us"] == pytest.approx(row["prediction"]["time_us"], rel=1e-9)


def test_the_median_target_is_met_over_at_least_eight_machines():
    # the worst-case and small-message targets are not met; docs/validation.md says by how much and why
    s = STORED["summary"]
    assert s["machines"] >= 8 and s["median_abs_error"] <= 0.10
