"""`hermes-video bench serve`: a short run at N = 1, 2 whose rows hold what the suite promises, and
where two streams in one served model take less memory than two `run` processes (each loads the
model), measured in the same run."""

from __future__ import annotations

import json

import pytest

from hermes.cli import main

pytestmark = pytest.mark.slow


def test_bench_serve_rows_and_the_memory_of_one_model(tmp_path, capsys):
    out = tmp_path / "serve.json"
    assert main(["bench", "serve", "--streams", "1,2", "--seconds", "3", "--stream-fps", "4", "--ask-every", "1",
                 "--max-new-tokens", "4", "--quiet", "--output", str(out)]) == 0
    table = capsys.readouterr().out
    assert "| N | serve fps/stream |" in table
    record = json.loads(out.read_text())
    assert record["suite"] == "serve" and [r["streams"] for r in record["rows"]] == [1, 2]
    for row in record["rows"]:
        assert 0 < row["serve_fps"] <= 4 * 1.5 and 0 < row["run_fps"] <= 4 * 1.5  # never more than the camera gives
        assert row["latency_p50_ms"] <= row["latency_p95_ms"]
        assert row["fps_ratio"] == pytest.approx(row["serve_fps"] / row["run_fps"], abs=0.01)
    two = record["rows"][1]
    assert two["serve_rss_mib"] < two["run_rss_mib"] and two["memory_ratio"] < 0.8
