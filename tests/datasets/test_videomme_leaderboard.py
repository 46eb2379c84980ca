"""Video-MME scored as its official eval_your_results.py scores it (the leaderboard's numbers) beside
our every-question accuracy. Expected values are counted by hand in the comments."""

from __future__ import annotations

import pytest

from hermes.datasets.metrics import summarize
from hermes.datasets.records import KIND_MC, BenchmarkQuestion
from hermes.datasets.report import render_markdown
from tests.datasets.test_report import summary as report_summary


def mc(qid: str, duration: str) -> BenchmarkQuestion:
    """A four-option Video-MME-like question whose answer is option A."""
    return BenchmarkQuestion("q", ["a", "b", "c", "d"], "a", 0, None, "Counting Problem", {}, qid,
                             {"kind": KIND_MC, "groups": (duration,), "duration": duration})


def reply(letter: int | None, strict_letter: int | None = "same") -> dict:
    """A scored sample: the letter each parser extracted (None: no letter) and whether it is A."""
    strict_letter = letter if strict_letter == "same" else strict_letter
    return {"parsed_official": letter, "official": letter == 0,
            "parsed_strict": strict_letter, "strict": strict_letter == 0}


QUESTIONS = ([mc(f"s{i}", "short") for i in range(4)] + [mc(f"m{i}", "medium") for i in range(2)]
             + [mc(f"l{i}", "long") for i in range(3)])
RESULTS = {
    # short: right, wrong, no letter, s3 missing
    "s0": reply(0, strict_letter=None), "s1": reply(1), "s2": reply(None),
    # medium: right, right
    "m0": reply(0), "m1": reply(0),
    # long: wrong, no letter, no letter
    "l0": reply(2), "l1": reply(None), "l2": reply(None),
}


def test_leaderboard_counts_only_replies_with_a_letter_per_duration_and_entire():
    s = summarize("videomme", QUESTIONS, RESULTS)
    board = s["leaderboard"]
    # short 1 right of 2 with a letter; medium 2 of 2; long 0 of 1
    assert board["per_duration"] == {
        "short": {"extracted": 2, "correct": 1, "accuracy": 0.5},
        "medium": {"extracted": 2, "correct": 2, "accuracy": 1.0},
        "long": {"extracted": 1, "correct": 0, "accuracy": 0.0},
    }
    assert list(board["per_duration"]) == ["short", "medium", "long"]
    # entire: 3 right of 5 with a letter
    assert (board["overall"], board["extracted"], board["correct"]) == (0.6, 5, 3)
    assert s["official_definition"] == "leaderboard"
    # ours: 3 right of all 9 questions; per bucket 1/4, 2/2, 0/3
    assert s["overall"] == pytest.approx(3 / 9)
    assert {d: t["accuracy"] for d, t in s["per_category"].items()} == {"short": 0.25, "medium": 1.0, "long": 0.0}


def test_leaderboard_under_the_strict_parser_uses_its_own_letters():
    board = summarize("videomme", QUESTIONS, RESULTS, key="strict")["leaderboard"]
    # s0 has no strict letter: short 0 of 1; entire 2 of 4
    assert board["per_duration"]["short"] == {"extracted": 1, "correct": 0, "accuracy": 0.0}
    assert (board["overall"], board["extracted"]) == (0.5, 4)


def test_a_bucket_without_any_letter_has_no_accuracy():
    questions = [mc("s0", "short"), mc("l0", "long")]
    board = summarize("videomme", questions, {"s0": reply(0), "l0": reply(None)})["leaderboard"]
    assert board["per_duration"]["long"] == {"extracted": 0, "correct": 0, "accuracy": None}
    assert "medium" not in board["per_duration"]  # no medium question selected
    assert board["overall"] == 1.0


def test_report_puts_the_leaderboard_first_then_every_question():
    summary = report_summary()
    summary.update(benchmark="videomme", metric="videomme")
    summary["accuracy"] = {key: summarize("videomme", QUESTIONS, RESULTS, key=key) for key in ("official", "strict")}
    text = render_markdown(summary, [], [])
    table = text.split("## Accuracy")[1].split("## Per task")[0]
    rows = [line for line in table.splitlines() if line.startswith("|") and "---" not in line][1:]
    assert [r.split("|")[1].strip() for r in rows] == [
        "Video-MME leaderboard (eval_your_results.py; 5 with a letter)",
        "leaderboard short (2 with a letter)",
        "leaderboard medium (2 with a letter)",
        "leaderboard long (1 with a letter)",
        "overall (every question; missing or letterless count wrong)",
    ]
    assert [r.split("|")[2].strip() for r in rows] == ["60.0%", "50.0%", "100.0%", "0.0%", "33.3%"]
    assert rows[1].split("|")[3].strip() == "0.0%"  # strict: short 0 of 1


def test_the_terminal_line_puts_the_leaderboard_number_first_and_names_it():
    from hermes.datasets.cli import _headline

    summary = {"benchmark": "videomme",
               "accuracy": {"official": {"overall": 3 / 9, "leaderboard": {"overall": 0.6, "extracted": 5}}},
               "coverage": {"questions_answered": 9, "questions_expected": 9, "videos_missing": 0,
                            "videos_unreadable": 0}}
    line = _headline(summary, "out").splitlines()[0]
    assert line.startswith("videomme: leaderboard 60.0% (over 5 replies with a letter), every question 33.3%")
    assert "official" not in line
