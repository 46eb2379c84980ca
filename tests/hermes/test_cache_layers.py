"""Level-1 state has one owner per piece: cache layers (K/V + token metadata), policies, the session.

Covers the layer API (append, select, truncate, state dicts), the refusal of cache layouts hermes
cannot manage, `maintain()`'s returned evictions as the lower levels' only input, and that a
session restored from its state dict (in memory, or from a checkpoint of either state format)
continues exactly as the original.
"""

import shutil

import pytest
import torch
from transformers import MistralConfig, Qwen2Config

from hermes.cache import (KIND_PREFIX, KIND_RECALLED, KIND_VISUAL, METADATA, HermesCache, HermesLayer,
                          UnsupportedCacheError)
from hermes.config import MemoryConfig
from hermes.errors import EXIT_MODEL, UsageError
from hermes.lower import LowerLevels
from hermes.pipelines.persistence import CHECKPOINT
from hermes.pipelines.session import StreamingSession
from hermes.tiers.checkpoint import load_checkpoint, save_checkpoint
from tests.conftest import random_frames

H, D = 2, 8  # heads, head dim of the hand-built caches


def small_config(layers: int = 3) -> Qwen2Config:
    return Qwen2Config(num_hidden_layers=layers, hidden_size=H * D, num_attention_heads=H, num_key_value_heads=H)


def filled_cache(n: int = 6, num_axes: int = 1, seed: int = 0) -> HermesCache:
    """A cache whose model-written tokens (through `update`) are described by `record`: 2 prefix, n-2 visual."""
    gen = torch.Generator().manual_seed(seed)
    cache = HermesCache(small_config(), num_axes=num_axes)
    for layer in range(cache.num_layers):
        cache.update(torch.randn(1, H, n, D, generator=gen), torch.randn(1, H, n, D, generator=gen), layer)
    cache.record(cache.allocate_positions(2), KIND_PREFIX)
    cache.record(cache.allocate_positions(n - 2), KIND_VISUAL, torch.arange(n - 2) // 2)
    return cache


def layer_state(layer: HermesLayer) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in layer.state_dict().items()}


