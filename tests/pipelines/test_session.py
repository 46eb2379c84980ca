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
    assert list(session.encoded_t_s) == expected
    assert answer.frames_seen == len(expected)
    assert session.cache.num_visual_tokens == len(expected) * tiny_model.tokens_per_frame


def test_a_frame_exactly_at_question_time_waits_for_the_next_question(tiny_model):
    frames = random_frames(6, interval_s=1.0)
    session = StreamingSession(tiny_model, "full", frames, chunk_frames=4)
    session.ask("first", at=2.0)
    assert list(session.encoded_t_s) == [0.0, 1.0]
    session.ask("second", at=4.5)
    assert list(session.encoded_t_s) == [0.0, 1.0, 2.0, 3.0, 4.0]


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
    assert list(session.encoded_t_s) == [0.0, 1.0, 2.0, 3.0]


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


def test_the_phase_timer_wraps_each_chunks_encode_and_maintenance(tiny_model):
    """`phase_timer` sees every chunk's encode, then its maintenance; the bench's timer uses it and leaves
    the policy's methods as they are, reading eviction from the cache's token count around maintenance."""
    import contextlib

    from hermes.config import MemoryConfig
    from hermes.pipelines.bench.memory import SyncedMaintainTimer, timed_ingest

    tpf = tiny_model.tokens_per_frame
    session = StreamingSession(tiny_model, MemoryConfig(policy="sliding", budget=3 * tpf), random_frames(6),
                               chunk_frames=2)
    seen = []

    @contextlib.contextmanager
    def phases(name):
        before = session.cache.num_visual_tokens
        yield
        seen.append((name, before // tpf, session.cache.num_visual_tokens // tpf))

    session.phase_timer = phases
    session.advance()
    # frames in the cache before and after each phase: the third chunk's maintenance evicts to 3 frames
    assert seen == [("encode", 0, 2), ("maintain", 2, 2), ("encode", 2, 4), ("maintain", 4, 3),
                    ("encode", 3, 5), ("maintain", 5, 3)]

    bench_session = StreamingSession(tiny_model, MemoryConfig(policy="sliding", budget=3 * tpf), (), chunk_frames=2)
    timer = SyncedMaintainTimer(bench_session)
    frames = random_frames(4)
    assert not timed_ingest(bench_session, timer, frames[:2]).evicted
    assert timed_ingest(bench_session, timer, frames[2:]).evicted
    assert set(timer.ms) == {"encode", "maintain"}
    assert "maintain" not in vars(bench_session.memory)  # no method of the policy was replaced


def test_a_long_stream_keeps_its_latest_chunk_costs_and_a_compact_frame_clock(tiny_model, tmp_path, monkeypatch):
    """What a session holds per chunk or frame must not grow a stream of days by much (`bench day`): the chunk
    costs are trimmed to the latest, the frame times are 8 bytes each, and the checkpoint cadence counts on."""
    import hermes.pipelines.session as session_module

    monkeypatch.setattr(session_module, "CHUNK_STATS_KEPT", 3)
    frames = random_frames(20, interval_s=1.0)
    session = StreamingSession(tiny_model, "sliding", frames, chunk_frames=1, memory_dir=tmp_path / "mem")
    saved = []
    monkeypatch.setattr(session, "checkpoint", lambda wait=True: saved.append(session.chunks_encoded))
    session.advance()
    assert session.chunks_encoded == 20 and 3 <= len(session.chunk_stats) <= 6
    assert session.chunk_stats[-1].frames == 1  # the newest is kept
    assert session.encoded_t_s.itemsize == 8 and list(session.encoded_t_s) == [f.t_s for f in frames]
    assert saved == [1, 8, 16]  # memory.checkpoint_every (8) counts every chunk, not the ones kept
    session.close()
