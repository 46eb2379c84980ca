"""Official and strict answer parsing on crafted replies; every expectation written by hand
from the official rule (see parsing.parse_official's docstring)."""

from __future__ import annotations

import pytest

from hermes.datasets.parsing import official_correct, parse_official, parse_strict, score_reply, strict_correct
from hermes.datasets.records import BenchmarkQuestion

OPTIONS = ["dog", "cat", "mouse", "bird"]  # "B" is "cat"
REPLIES = ["B", "(B) cat", "The answer is B.", "Best option: (B", "b", "none"]

# benchmark: expected parse_official index for each reply in REPLIES.
OFFICIAL = {
    # Prefix removal, then the first capital A-D anywhere.
    "videomme": [1, 1, 1, 1, None, None],
    "longvideobench": [1, 1, 1, 1, None, None],
    # check_ans: the character just before the first ")"; without one, the whole reply.
    "mlvu": [1, 1, None, None, None, None],
    # "(" + reply, first word, brackets and dots removed, any case.
    "mvbench": [1, 1, None, None, 1, None],
    # The first character, as count.py compares it ("Best..." starts with B).
    "streamingbench": [1, None, None, 1, None, None],
    # polish_answer: before ")", after "(", first word, first character.
    "lvbench": [1, 1, None, 1, None, None],
    # MMMU-style (lmms-eval since late 2024): "(B)", "B " or "B." anywhere in " reply ".
    "egoschema": [1, 1, 1, 1, None, None],
    # The first option letter appearing anywhere.
    "ovo-bench": [1, 1, 1, 1, None, None],
    # Open-ended: nothing to parse.
    "rvs-ego": [None, None, None, None, None, None],
}


@pytest.mark.parametrize("benchmark", sorted(OFFICIAL))
def test_parse_official(benchmark):
    assert [parse_official(reply, OPTIONS, benchmark) for reply in REPLIES] == OFFICIAL[benchmark]


def test_egoschema_legacy_variant_needs_an_exact_reply():
    # mid-2024 lmms-eval: the reply must equal "B. cat.", "cat." or "B"
    assert [parse_official(r, OPTIONS, "egoschema", "legacy") for r in REPLIES] == [1, None, None, None, None, None]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("I think the answer is (C), not (B).", 2),  # several candidates: the one whose last occurrence comes first
        ("The man is clearly chasing the little mouse around", 2),  # over five words, no letter: option text
        ("mouse", None),  # option text in a short reply is not read
        ("E.", None),  # not one of the four letters
    ],
)
def test_egoschema_current_mmmu_parse(reply, expected):
    assert parse_official(reply, OPTIONS, "egoschema") == expected