def assert_same_state(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if isinstance(a[name], torch.Tensor):
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
        else:
            assert a[name] == b[name], name


# ---- the layer API ----------------------------------------------------------------------------------

def test_append_adds_keys_values_and_metadata_in_one_call():
    cache = filled_cache()
    before = [layer_state(layer) for layer in cache.layers]
    keys = [torch.randn(H, 3, D) for _ in cache.layers]
    values = [torch.randn(H, 3, D) for _ in cache.layers]
    positions = [torch.tensor([[20, 21, 22 + l]]) for l in range(cache.num_layers)]  # layers may differ
    frames = [torch.tensor([7, 7, 8]) for _ in cache.layers]
    cache.append(keys, values, positions, KIND_RECALLED, frames)
    assert cache.num_tokens == 9
    for l, layer in enumerate(cache.layers):
        assert torch.equal(layer.keys[0, :, 6:], keys[l]) and torch.equal(layer.values[0, :, 6:], values[l])
        assert torch.equal(layer.keys[..., :6, :], before[l]["keys"])  # what was there is untouched
        assert layer.positions[0, 6:].tolist() == positions[l][0].tolist()
        assert layer.kinds[6:].tolist() == [KIND_RECALLED] * 3
        assert layer.frame_index[6:].tolist() == [7, 7, 8] and layer.counts[6:].tolist() == [1, 1, 1]
        assert all(getattr(layer, name).shape[-1] == 9 for name in METADATA)
    ids = cache.token_ids[:, 6:]
    assert torch.equal(ids, ids[:1].expand_as(ids))  # one token, one id, in every layer
    assert set(ids[0].tolist()).isdisjoint(cache.token_ids[0, :6].tolist())  # fresh ids


def test_append_refuses_unequal_layers_and_undescribed_tokens():
    cache = filled_cache()
    keys = [torch.randn(H, 2 if l else 1, D) for l in range(cache.num_layers)]
    with pytest.raises(ValueError, match="equally many tokens"):
        cache.append(keys, keys, [torch.zeros(1, k.shape[1], dtype=torch.long) for k in keys], KIND_RECALLED,
                     [torch.zeros(k.shape[1], dtype=torch.long) for k in keys])
    layer = cache.layers[0]
    layer.update(torch.randn(1, H, 1, D), torch.randn(1, H, 1, D))  # a forward in progress
    with pytest.raises(ValueError, match="lack metadata"):
        layer.append(torch.randn(H, 1, D), torch.randn(H, 1, D), torch.zeros(1, 1, dtype=torch.long),
                     torch.tensor([99]), KIND_RECALLED, torch.tensor([0]))


def test_select_keeps_the_chosen_tokens_with_their_metadata_per_layer():
    cache = filled_cache()
    before = [layer_state(layer) for layer in cache.layers]
    keep = torch.tensor([[0, 1, 3, 5], [0, 1, 2, 4], [0, 1, 5, 4]])  # layers keep different tokens, any order
    cache.select_(keep)
    for l, layer in enumerate(cache.layers):
        for name, old in before[l].items():
            assert torch.equal(getattr(layer, name), old[..., keep[l]] if name in METADATA
                               else old[..., keep[l], :]), (l, name)


def test_rewind_drops_question_tokens_written_by_the_model_and_restores_positions():
    cache = filled_cache()
    before = [layer_state(layer) for layer in cache.layers]
    mark = cache.mark()
    positions = cache.allocate_positions(4)  # a question: K/V through update, never described
    for layer in range(cache.num_layers):
        cache.update(torch.randn(1, H, 4, D), torch.randn(1, H, 4, D), layer)
    assert cache.layers[0].num_tokens == 10 and cache.layers[0].num_described == 6
    assert int(positions.max()) == cache.next_position - 1
    cache.rewind(mark)
    assert cache.next_position == mark.next_position
    for l, layer in enumerate(cache.layers):
        assert_same_state(layer.state_dict(), before[l])


def test_truncate_cuts_keys_and_metadata_together():
    cache = filled_cache()
    before = layer_state(cache.layers[1])
    cache.layers[1].truncate(4)
    for name, old in before.items():
        got = getattr(cache.layers[1], name)
        assert torch.equal(got, old[..., :4] if name in METADATA else old[..., :4, :]), name


@pytest.mark.parametrize("num_axes", [1, 3])
def test_state_dict_round_trip_gives_equal_tensors_and_metadata(num_axes):
    cache = filled_cache(num_axes=num_axes)
    cache.select_(torch.tensor([[0, 1, 2, 5]] * 3))  # ids with gaps
    cache.compactions = 2
    state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in cache.state_dict().items()}
    restored = HermesCache(small_config(), num_axes=num_axes)
    restored.load_state_dict(state)
    assert_same_state(restored.state_dict(), cache.state_dict())
    assert restored.new_token_ids(1).tolist() == cache.new_token_ids(1).tolist()  # ids are never reused
    with pytest.raises(ValueError, match="disagree in length"):
        broken = dict(state)
        broken["layers.0.counts"] = broken["layers.0.counts"][:-1]
        HermesCache(small_config(), num_axes=num_axes).load_state_dict(broken)


# ---- layer types hermes cannot manage ------------------------------------------------------------

def test_appends_equal_concatenation_through_room_regrowth_crops_and_selects(monkeypatch):
    """A layer's keys and values are what `torch.cat` of every update would give, whether an append
    fits the layer's buffer, outgrows it, follows a rewind or follows an eviction's `select`."""
    monkeypatch.setattr("hermes.cache.APPEND_HEADROOM_TOKENS", 3)  # small room: several regrowths
    gen = torch.Generator().manual_seed(1)
    layer, keys, values = HermesLayer(), None, None
    steps = [("add", 4), ("add", 1), ("add", 2), ("add", 1), ("crop", 3), ("add", 2), ("select", None),
             ("add", 5), ("add", 1), ("crop", 1), ("add", 3)]
    for op, n in steps:
        if op == "add":
            k, v = torch.randn(1, H, n, D, generator=gen), torch.randn(1, H, n, D, generator=gen)
            got_k, got_v = layer.update(k, v)
            keys = k if keys is None else torch.cat([keys, k], dim=-2)
            values = v if values is None else torch.cat([values, v], dim=-2)
            assert torch.equal(got_k, keys) and torch.equal(got_v, values)
        elif op == "crop":
            layer.crop(-n)
            keys, values = keys[..., :-n, :], values[..., :-n, :]
        else:
            keep = torch.tensor([0, 2, 3])
            layer.keys, layer.values = layer.keys.index_select(-2, keep), layer.values.index_select(-2, keep)
            layer._drop_room()  # as `select` does (this layer has no metadata to select with)
            keys, values = keys.index_select(-2, keep), values.index_select(-2, keep)
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)


