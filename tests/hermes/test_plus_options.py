"""`hermes-plus`'s options on the micro model (16 visual tokens per frame, 4 layers): the newest tokens
kept whatever they score, importance carried in the long-term layers only, recall within the budget,
and recall that reads what the question says about time."""

import dataclasses

import pytest
import torch

from hermes.cache import KIND_RECALLED, KIND_VISUAL
from hermes.config import MemoryConfig, ModelConfig
from hermes.lower import content_vector
from hermes.models.loading import load_model
from hermes.pipelines.session import StreamingSession
from hermes.rope import RotarySpec
from hermes.time_reference import TimeReference, time_reference
from tests.conftest import random_frames

TPF = 16  # visual tokens per frame of the micro model


@pytest.fixture(scope="module")
def micro():
    return load_model(ModelConfig(name="micro-llava-onevision", device="cpu", dtype="float32"))


@pytest.mark.parametrize(("question", "expected"), [
    ("What colour is the object on screen now?", TimeReference("present")),
    ("What colour was the first object?", TimeReference("start")),
    ("What colour was the second object?", TimeReference("start")),  # ordinals count from the start
    ("What happened at the beginning?", TimeReference("start")),
    ("What colour was the object just before the red circle?", TimeReference("before", subject="red circle")),
    ("Who came in right after the man in a hat?", TimeReference("after", subject="man in a hat")),
    ("What was on the table 5 minutes ago?", TimeReference("ago", seconds_ago=300.0)),
    ("What did she hold 30 s ago?", TimeReference("ago", seconds_ago=30.0)),
    ("How many times did they show a red object?", TimeReference("none")),
])
def test_time_reference(question, expected):
    assert time_reference(question) == expected


def old_favouring_attention(monkeypatch):
    """Probe maps that favour the oldest tokens (attention falling with cache index), probed in `maintain`."""
    import hermes.memory

    monkeypatch.setattr(hermes.memory.HermesPolicy, "probe_queries", lambda self, cache, n_new: None)
    monkeypatch.setattr(hermes.memory, "probe_attention", lambda model, cache, embeds: [
        torch.linspace(1.0, 0.01, cache.num_tokens).expand(embeds.shape[0], -1) for _ in range(cache.num_layers)])


def newest_ids(session, n: int) -> set[int]:
    layer = session.cache.layers[0]
    visual = layer.token_ids[layer.kinds == KIND_VISUAL]
    return set(range(int(visual.max()) - n + 1, int(visual.max()) + 1))


def test_recent_keep_holds_the_newest_share_in_every_layer_whatever_attention_says(micro, monkeypatch):
    old_favouring_attention(monkeypatch)
    kept = {}
    for share in (0.0, 0.5):
        memory = MemoryConfig(policy="hermes", budget=4 * TPF, recent_keep=share)
        session = StreamingSession(micro, memory, random_frames(24, size=(16, 16)), chunk_frames=8)
        session.advance()
        newest = newest_ids(session, 2 * TPF)  # half the budget: the 2 newest frames
        kept[share] = [newest <= set(layer.token_ids.tolist()) for layer in session.cache.layers]
    assert not kept[0.0][-1]  # the reference: the long-term layer reads attention alone and lets them go
    assert all(kept[0.5])


def test_accumulation_in_long_term_layers_only_carries_no_state_for_the_others(micro):
    memory = MemoryConfig(policy="hermes", budget=4 * TPF, accumulation="sum", accumulation_bands="longterm")
    session = StreamingSession(micro, memory, random_frames(24, size=(16, 16)), chunk_frames=8)
    session.advance()
    longterm = session.memory.longterm_band[:, 0].tolist()
    carried = {int(key.split(".")[1]) for key in session.memory.state_dict()}
    assert carried == {layer for layer, is_longterm in enumerate(longterm) if is_longterm} and carried


def recall_session(micro, **memory) -> StreamingSession:
    cfg = MemoryConfig(policy="hermes", budget=4 * TPF, recall=True, recall_top_k=2, **memory)
    session = StreamingSession(micro, cfg, random_frames(40, interval_s=1.0, size=(16, 16)), chunk_frames=4)
    session.advance()
    return session


