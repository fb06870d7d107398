"""Short-form fault injection (the long form: benchmarks/fault_injection.py, results in docs)."""

import pytest

from gradsync.tools.faults import campaign


@pytest.mark.slow
def test_killed_workers_are_named_by_every_survivor_in_bounded_time():
    timeout = 3.0
    summary = campaign(6, timeout=timeout, seed=7)["summary"]
    assert summary["hangs"] == 0 and summary["wrong_results"] == 0, summary
    # Naming: 722 of 727 survivors were right over 200 trials; the one wrong trial is an open
    # finding (docs/reliability.md), so one miss is tolerated here, not more.
    assert summary["named_victim"] >= summary["survivors"] - 1, summary
    assert summary["detection_max_s"] <= timeout + 2, summary
    assert not summary["other_errors"], summary