def test_a_decode_step_writes_one_token_in_place_and_leaves_earlier_state_dicts_alone():
    cache = filled_cache(n=40)
    layer = cache.layers[0]
    state = {name: t.clone() for name, t in layer.state_dict().items()}
    held = layer.state_dict()  # views, as the Python API hands them out
    mark = cache.mark()
    first = None
    for step in range(5):  # a question's decode: one token per step, in every layer
        for l in range(cache.num_layers):
            cache.update(torch.randn(1, H, 1, D), torch.randn(1, H, 1, D), l)
        room = layer.keys._base  # the buffer the layer's keys view
        first = room if first is None else first
        assert room is first and layer.keys.shape[-2] == 41 + step  # no copy of the 40 held tokens
    cache.rewind(mark)
    cache.update(torch.randn(1, H, 3, D), torch.randn(1, H, 3, D), 0)  # the next chunk, in place again
    assert all(torch.equal(held[name], state[name]) for name in state)  # the earlier state is unchanged


def test_an_eviction_releases_the_layers_old_buffer():
    import weakref

    cache = filled_cache(n=10)
    old = weakref.ref(cache.layers[1].keys._base)
    cache.select_(torch.tensor([0, 1, 5, 6]).expand(cache.num_layers, -1))
    assert old() is None  # not kept alive beside the kept tokens
    cache.update(torch.randn(1, H, 2, D), torch.randn(1, H, 2, D), 1)
    assert cache.layers[1].keys.shape[-2] == 6


def test_a_sliding_window_model_config_is_refused_with_one_line():
    config = MistralConfig(num_hidden_layers=2, hidden_size=16, num_attention_heads=2, num_key_value_heads=2,
                           sliding_window=64)
    with pytest.raises(UnsupportedCacheError) as info:
        HermesCache(config)
    message = str(info.value)
    assert "\n" not in message and "sliding_attention" in message and "not supported" in message
    assert info.value.exit_code == EXIT_MODEL  # the CLI prints it on one line and exits 4 (model)


def test_a_hybrid_config_is_refused_even_if_one_layer_slides():
    config = Qwen2Config(num_hidden_layers=3, hidden_size=16, num_attention_heads=2, num_key_value_heads=2,
                         layer_types=["full_attention", "sliding_attention", "full_attention"], sliding_window=8)
    with pytest.raises(UnsupportedCacheError, match="sliding_attention"):
        HermesCache(config)


# ---- evictions: what maintain returns is what the lower levels get ------------------------------

def test_maintains_returned_evictions_are_what_the_lower_levels_receive(tiny_model, monkeypatch):
    memory = MemoryConfig(policy="hermes", budget=24, recall=True, compress_threshold=0.3)
    session = StreamingSession(tiny_model, memory, (), chunk_frames=2)
    returned, received, snapshots = [], [], []
    maintain, capture = session.memory.maintain, LowerLevels.capture

    def spy_maintain(cache, **kwargs):
        session.memory.settle_chunk(cache)  # what maintain does first: each layer's copy of the chunk at its positions
        snapshots.append([layer_state(layer) for layer in cache.layers])  # level 1 before the eviction
        returned.append(maintain(cache, **kwargs))
        return returned[-1]

    def spy_capture(self, evictions, frame_times_s):
        received.append(evictions)
        return capture(self, evictions, frame_times_s)

    stored = []
    add = session.lower.store.add
    monkeypatch.setattr(session.memory, "maintain", spy_maintain)
    monkeypatch.setattr(LowerLevels, "capture", spy_capture)
    monkeypatch.setattr(session.lower.store, "add", lambda record: (stored.append(record), add(record))[1])
    for start in range(0, 8, 2):
        session.ingest(random_frames(8)[start:start + 2])
    assert len(received) == len(returned) == 4 and all(a is b for a, b in zip(received, returned))
    evicting = [(e, s) for e, s in zip(returned, snapshots) if e.evicted]
    assert evicting, "budget 24 must evict within 4 chunks"
    for evictions, before in evicting:
        for l, (index, entries) in enumerate(zip(evictions.index, evictions.entries)):
            # the copies are exactly the evicted tokens as level 1 held them, and level 1 no longer does
            assert torch.equal(entries.keys, before[l]["keys"][0][:, index])
            assert torch.equal(entries.token_ids, before[l]["token_ids"][index])
            assert set(entries.token_ids.tolist()).isdisjoint(session.cache.layers[l].token_ids.tolist())
            assert (entries.kinds == KIND_VISUAL).all()
    assert len(stored) == len(evicting)  # one record per eviction, made of that eviction's tokens only
    for record, (evictions, _) in zip(stored, evicting):
        for layer, entries in zip(record.layers, evictions.entries):
            assert layer.num_tokens and set(layer.token_ids.tolist()) <= set(entries.token_ids.tolist())
            mine = torch.isin(entries.token_ids, layer.token_ids)
            assert torch.equal(layer.keys.to(entries.keys.dtype), entries.keys[:, mine])  # as evicted, not recomputed
    session.close()