def recalled_frames(session, question: str, now_s: float = 40.0) -> list[int]:
    """The frames of the tokens a question splices into the first layer (rewound afterwards)."""
    cache = session.cache
    mark = cache.mark()
    session.lower.recall(cache, session.model.question_embeds(question), question, now_s)
    layer = cache.layers[0]
    frames = sorted(set(layer.frame_index[layer.kinds == KIND_RECALLED].tolist()))
    cache.rewind(mark)
    return frames


def test_recall_share_leaves_part_of_the_budget_to_recall_and_recall_stays_within_it(micro):
    session = recall_session(micro, recall_share=0.5, recall_gate="question")
    assert session.cache.num_visual_tokens <= 2 * TPF  # level 1 keeps half the budget
    answer = session.ask("What colour was the first object?")
    assert 0 < answer.recall["tokens"] <= 2 * TPF
    session.close()


def test_recall_reads_the_question_for_when(micro, monkeypatch):
    """Level 1 leaves half the budget (2 frames) to recall: what fills it is the frames nearest the time asked."""
    session = recall_session(micro, recall_gate="question", recall_share=0.5)
    assert recalled_frames(session, "What colour is the object on screen now?") == []
    assert 0 in recalled_frames(session, "What colour was the first object?")
    moment = recalled_frames(session, "What was there 20 seconds ago?", now_s=40.0)
    assert moment and max(abs(f - 20) for f in moment) <= 3  # 1 frame per second
    # "just before X": the frames before where X was seen (stubbed at 25 s) come first
    monkeypatch.setattr(type(session.lower), "_seen_at", lambda self, cache, hits: 25.0)
    before = recalled_frames(session, "What colour was the object just before the red circle?")
    # a frame after X counts twice as far as one before it
    assert before and all(19 <= f <= 28 for f in before) and sum(f <= 25 for f in before) > sum(f > 25 for f in before)
    session.close()


def test_the_start_of_a_stream_is_recalled_as_its_first_events_not_its_still_opening():
    """Four identical empty frames open the stream, then an object (two frames, moving a little), empty
    again, a second object: a question about the start gets the opening frame, then the frames that differ
    from it, nearest first, then the still ones."""
    from hermes.lower import change_priority

    torch.manual_seed(0)
    empty, first, second = torch.randn(3, 2, 8)  # (H, D) each: a frame's content, per head
    content = [empty] * 4 + [first, first + 0.05 * torch.randn(2, 8)] + [empty] * 2 + [second, second]
    per_frame = 3  # tokens per frame
    values = torch.stack([c[:, None, :].expand(2, per_frame, 8) for c in content], dim=1).reshape(2, -1, 8)
    frame_index = torch.arange(len(content)).repeat_interleave(per_frame)
    nearness = -frame_index.double()  # the start: the earlier, the nearer
    priority = change_priority(values, frame_index, nearness)
    by_frame = [float(priority[frame_index == f][0]) for f in range(len(content))]
    assert all(float(priority[frame_index == f].min()) == by_frame[f] for f in range(len(content)))  # a frame alike
    ranked = sorted(range(len(content)), key=lambda f: -by_frame[f])
    assert ranked == [0, 4, 5, 8, 9, 1, 2, 3, 6, 7]  # the opening, both objects, then the empty frames
    assert torch.equal(change_priority(values, frame_index, nearness), priority)


def test_a_question_about_the_start_recalls_past_a_still_opening(micro):
    """Six still frames open the stream: the splice for "the first object" (two frames' worth) holds the
    opening frame and the frame where the picture first changed, where nearness to t = 0 alone takes 0, 1, 2."""
    frames = random_frames(40, interval_s=1.0, size=(16, 16))
    frames[:6] = [dataclasses.replace(f, rgb=frames[0].rgb) for f in frames[:6]]
    cfg = MemoryConfig(policy="hermes", budget=4 * TPF, recall=True, recall_top_k=2, recall_gate="question",
                       recall_share=0.5)
    session = StreamingSession(micro, cfg, frames, chunk_frames=4)
    session.advance()
    recalled = recalled_frames(session, "What colour was the first object?")
    # frame 0's tokens still in level 1 leave room that the next nearest (still) frame fills
    assert recalled[0] == 0 and 6 in recalled and not {2, 3, 4, 5} & set(recalled)
    session.close()


