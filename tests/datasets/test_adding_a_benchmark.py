"""docs/ADDING_A_BENCHMARK.md's example is real: its module, dropped into the benchmarks folder and
nowhere else, is found by the registry and evaluated by `hermes-video eval` like a shipped benchmark."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from hermes.cli import main
from hermes.datasets import benchmarks, registry
from hermes.datasets.parsing import score_reply
from hermes.pipelines.synthetic import write_synthetic_video

DOC = Path(__file__).resolve().parents[2] / "docs" / "ADDING_A_BENCHMARK.md"
ENTRIES = [
    {"video": "a.mp4", "question": "What moves?", "options": ["A. a circle", "B. a square"], "answer": "B"},
    {"video": "b.mp4", "question": "Which colour?", "options": ["red", "blue", "green"], "answer": "C"},
    {"video": "b.mp4", "question": "Broken", "options": ["x", "y"], "answer": "Q"},  # names no option: excluded
]


@pytest.fixture
def tinyqa(tmp_path, monkeypatch):
    """The doc's module as `datasets/benchmarks/tinyqa.py` (a folder on the package's path)."""
    code = re.search(r"saved as `datasets/benchmarks/tinyqa.py`.*?```python\n(.*?)```", DOC.read_text(), re.S)
    folder = tmp_path / "more_benchmarks"
    folder.mkdir()
    (folder / "tinyqa.py").write_text(code.group(1))
    monkeypatch.setattr(benchmarks, "__path__", [*benchmarks.__path__, str(folder)])
    registry._found.cache_clear()
    yield registry.get_benchmark("TinyQA")
    sys.modules.pop("hermes.datasets.benchmarks.tinyqa", None)
    registry._found.cache_clear()


@pytest.fixture
def data_root(tmp_path) -> Path:
    """A tiny set in TinyQA's format: two clips, three questions (one malformed)."""
    root = tmp_path / "TinyQA"
    for name, seed in (("a.mp4", 1), ("b.mp4", 2)):
        write_synthetic_video(root / "videos" / name, duration_s=2.0, fps=4.0, size=(64, 48), seed=seed)
    (root / "questions.json").write_text(json.dumps(ENTRIES))
    return root


def test_the_walkthrough_module_loads_prompts_and_scores(tinyqa, data_root):
    records = tinyqa.loader(data_root)
    [a], [b] = records[0].questions, records[1].questions
    assert (a.options, a.gt_index) == (["a circle", "a square"], 1)
    assert (b.options, b.gt_index) == (["red", "blue", "green"], 2)
    assert records.issues.excluded[0]["where"] == "questions.json entry 2"
    assert registry.build_prompt("tinyqa", b).user == "Which colour?\nA. red\nB. blue\nC. green\n" \
                                                       "Answer with the option's letter."
    verdicts = score_reply(b, "C, I think", "tinyqa")  # the doc's parser reads the first letter
    assert (verdicts["parsed_official"], verdicts["official"], verdicts["strict"]) == (2, True, False)


@pytest.mark.slow
def test_eval_runs_the_walkthrough_benchmark(tinyqa, data_root, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["eval", "tinyqa", "--data-root", data_root, "--model", "tiny-llava-onevision", "--output", out,
                 "--set", "stream.fps=2", "--set", "model.max_new_tokens=2", "--quiet"])
    assert code == 0
    assert capsys.readouterr().out.startswith("tinyqa: official ")
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["benchmark"], summary["protocol"], summary["metric"]) == ("tinyqa", "offline", "accuracy")
    assert summary["coverage"]["questions_expected"] == summary["coverage"]["questions_answered"] == 2
    assert summary["data_issues"]["excluded"] == 1
    assert [s["qid"] for s in map(json.loads, (out / "samples.jsonl").read_text().splitlines())] == \
        ["tinyqa-0", "tinyqa-1"]