# ---- the session's state dict ---------------------------------------------------------------------

MEMORY = MemoryConfig(policy="hermes", budget=24, accumulation="sum")  # a policy with state of its own


def outputs(session: StreamingSession, frames) -> list[torch.Tensor]:
    """What the next chunk and a question produce: every layer's tensors and metadata, and the logits."""
    session.ingest(frames)
    answer = session.ask("What is there?")
    state = session.state_dict()
    return [state[k] for k in sorted(state) if isinstance(state[k], torch.Tensor)] + [answer.first_token_logits]


def assert_same_outputs(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y)


def test_a_session_restored_from_its_state_dict_continues_identically(tiny_model):
    frames = random_frames(10)
    original = StreamingSession(tiny_model, MEMORY, (), chunk_frames=3)
    for start in (0, 3, 6):
        original.ingest(frames[start:start + 3])
    state = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in original.state_dict().items()}
    assert any(k.startswith("policy.running.") for k in state)  # the carried scores are in it
    restored = StreamingSession(tiny_model, MEMORY, (), chunk_frames=3)
    restored.load_state_dict(state)
    assert restored.encoded_t_s == original.encoded_t_s and restored.encoded_t_s is not original.encoded_t_s
    assert_same_outputs(outputs(restored, frames[9:]), outputs(original, frames[9:]))
    with pytest.raises(ValueError, match="memory policy 'hermes', not 'sliding'"):
        StreamingSession(tiny_model, MemoryConfig(policy="sliding", budget=24), ()).load_state_dict(state)


def _resumed(tiny_model, directory) -> StreamingSession:
    return StreamingSession(tiny_model, MEMORY, (), chunk_frames=3, memory_dir=directory, resume=True)


def test_a_checkpoint_of_state_format_1_resumes_like_format_2(tiny_model, tmp_path):
    frames = random_frames(10)
    session = StreamingSession(tiny_model, MEMORY, (), chunk_frames=3, memory_dir=tmp_path / "v2")
    for start in (0, 3, 6):
        session.ingest(frames[start:start + 3])
    session.close()
    shutil.copytree(tmp_path / "v2", tmp_path / "v1")
    # rewrite the copy's checkpoint in the layout of state format 1 (metadata stacked over layers,
    # keys.<l> / values.<l>, running.ids.<l>, the compaction count as "epoch")
    tensors, meta = load_checkpoint(tmp_path / "v1", CHECKPOINT)
    layers = sum(1 for k in tensors if k.startswith("cache.layers.") and k.endswith(".keys"))
    old = {"encoded_t_s": tensors["encoded_t_s"]}
    for l in range(layers):
        old[f"keys.{l}"], old[f"values.{l}"] = tensors[f"cache.layers.{l}.keys"], tensors[f"cache.layers.{l}.values"]
        if f"policy.running.{l}.ids" in tensors:
            old[f"running.ids.{l}"] = tensors[f"policy.running.{l}.ids"]
            old[f"running.scores.{l}"] = tensors[f"policy.running.{l}.scores"]
    for name in METADATA:
        old[f"meta.{name}"] = torch.stack([tensors[f"cache.layers.{l}.{name}"] for l in range(layers)])
    save_checkpoint(tmp_path / "v1", CHECKPOINT, old, {
        "next_position": meta["cache.next_position"], "next_token_id": meta["cache.next_token_id"],
        "block": meta["cache.block"], "epoch": meta["cache.compactions"], "policy": meta["policy"],
        "frames": meta["frames"], "store": meta["store"]})
    from_v1, from_v2 = _resumed(tiny_model, tmp_path / "v1"), _resumed(tiny_model, tmp_path / "v2")
    assert_same_outputs(outputs(from_v1, frames[9:]), outputs(from_v2, frames[9:]))
    from_v1.close()
    from_v2.close()


def test_a_checkpoint_of_a_later_state_format_is_refused_with_one_line(tiny_model, tmp_path):
    session = StreamingSession(tiny_model, MEMORY, (), chunk_frames=3, memory_dir=tmp_path / "mem")
    session.ingest(random_frames(3))
    session.close()
    tensors, meta = load_checkpoint(tmp_path / "mem", CHECKPOINT)
    save_checkpoint(tmp_path / "mem", CHECKPOINT, tensors, {**meta, "state_format": 99})
    with pytest.raises(UsageError, match="state format 99, newer than this version reads") as info:
        _resumed(tiny_model, tmp_path / "mem")
    assert "\n" not in str(info.value)