def test_x_is_found_at_the_frame_whose_content_matches_the_question(micro):
    session = recall_session(micro, recall_gate="question")
    rid = sorted(session.lower.spans, key=session.lower.spans.get)[3]
    tokens = session.lower.store.fetch([rid])[0].layers[-1]
    frame = int(tokens.frame_index[len(tokens.frame_index) // 2])
    mine = tokens.frame_index == frame
    positions = tokens.positions.reshape(-1, tokens.num_tokens)[:, mine]
    spec = RotarySpec.from_text_config(micro.text_config)
    session.lower.last_vector = content_vector(tokens.keys[:, mine], positions, spec)
    assert session.lower._seen_at(session.cache, [(rid, 1.0)]) == session.lower.frame_times[frame]
    session.close()


def test_a_resumed_stream_without_record_times_recalls_by_similarity(micro, monkeypatch):
    """Records stored before a resume carry no span in this session: a time reference falls back to the
    question's nearest records (as gated), instead of recalling nothing."""
    import hermes.lower

    session = recall_session(micro, recall_gate="question")
    rid = sorted(session.lower.spans)[0]
    session.lower.spans.clear()
    monkeypatch.setattr(session.lower.store, "search", lambda vector, k: [(rid, 0.9)])
    monkeypatch.setattr(hermes.lower, "gate_hits", lambda hits, *args: hits)
    assert recalled_frames(session, "What colour was the first object?")
    session.close()


def test_the_splice_equals_dequantizing_every_record_then_choosing(micro):
    """Recall reads records as stored (int8) and dequantizes only the tokens it keeps: every spliced key and
    value equals, bit for bit, the same token of its record dequantized whole, in every layer."""
    session = recall_session(micro, recall_gate="question", recall_share=0.5)
    stored = session.lower.store.fetch(list(session.lower.spans), dequantize=False)
    assert all(layer.key_scale is not None for record in stored for layer in record.layers)  # int8 codes
    whole = session.lower.store.fetch(list(session.lower.spans))  # dequantized whole, as before the splice
    cache, question = session.cache, "What colour was the first object?"
    mark = cache.mark()
    session.lower.recall(cache, session.model.question_embeds(question), question, 40.0)
    assert cache.compactions == 0  # no record moves: positions name the tokens
    for index, layer in enumerate(cache.layers):
        by_position = {}  # position -> (key, value, record id), over every record's tokens in this layer
        for record in whole:
            tokens = record.layers[index]
            for i, position in enumerate(tokens.positions.reshape(-1).tolist()):
                by_position[position] = (tokens.keys[:, i], tokens.values[:, i], record.record_id)
        recalled = (layer.kinds == KIND_RECALLED).nonzero().squeeze(1).tolist()
        assert len(recalled) == 2 * TPF
        sources = set()
        for i in recalled:
            key, value, rid = by_position[int(layer.positions[0, i])]
            assert torch.equal(layer.keys[0][:, i], key) and torch.equal(layer.values[0][:, i], value)
            sources.add(rid)
        assert len(sources) == 2  # tokens of two records, each scaled by its own record's scales
    cache.rewind(mark)
    session.close()


def test_chosen_rows_of_int8_and_float_records_equal_dequantizing_them_all():
    from hermes.lower import chosen_rows
    from hermes.tiers.records import LayerTokens

    torch.manual_seed(0)

    def tokens(m: int, int8: bool) -> LayerTokens:
        rows = torch.randint(-127, 128, (2, m, 4), dtype=torch.int8) if int8 else torch.randn(2, m, 4)
        scale = torch.rand(2, 1, 4) if int8 else None
        return LayerTokens(keys=rows, values=rows, positions=torch.arange(m)[None], token_ids=torch.arange(m),
                           frame_index=torch.arange(m), scores=torch.rand(m), counts=torch.ones(m, dtype=torch.long),
                           key_scale=scale, value_scale=scale)

    for layer in ([tokens(3, True), tokens(5, True)], [tokens(3, True), tokens(2, False), tokens(4, True)]):
        every = torch.cat([t.dequantized("keys") for t in layer], dim=1)  # (2, C, 4)
        top = torch.tensor([0, 2, 3, 4, every.shape[1] - 1])
        record_of = torch.repeat_interleave(torch.arange(len(layer)), torch.tensor([t.num_tokens for t in layer]))
        out = torch.full((2, top.numel(), 4), torch.nan)
        chosen_rows(layer, top, record_of[top], "keys", out=out)
        assert torch.equal(out, every[:, top])


def test_the_cap_keeps_each_layers_highest_priorities_in_time_order():
    from hermes.lower import best_in_time_order

    priorities = [torch.tensor([0.5, 3.0, 1.0, 2.0]), torch.tensor([4.0, 0.0, 1.0, 3.0])]
    assert best_in_time_order(priorities, 2).tolist() == [[1, 3], [0, 3]]
    assert best_in_time_order(priorities, 4).tolist() == [[0, 1, 2, 3]] * 2  # all fit: no ranking
    uneven = [torch.tensor([0.5, 3.0, 1.0]), torch.tensor([4.0, 0.0, 1.0, 3.0, 2.0])]
    assert best_in_time_order(uneven, 2).tolist() == [[1, 2], [0, 3]]


def test_frames_the_opening_rank_did_not_see_come_after_every_frame_it_did():
    """The start's ranking is read in the first layer; another layer's token of a frame the first layer
    holds gets that frame's rank, one of a frame it does not hold comes after all of them, nearest first."""
    from hermes.lower import by_frame_of

    known_frames = torch.tensor([0, 0, 3, 5])
    known = torch.tensor([9.0, 9.0, -1.0, -20.0])  # a frame's tokens alike
    frame_index = torch.tensor([3, 1, 0, 2, 5])
    nearness = -frame_index.float()
    ranked = by_frame_of(known_frames, known, frame_index, nearness)
    assert ranked[[0, 2, 4]].tolist() == [-1.0, 9.0, -20.0]
    assert float(ranked[[1, 3]].max()) < -20.0 and ranked[1] > ranked[3]  # unseen: last, frame 1 before frame 2


def test_records_of_an_older_position_epoch_are_spliced_before_level_1_and_re_rotated(micro):
    """After a compaction renumbers level 1's positions, a record of the older epoch moves: the newest to end
    just before level 1's oldest visual position, each older one just before the next; every spliced key is
    its stored key rotated by its record's shift (docs/ARCHITECTURE.md, Memory, "Recall")."""
    from hermes.rope import rotate_keys

    session = recall_session(micro, recall_gate="question", recall_share=0.5)
    cache, question = session.cache, "What colour was the first object?"
    records = sorted(session.lower.store.fetch(list(session.lower.spans)), key=lambda r: r.t_start_s)
    cache.compactions += 1  # every stored record now predates a compaction
    first_layer = cache.layers[0]
    oldest = int(first_layer.positions[0, first_layer.kinds == KIND_VISUAL].min())
    embeds = session.model.question_embeds(question)
    chosen = {rid for rid, _ in session.lower._chosen(cache, embeds, question, 40.0)[0]}  # the records nearest t = 0
    hit = [r for r in records if r.record_id in chosen]
    assert len(hit) == 2
    mark = cache.mark()
    session.lower.recall(cache, embeds, question, 40.0)
    # the shifts the design asks for, newest record first
    shifts, end = {}, oldest
    for record in reversed(hit):
        shifts[record.record_id] = end - 1 - max(int(t.positions.max()) for t in record.layers)
        end = min(int(t.positions.min()) for t in record.layers) + shifts[record.record_id]
    spec = RotarySpec.from_text_config(micro.text_config)
    for index, layer in enumerate(cache.layers):
        recalled = (layer.kinds == KIND_RECALLED).nonzero().squeeze(1).tolist()
        assert len(recalled) == 2 * TPF and int(layer.positions[0, recalled].max()) < oldest
        for i in recalled:
            moved_to = int(layer.positions[0, i])
            (source, at), = [(r, j) for r in hit for j, p in enumerate(r.layers[index].positions.reshape(-1).tolist())
                             if p + shifts[r.record_id] == moved_to
                             and int(r.layers[index].frame_index[j]) == int(layer.frame_index[i])]
            stored = source.layers[index]
            expected = rotate_keys(stored.keys[:, at:at + 1], torch.tensor([shifts[source.record_id]]), spec,
                                   positions=stored.positions.reshape(-1)[at:at + 1])
            assert torch.allclose(layer.keys[0][:, i:i + 1], expected, atol=1e-6)
            assert torch.equal(layer.values[0][:, i], stored.values[:, at])
    cache.rewind(mark)
    session.close()
