"""`bench day`: a short simulated day (hours of 128 frames) keeps every level within the bounds it was given
and resident memory flat after the first hour; the night's questions are answerable from the stream; bad
flags are one line before the model loads."""

from __future__ import annotations

import json
import re

import pytest

from hermes.cli import main
from hermes.datasets.synthetic_bench import COLOURS
from hermes.datasets.day import MORNING, NOW, plan_day

BUDGET = 256  # visual tokens per layer
DRAM_BOUND = 200_000  # bytes: two records (one a chunk, 105 KB at this budget): DRAM spills from the first hour
DISK_BOUND = 110_000  # bytes: one whole record (its durable log) and about three hours of spilled ones
HOURS, HOUR_S = 4, 128


pytestmark = pytest.mark.usefixtures("one_cpu_thread")  # tests/pipelines/conftest.py


@pytest.mark.slow
def test_a_short_day_stays_within_its_bounds_and_flat(tmp_path, capsys):
    out_file = tmp_path / "day.json"
    assert main(["bench", "day", "--hours", str(HOURS), "--hour-s", str(HOUR_S), "--budget", str(BUDGET),
                 "--ages", "1,2", "--per-age", "2", "--set", f"memory.dram_bytes={DRAM_BOUND}",
                 "--set", f"memory.disk_bytes={DISK_BOUND}", "--memory-dir", str(tmp_path / "mem"),
                 "--output", str(out_file), "--json", "--quiet"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert json.loads(out_file.read_text()) == result
    hours = result["hours"]
    assert [h["hour"] for h in hours] == [1, 2, 3, 4]
    assert [h["frames"] for h in hours] == [HOUR_S * (i + 1) for i in range(HOURS)]
    keys = {"hour", "rss_bytes", "hbm_bytes", "dram_bytes", "disk_bytes", "chunk_ms", "frames"}
    assert all(keys <= set(h) for h in hours)
    for h in hours:
        for policy in (h, h["sliding"]):
            assert 0 < policy["hbm_visual_tokens"] <= BUDGET
            assert policy["dram_bytes"] <= DRAM_BOUND and policy["disk_bytes"] <= DISK_BOUND
            assert policy["chunk_ms"] > 0
    # the bounds acted: DRAM spilled all day (8 records of 105 KB an hour) and the disk filled up to its bound
    assert hours[-1]["disk_bytes"] > hours[0]["disk_bytes"] and hours[-1]["disk_bytes"] > DISK_BOUND // 2
    assert all(h["sliding"]["dram_bytes"] == h["sliding"]["disk_bytes"] == 0 for h in hours)  # no memory dir
    first = hours[0]["rss_bytes"]
    assert all(abs(h["rss_bytes"] - first) <= 0.1 * first for h in hours[1:])
    if hours[0]["heap_in_use_bytes"] is not None:  # glibc: the C heap in use, a part of RSS
        assert all(0 < h["heap_in_use_bytes"] < h["rss_bytes"] and h["heap_free_bytes"] >= 0 for h in hours)
    # every question asked counts once per policy, each age's as many as asked for
    accuracy = result["accuracy_by_age"]
    assert set(accuracy) == {f"hermes@{BUDGET}", "sliding"}
    for rows in accuracy.values():
        assert [r["age"] for r in rows] == [NOW, "1 h", "2 h", MORNING]
        assert [r["questions"] for r in rows] == [2, 2, 2, 2] and result["questions"] == 8
        assert all(0 <= r["correct"] <= r["questions"] for r in rows)
    assert (tmp_path / "mem").is_dir()  # the directory given is the one used (and kept)


def test_night_questions_are_answered_by_the_stream():
    timeline, questions = plan_day(24, 3600, (1.0, 6.0, 12.0, 20.0), 3)
    apps = timeline.appearances
    assert len(questions) == 18 and all(23 * 3600 <= q.t_s < 24 * 3600 for q in questions)
    for q in questions:
        assert q.options == COLOURS
        gt = q.options[q.gt]
        if q.label == NOW:
            assert timeline.on_screen(int(q.t_s)).colour == gt
        elif q.label == MORNING:
            first_three = [a.colour for a in apps[:3]]
            ordinal = {"first": 0, "second": 1, "third": 2}[re.search(r"the (\w+) object", q.text)[1]]
            assert first_three[ordinal] == gt
        else:  # "just before the <name>": the name is seen once all day, about `age` hours before the question
            name = re.search(r"just before the (\w+ \w+)\?", q.text)[1]
            [i] = [i for i, a in enumerate(apps) if a.name == name]
            assert apps[i - 1].colour == gt and apps[i].end_s <= q.t_s
            age_h = float(q.label.split()[0])
            assert abs((q.t_s - apps[i].start_s) / 3600 - age_h) < 0.05


@pytest.mark.parametrize("argv, message", [
    (["--hours", "0"], "argument --hours: expected a positive whole number"),
    (["--hours", "169"], "--hours expects at most 168"),
    (["--hours", "3", "--ages", "3"], "--ages, --per-age: ages must be in (0, 2] hours for a 3-hour day"),
    (["--hours", "3", "--ages", "one"], "--ages expects comma-separated hours"),
    (["--hours", "24", "--per-age", "4"], "--ages, --per-age: at most 12 questions about ages"),
    (["--hours", "1", "--ages", "1"], "--ages, --per-age: ages must be in (0, 0] hours for a 1-hour day"),
    (["--hours", "2", "--hour-s", "40"], "--hour-s expects at least four chunks (64 frames)"),
    (["--hours", "2", "--memory-dir", "{file}"], "--memory-dir expects a directory, found a file"),
    (["--hours", "2", "--set", "memory.dram_bytes=-1"], "memory.dram_bytes"),
])
def test_bad_flags_are_one_line_before_the_model_loads(argv, message, tmp_path, capsys, monkeypatch):
    import hermes.models.loading

    monkeypatch.setattr(hermes.models.loading, "load_model", lambda *a, **k: pytest.fail("the model loaded"))
    (tmp_path / "f").write_text("")
    assert main(["bench", "day", *[a.replace("{file}", str(tmp_path / "f")) for a in argv]]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
