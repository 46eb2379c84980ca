"""RVS judge replies read by ReKV's rules (video_qa/eval/eval_open_ended.py), one case per kind of reply.

The expected values come from reading ReKV's script: it keeps a reply only when the whole text
passes `ast.literal_eval`; its averaging reads `int(result['score'])` and `result['pred']` (or
`result['prev']`), counting "yes" in the lower-cased pred as yes, else "no" in it as no, else
neither (the score still averaged). A reply its averaging would crash on is dropped here.
Dropped is (None, None); a reply counted as neither is (None, score).
"""

from __future__ import annotations

import pytest

from hermes.datasets.judge import parse_judge_reply
from hermes.datasets.metrics import summarize
from hermes.datasets.records import KIND_OPEN, BenchmarkQuestion

KINDS = {
    # 1. the dict the prompt asks for
    "plain dict": [("{'pred': 'yes', 'score': 4}", (True, 4.0)), ("{'pred': 'no', 'score': 0}", (False, 0.0))],
    # 2. JSON quoting is a Python literal too
    "JSON quotes": [('{"pred": "no", "score": 1}', (False, 1.0))],
    # 3. a float score, as the prompt's own example has: kept; ReKV's mean casts it to int
    "float score": [("{'pred': 'yes', 'score': 4.8}", (True, 4.8))],
    # 4. a string score: int("2") reads it; int("2.5") does not (ReKV's averaging stops)
    "string score": [("{'pred': 'no', 'score': '2'}", (False, 2.0)), ("{'pred': 'yes', 'score': '2.5'}", (None, None))],
    # 5. capitals and words around yes/no: substring test on the lower-cased pred
    "pred in words": [("{'pred': 'Yes, they match.', 'score': 5}", (True, 5.0)),
                      ("{'pred': 'NO', 'score': 1}", (False, 1.0))],
    # 6. "not sure" holds "no": counted as no
    "not sure": [("{'pred': 'not sure', 'score': 2}", (False, 2.0))],
    # 7. neither yes nor no in pred: no verdict, the score still counts
    "neither": [("{'pred': 'maybe', 'score': 3}", (None, 3.0)), ("{'pred': '', 'score': 0}", (None, 0.0))],
    # 8. ReKV reads 'prev' when there is no 'pred'
    "prev key": [("{'prev': 'yes', 'score': 3}", (True, 3.0))],
    # 9. a dict inside prose is not a literal: dropped
    "dict in prose": [("Sure! {'pred': 'yes', 'score': 4}", (None, None)),
                      ("{'pred': 'yes', 'score': 4} They match.", (None, None))],
    # 10. a dict in a code fence: dropped
    "fenced dict": [("```python\n{'pred': 'no', 'score': 1}\n```", (None, None))],
    # 11. bare yes/no, or the keys without braces: not a dict, dropped
    "bare yes/no": [("yes", (None, None)), ("No", (None, None)), ("'pred': 'no', 'score': '2'", (None, None))],
    # 12. what ReKV's averaging crashes on, and what is not a literal at all: dropped
    "unusable": [("{'pred': 'yes'}", (None, None)),  # no score
                 ("{'score': 4}", (None, None)),  # no pred
                 ("{'pred': True, 'score': 4}", (None, None)),  # pred not a string
                 ("{'pred': 'yes', 'score': 'high'}", (None, None)),
                 ("5", (None, None)), ("['yes', 5]", (None, None)),  # literals, not dicts
                 ("", (None, None)), (None, (None, None)),
                 ("{'pred': __import__('os').getcwd(), 'score': 1}", (None, None))],  # never evaluated
}
CASES = [pytest.param(raw, expected, id=f"{kind}-{i}") for kind, pairs in KINDS.items()
         for i, (raw, expected) in enumerate(pairs)]


def test_there_are_twelve_kinds():
    assert len(KINDS) == 12


@pytest.mark.parametrize("raw, expected", CASES)
def test_reply_kind(raw, expected):
    assert parse_judge_reply(raw) == expected


def test_rekv_mean_score_counts_a_reply_that_says_neither():
    questions = [BenchmarkQuestion("q", [], "ref", None, 1.0, "ego", {}, f"r{i}", {"kind": KIND_OPEN})
                 for i in range(4)]
    verdicts = [parse_judge_reply(raw) for raw in ("{'pred': 'yes', 'score': 4.8}", "{'pred': 'no', 'score': 1}",
                                                   "{'pred': 'maybe', 'score': 3}", "Sure! {'pred': 'yes', 'score': 5}")]
    results = {f"r{i}": {"judge_correct": v, "judge_score": s} for i, (v, s) in enumerate(verdicts)}
    s = summarize("judge", questions, results)
    assert s["rekv_accuracy"] == 0.5  # yes 1, no 1; 'maybe' is neither, the prose reply dropped
    assert s["rekv_mean_score"] == pytest.approx((4 + 1 + 3) / 3)  # int(4.8) = 4