def test_parse_strict_on_the_crafted_replies():
    assert [parse_strict(reply, OPTIONS) for reply in REPLIES] == [1, 1, None, None, None, None]


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("B.", 1),
        ("B)", 1),
        ("(B)", 1),
        ("  B  ", 1),
        ("B. Cat.", 1),  # option text: case and final period ignored
        ("B) cat", 1),
        ("B. dog", None),  # text of another option
        ("(B", None),  # unbalanced
        ("E", None),  # not one of four options
        ("B is correct", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_strict_forms(reply, expected):
    assert parse_strict(reply, OPTIONS) == expected


def test_official_extras():
    assert parse_official("B) cat", OPTIONS, "mlvu") == 1
    assert parse_official("cat.", OPTIONS, "egoschema", "legacy") == 1
    assert parse_official("B. cat.", OPTIONS, "egoschema", "legacy") == 1
    assert parse_official("cat", OPTIONS, "egoschema", "legacy") is None
    assert parse_official("cat.", OPTIONS, "egoschema") is None  # current: a short reply's text is not read
    assert parse_official("The best answer is E", OPTIONS + ["fish"], "longvideobench") == 4
    assert parse_official("The best answer is E", OPTIONS + ["fish"], "videomme") is None  # A-D only
    # Video-MME's official prefix list never removes "Best option:" (two missing commas), so
    # the B of "Best" is read; LongVideoBench's list does remove it.
    assert parse_official("Best option: C", OPTIONS, "videomme") == 1
    assert parse_official("Best option: C", OPTIONS, "longvideobench") == 2
    assert parse_official(" B", OPTIONS, "streamingbench") is None  # a leading space is the first character
    assert parse_official("Yes.", ["No", "Yes"], "ovo-bench") == 1
    assert parse_official("N", ["No", "Yes"], "ovo-bench") == 0


def _mc(gt_index: int, kind: str = "mc", options=OPTIONS) -> BenchmarkQuestion:
    return BenchmarkQuestion("q?", list(options), options[gt_index], gt_index, 1.0, "T", {}, "q1", {"kind": kind})


def test_official_correct_ovo_contains_the_letter():
    assert official_correct("A or B", _mc(1), "ovo-bench") is True
    assert official_correct("Based on the video, A", _mc(1), "ovo-bench") is True  # the official quirk
    assert official_correct("Based on the video, A", _mc(2), "ovo-bench") is False


def test_official_correct_ovo_count_and_yes_no():
    rec = BenchmarkQuestion("How many?", [], "2", None, 3.0, "REC", {}, "r", {"kind": "count"})
    replies = ["2", "There are 2.", "2 or 3", "two"]
    assert [official_correct(r, rec, "ovo-bench") for r in replies] == [True, True, False, False]
    yes = _mc(1, "yesno", ["No", "Yes"])
    no = _mc(0, "yesno", ["No", "Yes"])
    assert [official_correct(r, yes, "ovo-bench") for r in ["Y", "Yes.", "yes", "No"]] == [True, True, False, False]
    assert [official_correct(r, no, "ovo-bench") for r in ["N", "No", "Not sure"]] == [True, True, True]
    assert [strict_correct(r, yes) for r in ["Yes", "Yes.", "Y", "yes"]] == [True, True, False, False]
    assert [strict_correct(r, rec) for r in ["2", "2.", "There are 2."]] == [True, True, False]


def test_official_correct_mvbench_and_streamingbench():
    assert [official_correct(r, _mc(1), "mvbench") for r in ["B) cat", "(B) cat", "b", "The answer is B", ""]] == [
        True, True, True, False, False,
    ]
    assert [official_correct(r, _mc(1), "streamingbench") for r in ["B. cat", " B", "cat"]] == [True, False, False]


def test_unscorable_questions_give_none():
    open_ended = BenchmarkQuestion("What happened?", [], "He left.", None, 5.0, "ego", {}, "o", {"kind": "open"})
    assert official_correct("He left.", open_ended, "rvs-ego") is None
    assert strict_correct("He left.", open_ended) is None
    unlabelled = BenchmarkQuestion("q?", list(OPTIONS), None, None, None, "egoschema", {}, "u", {"kind": "mc"})
    assert official_correct("B", unlabelled, "egoschema") is None


def test_score_reply_proactive_within_two_seconds():
    q = BenchmarkQuestion("When the score is 3, output \"3\".", [], "3", None, 20.0, "Proactive Output", {}, "p",
                 {"kind": "proactive", "gt_time_s": 29.0})
    assert score_reply(q, "3", "streamingbench", answered_at_s=31.0) == {
        "parsed_official": None, "parsed_strict": None, "official": True, "strict": True, "time_correct": True,
    }
    assert score_reply(q, "The score is 3", "streamingbench", answered_at_s=27.0)["official"] is True
    assert score_reply(q, "The score is 3", "streamingbench", answered_at_s=27.0)["strict"] is False
    late = score_reply(q, "3", "streamingbench", answered_at_s=31.5)
    assert (late["time_correct"], late["official"]) == (False, False)
    assert score_reply(q, "3", "streamingbench", answered_at_s=None)["official"] is False


def test_score_reply_multiple_choice():
    assert score_reply(_mc(1), "The answer is B.", "videomme") == {
        "parsed_official": 1, "parsed_strict": None, "official": True, "strict": False,
    }
    assert score_reply(_mc(1), None, "videomme")["official"] is False
