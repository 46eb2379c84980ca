"""Greedy decoding with the reference's repetition penalty (model.repetition_penalty)."""

import pytest
import torch

from hermes.config import ModelConfig
from hermes.errors import ConfigError
from hermes.models.base import penalize_seen_no_sync
from hermes.models.loading import load_model
from hermes.pipelines.session import StreamingSession
from tests.conftest import random_frames


def test_penalty_divides_positive_and_multiplies_negative_logits_of_answered_tokens():
    logits = torch.tensor([2.0, -1.0, 0.5, 3.0])
    seen = torch.tensor([True, True, False, False])  # tokens 0 and 1 answered
    out = penalize_seen_no_sync(logits, seen, 1.1)
    assert out.tolist() == pytest.approx([2.0 / 1.1, -1.1, 0.5, 3.0])
    assert logits.tolist() == [2.0, -1.0, 0.5, 3.0]  # the input is not changed
    assert penalize_seen_no_sync(logits, seen, 1.0).tolist() == logits.tolist()


def test_a_repeating_greedy_answer_changes_under_the_penalty():
    """The tiny random model repeats tokens; under a strong penalty its answer has no repeated token."""
    model = load_model(ModelConfig(name="tiny-llava-onevision", repetition_penalty=100.0))
    assert model.repetition_penalty == 100.0
    session = StreamingSession(model, "full", random_frames(4, size=(16, 16)), chunk_frames=4)
    session.advance()
    prompt = model.question_embeds("What is it?")
    answers = {}
    for penalty in (1.0, 100.0):
        model.repetition_penalty = penalty
        mark = session.cache.mark()
        answers[penalty] = model.generate_greedy(prompt, session.cache, 12).token_ids
        session.cache.rewind(mark)
    plain, penalised = answers[1.0], answers[100.0]
    assert len(set(plain)) < len(plain)  # the plain greedy answer repeats a token
    assert penalised[0] == plain[0]  # nothing to penalise before the first token
    assert penalised != plain and len(set(penalised)) == len(penalised)


def test_a_non_positive_penalty_is_a_config_error():
    with pytest.raises(ConfigError, match=r"model.repetition_penalty: expected a positive number, found 0.0"):
        load_model(ModelConfig(name="tiny-llava-onevision", repetition_penalty=0.0))
