"""Greedy decoding that keeps chosen tokens on the device (`generate_greedy`) gives, token for token,
the answer of a plain step-by-step loop that reads every token on the host."""

import pytest
import torch

from hermes.config import ModelConfig
from hermes.models.base import EOS_CHECK_EVERY
from hermes.models.loading import load_model
from hermes.pipelines.session import StreamingSession
from tests.conftest import random_frames


def plain_greedy(model, prompt, cache, max_new_tokens: int, eos: set[int], penalty: float) -> list[int]:
    """The straightforward loop: one host read per token, the end-of-answer check before each step."""
    hidden = model.prefill(prompt, cache.allocate_positions(prompt.shape[0]), cache)
    next_id = int(model.logits(hidden[-1:])[0].argmax())
    ids: list[int] = []
    while len(ids) < max_new_tokens and next_id not in eos:
        ids.append(next_id)
        if len(ids) == max_new_tokens:
            break
        hidden = model.prefill(model.embed_ids([next_id]), cache.allocate_positions(1), cache)
        logits = model.logits(hidden[-1:])[0].clone()
        for t in set(ids):
            logits[t] = logits[t] * penalty if logits[t] < 0 else logits[t] / penalty
        next_id = int(logits.argmax())
    return ids


@pytest.fixture(scope="module")
def answering():
    model = load_model(ModelConfig(name="tiny-llava-onevision"))
    session = StreamingSession(model, "full", random_frames(4, size=(16, 16)), chunk_frames=4)
    session.advance()
    return model, session.cache, model.question_embeds("What is it?")


def _both(model, cache, prompt, max_new_tokens, eos, penalty, on_text=None):
    model.eos_token_ids, model.repetition_penalty = eos, penalty
    with torch.inference_mode():
        mark = cache.mark()
        expected = plain_greedy(model, prompt, cache, max_new_tokens, eos, penalty)
        cache.rewind(mark)
        got = model.generate_greedy(prompt, cache, max_new_tokens, on_text=on_text)
        cache.rewind(mark)
    return expected, got


@pytest.mark.parametrize("penalty", [1.0, 1.3])
@pytest.mark.parametrize("max_new_tokens", [0, 1, EOS_CHECK_EVERY, 3 * EOS_CHECK_EVERY + 3])
def test_answers_match_the_plain_loop_without_an_end_token(answering, penalty, max_new_tokens):
    model, cache, prompt = answering
    expected, got = _both(model, cache, prompt, max_new_tokens, set(), penalty)
    assert got.token_ids == expected and len(expected) == max_new_tokens


@pytest.mark.parametrize("penalty", [1.0, 1.3])
def test_an_end_token_inside_a_check_window_ends_the_answer_where_the_plain_loop_ends(answering, penalty):
    model, cache, prompt = answering
    free, _ = _both(model, cache, prompt, 4 * EOS_CHECK_EVERY, set(), penalty)
    # end-of-answer tokens first chosen at every step that does not fall on a window boundary
    first_seen = {t: free.index(t) for t in free}
    stops = sorted({i for i in first_seen.values() if i > 0 and i % EOS_CHECK_EVERY})
    assert stops, "the tiny model chose no new token after its first: nothing to stop on"
    for stop in stops:
        eos = {free[stop]}
        expected, got = _both(model, cache, prompt, 4 * EOS_CHECK_EVERY, eos, penalty)
        assert expected == free[:stop]
        assert got.token_ids == expected
        assert got.text == model.tokenizer.decode(expected, skip_special_tokens=True).strip()


def test_streamed_pieces_join_to_the_answer_and_cover_it_token_by_token(answering):
    model, cache, prompt = answering
    pieces: list[str] = []
    expected, got = _both(model, cache, prompt, 12, set(), 1.0, on_text=pieces.append)
    assert got.token_ids == expected
    assert "".join(pieces).strip() == got.text
    assert 1 < len(pieces) <= len(expected)  # streamed as tokens came, not once at the end


def test_the_cache_is_left_holding_the_question_and_at_most_the_decoded_steps(answering):
    model, cache, prompt = answering
    model.eos_token_ids, model.repetition_penalty = set(), 1.0
    before = cache.num_tokens
    mark = cache.mark()
    with torch.inference_mode():
        got = model.generate_greedy(prompt, cache, 5)
        assert cache.num_tokens == before + prompt.shape[0] + len(got.token_ids) - 1
    cache.rewind(mark)
    assert cache.num_tokens == before


def test_stop_ids_override_the_adapters_end_tokens_for_one_answer(answering):
    """`stop_ids=()` decodes exactly `max_new_tokens` even past an end token; given ids end the answer
    there; the adapter's own end tokens are left as they were."""
    model, cache, prompt = answering
    free, _ = _both(model, cache, prompt, 3 * EOS_CHECK_EVERY, set(), 1.0)
    stop = next(i for i, t in enumerate(free) if i > 0 and t not in free[:i])
    model.eos_token_ids = {free[stop]}
    with torch.inference_mode():
        mark = cache.mark()
        forced = model.generate_greedy(prompt, cache, 3 * EOS_CHECK_EVERY, stop_ids=())
        cache.rewind(mark)
        by_default = model.generate_greedy(prompt, cache, 3 * EOS_CHECK_EVERY)
        cache.rewind(mark)
        other = model.generate_greedy(prompt, cache, 3 * EOS_CHECK_EVERY, stop_ids=[free[0]])
        cache.rewind(mark)
    assert forced.token_ids == free
    assert by_default.token_ids == free[:stop]
    assert other.token_ids == []  # its first token is the one given
    assert model.eos_token_ids == {free[stop]}
