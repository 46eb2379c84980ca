"""StreamingSession: what a question can see, and that asking leaves memory untouched."""

import pytest
import torch

from hermes.cache import METADATA
from hermes.errors import ConfigError, UsageError
from hermes.pipelines.session import Question, StreamingSession, format_prompt
from tests.conftest import random_frames


def cache_state(session):
    """Every tensor the cache holds, cloned: keys/values per layer plus token metadata."""
    c = session.cache
    tensors = [t.clone() for kv in c.layer_tensors() for t in kv]
    metadata = [getattr(c, name).clone() for name in METADATA]
    return tensors + metadata + [torch.tensor(c.next_position)]


@pytest.mark.parametrize("at_s", [0.0, 0.25, 0.5, 2.0, 2.1, 4.75, 100.0])
def test_a_question_at_t_sees_exactly_the_frames_before_t(tiny_model, at_s):
    frames = random_frames(10, interval_s=0.5)  # t_s = 0.0, 0.5, ..., 4.5
    session = StreamingSession(tiny_model, "full", frames, chunk_frames=3)
    answer = session.ask("What now?", at=at_s)
    expected = [f.t_s for f in frames if f.t_s < at_s]
    assert session.encoded_t_s == expected
    assert answer.frames_seen == len(expected)
    assert session.cache.num_visual_tokens == len(expected) * tiny_model.tokens_per_frame


def test_a_frame_exactly_at_question_time_waits_for_the_next_question(tiny_model):
    frames = random_frames(6, interval_s=1.0)
    session = StreamingSession(tiny_model, "full", frames, chunk_frames=4)
    session.ask("first", at=2.0)
    assert session.encoded_t_s == [0.0, 1.0]
    session.ask("second", at=4.5)
    assert session.encoded_t_s == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_asking_leaves_the_cache_bit_identical_and_is_repeatable(tiny_model):
    session = StreamingSession(tiny_model, "full", random_frames(7), chunk_frames=3, max_new_tokens=8)
    session.advance(until_s=3.0)
    before = cache_state(session)
    first = session.ask("What colour is it?", options=["red", "blue"])
    after = cache_state(session)
    assert len(before) == len(after)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    second = session.ask("What colour is it?", options=["red", "blue"])
    assert second.answer == first.answer
    assert torch.equal(second.first_token_logits, first.first_token_logits)


@pytest.mark.slow
def test_run_answers_questions_in_time_order_and_stops_at_the_last(tiny_model):
    frames = random_frames(20, interval_s=0.5)
    session = StreamingSession(tiny_model, "full", frames, chunk_frames=4)
    questions = [Question("late", 6.0), Question("early", 1.0), Question("middle", 3.0)]
    answers = list(session.run(questions))
    assert [a.question for a in answers] == ["early", "middle", "late"]
    assert [a.frames_seen for a in answers] == [2, 6, 12]
    assert session.encoded_t_s[-1] == 5.5  # nothing after the last question was encoded


def test_a_stop_before_a_questions_moment_generates_no_answer_for_it(tiny_model, monkeypatch):
    """A stop (Ctrl-C) that lands while the stream is on its way to a question's time skips that
    question: it is neither answered nor generated and thrown away; end-of-video questions still are."""
    frames = random_frames(12, interval_s=1.0)
    session = StreamingSession(tiny_model, "full", frames, chunk_frames=2)
    generated = []
    real_ask = session.ask
    monkeypatch.setattr(session, "ask", lambda text, *a, **k: generated.append(text) or real_ask(text, *a, **k))
    real_ingest = session.ingest

    def ingest_then_stop(chunk):  # the stop arrives while frames 2-3 are encoded
        real_ingest(chunk)
        if session.encoded_t_s and session.encoded_t_s[-1] >= 3.0:
            session.request_stop()

    monkeypatch.setattr(session, "ingest", ingest_then_stop)
    answers = list(session.run([Question("early", 1.5), Question("late", 9.0), Question("end")]))
    assert [a.question for a in answers] == ["early", "end"]
    assert generated == ["early", "end"]  # "late" never reached the model
    assert session.encoded_t_s == [0.0, 1.0, 2.0, 3.0]


def test_questions_without_time_are_asked_after_the_whole_stream(tiny_model):
    frames = random_frames(5)
    answers = list(StreamingSession(tiny_model, "full", frames).run([Question("end?"), Question("one", 1.0)]))
    assert [(a.question, a.frames_seen) for a in answers] == [("one", 2), ("end?", 5)]


def test_going_back_in_time_is_refused(tiny_model):
    session = StreamingSession(tiny_model, "full", random_frames(6), chunk_frames=2)
    session.ask("q", at=2.0)
    with pytest.raises(UsageError, match="time order"):
        session.ask("q", at=1.0)


def test_unknown_memory_policy_is_a_config_error(tiny_model):
    with pytest.raises(ConfigError, match=r"memory.policy: expected one of full, .*found 'fulll' \(did you mean 'full'\?\)"):
        StreamingSession(tiny_model, "fulll", [])


def test_answer_json_has_the_documented_fields(tiny_model):
    answer = StreamingSession(tiny_model, "full", random_frames(3)).ask("q", at=1.0)
    record = answer.to_json()
    assert set(record) == {"question", "answer", "at_s", "frames_seen", "ttft_ms", "latency_ms", "memory"}
    assert set(record["memory"]) == {"hbm_tokens", "hbm_bytes", "dram_bytes", "disk_bytes", "disk_records"}
    # 2 frames of 196 tokens plus the prefix, fp32 K and V: 4 layers x 2 KV heads x 16 dims x 4 bytes x 2
    tokens = record["memory"]["hbm_tokens"]
    assert tokens == 2 * 196 + len(answer_prefix_ids(tiny_model))
    assert record["memory"]["hbm_bytes"] == tokens * 4 * 2 * 16 * 4 * 2


def answer_prefix_ids(model):
    return model.tokenizer.encode(model.prefix_text(), add_special_tokens=False)


def test_multiple_choice_prompt_letters_the_options():
    assert format_prompt("Which?", ["x", "y"]) == (
        "Which?\nA. x\nB. y\nAnswer with the option's letter from the given choices directly.")
    assert format_prompt("Open?") == "Open?"
