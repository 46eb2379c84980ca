"""Timestamp, span and option parsing shared by every benchmark loader."""

from __future__ import annotations

import pytest

from hermes.datasets.records import (
    BenchmarkQuestion,
    VideoRecord,
    letter_options,
    normalize_options,
    parse_span,
    parse_timestamp,
    resolve_gt_index,
)
from hermes.datasets.benchmarks.lvbench import split_inline_options
from hermes.errors import UsageError


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (215, 215.0),  # OVO-Bench realtime, int
        (54.2, 54.2),  # OVO-Bench realtime, float
        ("54.2", 54.2),
        ("00:00:50", 50.0),  # StreamingBench HH:MM:SS
        ("0:01:05", 65.0),  # H:MM:SS
        ("02:30", 150.0),  # MM:SS
        ("1:02:03.5", 3723.5),  # H:MM:SS.fraction
        ("00:01:02.250", 62.25),  # HH:MM:SS.mmm
        ("75", 75.0),  # a single field may exceed 59
        (" 00:00:36 ", 36.0),
    ],
)
def test_parse_timestamp_accepts_every_stamp_format(value, seconds):
    assert parse_timestamp(value) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "value", ["", None, True, -1, "-5", "1:75", "1:2:3:4", "abc", float("nan"), "[1, 2]", "00:15-00:19"]
)
def test_parse_timestamp_rejects_bad_values(value):
    with pytest.raises(UsageError):
        parse_timestamp(value)


@pytest.mark.parametrize(
    ("value", "span"),
    [
        ("[12.5, 30]", (12.5, 30.0)),
        ("[0:00:00 - 0:01:00]", (0.0, 60.0)),  # StreamingBench `time`
        ("00:15-00:19", (15.0, 19.0)),  # LVBench `time_reference`
        ("01:02:05-01:02:30", (3725.0, 3750.0)),
        ([3, "0:00:07"], (3.0, 7.0)),
    ],
)
def test_parse_span(value, span):
    assert parse_span(value) == pytest.approx(span)


@pytest.mark.parametrize("value", ["[30, 12.5]", "12", "[1, 2, 3]", ""])
def test_parse_span_rejects_bad_spans(value):
    with pytest.raises(UsageError):
        parse_span(value)


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (["A. cat", "B. dog"], ["cat", "dog"]),
        (["(A) cat", "(B) dog"], ["cat", "dog"]),
        (["A: cat", "B: dog"], ["cat", "dog"]),
        (["A) cat", "B) dog"], ["cat", "dog"]),
        (["A.A man in black.", "B.A woman."], ["A man in black.", "A woman."]),  # no space
        (["Wang chuqin.", "Fan Z.D."], ["Wang chuqin.", "Fan Z.D."]),  # SQA: no letters
        (["2.", "6."], ["2.", "6."]),
        # Letters out of order are option text, not prefixes.
        (["B. cat", "A. dog"], ["B. cat", "A. dog"]),
        (["A man walks.", "A dog runs."], ["A man walks.", "A dog runs."]),
    ],
)
def test_normalize_options(options, expected):
    assert normalize_options(options) == expected


def test_letter_options_gives_letters_by_position():
    assert letter_options(["Wang chuqin.", "Fan Z.D."]) == ["A. Wang chuqin.", "B. Fan Z.D."]
    assert letter_options(["cat", "dog"], "({letter}) {text}") == ["(A) cat", "(B) dog"]


def test_split_inline_options_lvbench_style():
    text = "What year appears?\n(A) 1636\n(B) 1366\n(C) 1363\n(D) 1633"
    assert split_inline_options(text) == ("What year appears?", ["1636", "1366", "1363", "1633"])


def test_split_inline_options_requires_options():
    with pytest.raises(UsageError):
        split_inline_options("What year appears?")


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        (2, 2),  # OVO gt / LVB correct_choice
        ("C", 2),
        ("(C)", 2),
        ("C.", 2),
        ("c", 2),
        ("mouse", 2),  # option text (MVBench, MLVU)
        ("C. mouse", 2),  # prefixed text
        ("Mouse.", 2),  # case and final period ignored as a fallback
        (7, None),
        ("E", None),
        ("horse", None),
        (None, None),
        (True, None),
    ],
)
def test_resolve_gt_index(answer, expected):
    assert resolve_gt_index(answer, ["cat", "dog", "mouse"]) == expected


def test_resolve_gt_index_prefers_text_when_told():
    # An option that is itself a letter: as text it is index 1, as a letter index 0.
    assert resolve_gt_index("A", ["B", "A"], prefer_text=True) == 1
    assert resolve_gt_index("A", ["B", "A"]) == 0


def _q(qid: str, t_s):
    return BenchmarkQuestion("q", [], "a", None, t_s, "t", {}, qid)


def test_video_record_sorts_questions_offline_last_and_stable():
    record = VideoRecord("v", None, None, [_q("a", None), _q("b", 5.0), _q("c", 1.0), _q("d", 5.0)])
    assert [q.qid for q in record.questions] == ["c", "b", "d", "a"]
    assert not record.available
