"""Records and their stored forms: int8 error bound from the scales, exact fp16/fp32, safetensors codec."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from hermes.pipelines.bench.tiers import synthetic_record
from hermes.tiers.codec import encode_record, from_safetensors, safe_metadata, to_safetensors
from hermes.tiers.dram import DramStore
from hermes.tiers.records import Record, compress, identity, pack, packed_base, packed_fields, quantize_int8


def _ragged_record(rid=0, dtype=torch.float32, axes=1):
    """Layers of different lengths (one empty), a channel that is zero everywhere, outliers."""
    g = torch.Generator().manual_seed(rid)
    ns = [7, 0, 12, 3]
    keys = [torch.randn(2, n, 16, generator=g) * torch.linspace(0.1, 20, 16) for n in ns]  # per-channel range
    for k in keys:
        k[:, :, 3] = 0.0
    values = [torch.randn(2, n, 8, generator=g) for n in ns]
    return Record.build(rid, [k.to(dtype) for k in keys], [v.to(dtype) for v in values],
                        [torch.arange(n).expand(axes, n) for n in ns], [torch.arange(n) for n in ns],
                        [torch.zeros(n, dtype=torch.long) for n in ns], [torch.rand(n, generator=g) for n in ns],
                        t_start_s=1.0, t_end_s=2.0, frame_start=2, frame_end=4)


def test_int8_round_trip_through_dram_within_half_a_scale():
    original = _ragged_record()
    dram = DramStore(1 << 20, dtype="int8", pin_memory=False)
    dram.add(original)
    stored = dram.peek(0)
    back = dram.get(0)
    assert stored.storage == "int8" and back.storage == "fp32"
    for orig, st, got in zip(original.layers, stored.layers, back.layers):
        for name, scale in (("keys", st.key_scale), ("values", st.value_scale)):
            x, y = getattr(orig, name), getattr(got, name)
            assert y.shape == x.shape and y.dtype == torch.float32
            if x.numel():
                # the bound from the scales: half a quantisation step per (head, channel), + fp32 rounding
                assert bool(((x - y).abs() <= scale * (0.5 + 1e-5)).all())
                # and it is not vacuous: the scale is the channel's max |x| / 127
                assert torch.allclose(scale, x.abs().amax(dim=1, keepdim=True) / 127)
        assert torch.equal(got.keys[:, :, 3], torch.zeros_like(got.keys[:, :, 3]))  # zero channel exact
        for name in ("positions", "token_ids", "frame_index", "scores", "counts"):
            assert torch.equal(getattr(got, name), getattr(orig, name))
    def kv_bytes(r):
        return sum(t.numel() * t.element_size() for l in r.layers for t in (l.keys, l.values))

    assert 4 * kv_bytes(stored) == kv_bytes(original)  # int8 codes vs fp32
    scale_bytes = sum(l.key_scale.numel() * 4 + l.value_scale.numel() * 4 for l in stored.layers)
    assert stored.nbytes() == original.nbytes() - 3 * kv_bytes(stored) + scale_bytes  # nbytes is what is held


def test_fp16_storage_of_fp16_data_is_exact():
    original = _ragged_record(dtype=torch.float16)
    dram = DramStore(1 << 20, dtype="fp16", pin_memory=False)
    dram.add(original)
    back = dram.get(0)
    for orig, got in zip(original.layers, back.layers):
        assert got.keys.dtype == torch.float16  # the source dtype comes back by default
        assert torch.equal(got.keys, orig.keys) and torch.equal(got.values, orig.values)


def test_fp32_passthrough_is_exact_and_returns_a_copy():
    original = _ragged_record(dtype=torch.bfloat16)
    stored = compress(original, "fp32")
    back = stored.dequantize()
    for orig, got, st in zip(original.layers, back.layers, stored.layers):
        assert got.keys.dtype == torch.bfloat16 and torch.equal(got.keys, orig.keys)
        if st.keys.numel():
            got.keys.add_(1)  # the caller's copy: the stored record must not change
            assert not torch.equal(st.keys.to(torch.bfloat16), got.keys)



@pytest.mark.parametrize("storage", ["int8", "fp16"])
def test_kv_to_moves_the_stored_kv_in_one_copy_per_field_and_leaves_metadata_on_the_host(storage):
    """Recall moves records as stored and dequantizes on the device; the meta device stands in for a GPU
    (shapes and dtypes move, no data)."""
    record = pack(_ragged_record().compress(storage))
    assert record.kv_to("cpu") is record  # already there: nothing copied
    moved = record.kv_to("meta")
    for stored, there in zip(record.layers, moved.layers):
        for name in ("keys", "values") + (("key_scale", "value_scale") if storage == "int8" else ()):
            t = getattr(there, name)
            assert t.device.type == "meta" and t.dtype == getattr(stored, name).dtype
            assert t.shape == getattr(stored, name).shape
        assert there.positions is stored.positions and there.frame_index is stored.frame_index
    assert record.layers[0].keys.device.type == "cpu"  # the stored record is untouched
    assert moved.dequantize("meta").layers[2].keys.dtype == torch.float32

def test_quantize_int8_error_bound_on_adversarial_values():
    x = torch.tensor([[[1.0, -3.0], [0.5, 3.0], [-1.0, 1.5]]])  # (1, 3, 2); channel max 1.0 and 3.0
    codes, scale = quantize_int8(x)
    assert codes.dtype == torch.int8 and scale.shape == (1, 1, 2)
    assert codes.abs().max() == 127
    assert bool(((codes.float() * scale - x).abs() <= scale / 2 + 1e-7).all())


@pytest.mark.parametrize("storage", ["int8", "fp16", "fp32"])
@pytest.mark.parametrize("axes", [1, 3])
def test_codec_round_trip_is_exact(storage, axes):
    record = compress(_ragged_record(axes=axes), storage)
    record.extra = {"note": "kept"}
    for form in (record, pack(record)):  # loose per-layer tensors, and DRAM's packed buffers
        data = to_safetensors(form)
        assert set(st_load(data)) >= {"keys", "values", "offsets", "positions", "embedding"}  # plain safetensors
        back = from_safetensors(data)
        assert (back.record_id, back.t_start_s, back.frame_end, back.kind, back.extra) == (0, 1.0, 4, "full", {"note": "kept"})
        assert back.value == pytest.approx(record.value) and torch.equal(back.embedding, record.embedding)
        for a, b in zip(record.layers, back.layers):
            for name, t in a.tensors().items():
                assert torch.equal(getattr(b, name), t), name
        buffers, length = encode_record(form)
        assert length == len(data) == sum(len(memoryview(b).cast("B")) for b in buffers)


def test_pack_makes_one_buffer_per_field():
    record = synthetic_record(3, layers=5).compress("int8")
    assert packed_base([l.keys for l in record.layers]) is None
    packed = pack(record)
    base = packed_base([l.keys for l in packed.layers])
    assert base is not None and base.numel() == sum(l.keys.numel() for l in record.layers)
    for a, b in zip(record.layers, packed.layers):
        for name, t in a.tensors().items():
            assert torch.equal(getattr(b, name), t)


@pytest.mark.parametrize("storage", ["int8", "fp16", "fp32"])
@pytest.mark.parametrize("axes", [1, 3])
def test_a_packed_record_encodes_to_the_same_bytes_as_its_loose_layers(storage, axes):
    record = compress(_ragged_record(axes=axes), storage)
    packed = pack(record)
    assert packed_fields(record) is None and packed_fields(packed) is not None  # the writer's fast path is taken
    assert to_safetensors(packed) == to_safetensors(record)
    # a record made from a packed one with other layers must not reuse the packed buffers
    other = dataclasses.replace(packed, layers=packed.layers[:1])
    assert packed_fields(other) is None
    assert to_safetensors(other) == to_safetensors(dataclasses.replace(record, layers=record.layers[:1]))
    assert packed.nbytes() == record.nbytes() == sum(l.nbytes() for l in record.layers) + record.embedding.nbytes


def test_the_record_header_is_compact_json_of_the_safetensors_layout():
    data = to_safetensors(pack(synthetic_record(5, layers=3).compress("int8")))
    n = int.from_bytes(data[:8], "little")
    header = data[8:8 + n]
    parsed = json.loads(header)
    assert header.rstrip(b" ") == json.dumps(parsed, separators=(",", ":")).encode()  # formatted as json.dumps would
    assert n % 8 == 0 and list(parsed) == ["offsets", "positions", "token_ids", "frame_index", "counts", "key_scale",
                                           "value_scale", "scores", "embedding", "keys", "values", "__metadata__"]
    ends = [parsed[k]["data_offsets"] for k in list(parsed)[:-1]]
    assert ends[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ends, ends[1:])) and ends[-1][1] == len(data) - 8 - n
    # every tensor starts aligned for its dtype (what lets `pack` hold them in one buffer as typed views)
    size = {"I64": 8, "F32": 4, "I8": 1}
    assert all(parsed[k]["data_offsets"][0] % size[parsed[k]["dtype"]] == 0 for k in list(parsed)[:-1])


@pytest.mark.parametrize("storage", ["int8", "fp16", "fp32"])
def test_a_packed_record_is_its_file_in_two_buffers_and_files_in_another_order_read_back(storage):
    record = compress(_ragged_record(axes=3), storage)
    packed = pack(record)
    buffers, length = encode_record(packed)
    # the header, then every tensor's bytes from the one buffer `pack` made: one hash update, one iovec
    assert len(buffers) == 2 and length == len(to_safetensors(record))
    assert packed_base([l.keys for l in packed.layers]).data_ptr() == packed_fields(packed)["keys"].data_ptr()
    # records written before the aligned order (or by any safetensors writer) read back by their offsets
    tensors = st_load(to_safetensors(record))
    meta = {"hermes.record": safe_metadata(to_safetensors(record))["hermes.record"]}
    for order in (sorted(tensors), ["keys", "values", *[k for k in tensors if k not in ("keys", "values")]]):
        back = from_safetensors(st_save({k: tensors[k] for k in order}, metadata=meta))
        assert back.record_id == record.record_id and torch.equal(back.embedding, record.embedding)
        for a, b in zip(record.layers, back.layers):
            for name, t in a.tensors().items():
                assert torch.equal(getattr(b, name), t), name


@pytest.mark.parametrize("changes", [{}, {"value": float("nan"), "t_start_s": 3, "kind": "summary"},
                                     {"extra": {"note": 'q"\\é', "n": [1, 2.5]}, "value": float("-inf")},
                                     {"epoch": 3, "frames_seen": 48}])
def test_the_record_metadata_is_the_json_of_its_fields(changes):
    # the encoder formats the metadata itself; readers json.loads it, so it must be what json.dumps writes
    record = dataclasses.replace(pack(synthetic_record(5, layers=3, heads=2, head_dim=8).compress("int8")), **changes)
    expected = {"format": 2, "record_id": 5, "t_start_s": record.t_start_s, "t_end_s": record.t_end_s,
                "frame_start": record.frame_start, "frame_end": record.frame_end, "value": record.value,
                "source_dtype": record.source_dtype, "kind": record.kind, "num_layers": 3, "heads": 2,
                "head_dim": 8, "value_dim": 8, "epoch": record.epoch, "frames_seen": record.frames_seen,
                "extra": record.extra}
    assert safe_metadata(to_safetensors(record))["hermes.record"] == json.dumps(expected)


def test_records_of_one_tensor_layout_but_other_token_splits_decode_to_their_own_layers():
    # the encoder caches header entries per tensor layout; a split over layers is not part of it
    g = torch.Generator().manual_seed(0)

    def record(rid, ns):
        return pack(Record.build(rid, [torch.randn(2, n, 16, generator=g) for n in ns],
                                 [torch.randn(2, n, 16, generator=g) for n in ns],
                                 [torch.arange(n).expand(1, n) for n in ns], [torch.arange(n) for n in ns],
                                 [torch.zeros(n, dtype=torch.long) for n in ns], [torch.rand(n, generator=g) for n in ns],
                                 t_start_s=0.0, t_end_s=1.0, frame_start=0, frame_end=1).compress("int8"))

    splits = [[5, 3], [3, 5], [5, 3], [8, 0]]  # one total, so every tensor has the same shape
    records = [record(i, ns) for i, ns in enumerate(splits)]
    for rec, ns in zip(records, splits):
        back = from_safetensors(to_safetensors(rec))
        assert back.num_tokens() == ns
        for a, b in zip(rec.layers, back.layers):
            assert torch.equal(a.keys, b.keys) and torch.equal(a.token_ids, b.token_ids)


def test_a_record_without_layers_or_embedding_is_a_valid_file():
    empty = Record(record_id=9, t_start_s=0.0, t_end_s=1.0, frame_start=0, frame_end=2, layers=[])
    data = to_safetensors(empty)
    assert st_load(data) == {}
    back = from_safetensors(data)
    assert (back.record_id, back.layers, back.embedding, back.frame_end) == (9, [], None, 2)


def test_build_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match="layer 0"):
        Record.build(0, [torch.zeros(2, 3, 4)], [torch.zeros(2, 3, 4)], [torch.arange(2)], [torch.arange(3)],
                     [torch.arange(3)], [torch.zeros(3)], t_start_s=0, t_end_s=1, frame_start=0, frame_end=1)


def test_eviction_fields_round_trip_and_name_the_eviction():
    record = synthetic_record(4, layers=2, heads=2, head_dim=8)
    record.epoch, record.frames_seen, record.extra = 2, 32, {"note": "kept"}
    back = from_safetensors(to_safetensors(pack(record)))
    assert (back.epoch, back.frames_seen, back.extra) == (2, 32, {"note": "kept"})
    assert identity(back) == (record.frame_start, record.frame_end, 2, 32)
    plain = from_safetensors(to_safetensors(synthetic_record(5, layers=2, heads=2, head_dim=8)))
    assert (plain.epoch, plain.frames_seen, identity(plain)) == (0, None, None)  # no eviction made it


def test_a_record_written_with_the_eviction_in_extra_still_reads():
    # before `epoch` and `frames_seen` were fields, the eviction wrote them into `extra`
    data = to_safetensors(synthetic_record(6, layers=2, heads=2, head_dim=8))
    meta = json.loads(safe_metadata(data)["hermes.record"])
    del meta["epoch"], meta["frames_seen"]
    meta["extra"] = {"epoch": 1, "frames_seen": 48, "note": "kept"}
    old = st_save(st_load(data), metadata={"hermes.record": json.dumps(meta)})
    back = from_safetensors(old)
    assert (back.epoch, back.frames_seen, back.extra) == (1, 48, {"note": "kept"})
    assert identity(back) == (back.frame_start, back.frame_end, 1, 48)
