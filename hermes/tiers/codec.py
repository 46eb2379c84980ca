"""A record's bytes: one complete safetensors file per record, encoded as buffers without copies
(docs/ARCHITECTURE.md, Memory, "Record files"); ``safetensors.torch.load`` validates what it reads."""

from __future__ import annotations

import json
from functools import lru_cache

import torch
from safetensors.torch import load as load_bytes

from hermes.tiers.manifest import json_scalar
from hermes.tiers.records import FILE_ORDER, RECORD_FIELDS, LayerTokens, Record, packed_base, packed_fields, packed_file

RECORD_FORMAT = 2
_META_KEY = "hermes.record"
_ST_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
              torch.int8: "I8", torch.uint8: "U8", torch.int16: "I16", torch.int32: "I32", torch.int64: "I64",
              torch.bool: "BOOL"}


def _entry(name: str, dtype: torch.dtype, shape: tuple[int, ...], start: int, end: int) -> str:
    """One tensor's header entry, as ``json.dumps(..., separators=(",", ":"))`` writes it."""
    dims = ",".join(map(str, shape))
    return f'"{name}":{{"dtype":"{_ST_DTYPES[dtype]}","shape":[{dims}],"data_offsets":[{start},{end}]}}'


@lru_cache(maxsize=256)
def _tensor_entries(layout: tuple[tuple[str, torch.dtype, tuple[int, ...], int], ...]) -> tuple[str, int]:
    """The header's tensor entries for ``(name, dtype, shape, nbytes)`` in file order, and the bytes they
    cover. Cached: formatting eleven entries per record cost as much as writing its bytes.
    """
    entries, offset = [], 0
    for name, dtype, shape, size in layout:
        entries.append(_entry(name, dtype, shape, offset, offset + size))
        offset += size
    return ",".join(entries), offset


@lru_cache(maxsize=256)
def _offsets(ends: tuple[int, ...]) -> torch.Tensor:
    """The ``offsets`` tensor of a split of tokens over layers (cached; never written to)."""
    return torch.tensor(ends, dtype=torch.long)


def _meta_json(record: Record, num_layers: int, heads: int, head_dim: int, value_dim: int) -> str:
    """The record's scalar fields as ``json.dumps`` writes their dict (a test holds the two equal),
    formatted directly: the encoder's setup cost more than the text.
    """
    j = json_scalar
    extra = json.dumps(record.extra) if record.extra else "{}"
    seen = record.frames_seen
    return (f'{{"format": {RECORD_FORMAT}, "record_id": {j(record.record_id)}, "t_start_s": {j(record.t_start_s)}, '
            f'"t_end_s": {j(record.t_end_s)}, "frame_start": {j(record.frame_start)}, '
            f'"frame_end": {j(record.frame_end)}, "value": {j(record.value)}, '
            f'{_meta_shape(record.source_dtype, record.kind, num_layers, heads, head_dim, value_dim)}, '
            f'"epoch": {j(record.epoch)}, "frames_seen": {"null" if seen is None else j(seen)}, "extra": {extra}}}')


@lru_cache(maxsize=256)
def _meta_shape(source_dtype: str, kind: str, num_layers: int, heads: int, head_dim: int, value_dim: int) -> str:
    """The metadata fields a stream's records share (cached: a handful of combinations per stream)."""
    j = json_scalar
    return (f'"source_dtype": {j(source_dtype)}, "kind": {j(kind)}, "num_layers": {j(num_layers)}, '
            f'"heads": {j(heads)}, "head_dim": {j(head_dim)}, "value_dim": {j(value_dim)}')


def _one_buffer(record: Record, packed: dict | None, name: str, join, shape: tuple[int, ...]) -> torch.Tensor:
    """Field `name` of every layer as one host tensor of `shape`: `pack`'s buffer, the span the layers
    view, or `join`ed."""
    if packed is not None:  # `pack` left it in one buffer: no per-layer checks
        return packed[name]
    pieces = [getattr(layer, name) for layer in record.layers]
    base = packed_base(pieces)  # e.g. a record read back from disk: views of one loaded buffer
    return base.view(shape) if base is not None else join(pieces)


def _file_tensors(record: Record) -> list[tuple[str, torch.Tensor, tuple[int, ...]]]:
    """(name, one contiguous host tensor, header shape) per stored tensor, in `FILE_ORDER`."""
    layers = record.layers
    out = {}
    if layers:
        first = layers[0]
        ends, total = [0], 0
        for layer in layers:
            total += layer.keys.shape[-2]
            ends.append(total)
        packed = packed_fields(record)
        out["offsets"] = _offsets(tuple(ends)), (len(layers) + 1,)
        for name in ("keys", "values"):
            t = _one_buffer(record, packed, name, lambda ps: torch.cat([p.detach().to("cpu").reshape(-1) for p in ps]),
                            (-1,))
            out[name] = t, (t.numel(),)
        if first.key_scale is not None:
            for name in ("key_scale", "value_scale"):
                shape = (len(layers), *getattr(first, name).shape)
                t = _one_buffer(record, packed, name, torch.stack, shape)
                if t.dtype != torch.float32 or not t.is_cpu:  # `pack`'s are already: skip the call
                    t = t.to("cpu", torch.float32)
                out[name] = t, shape
        for name in RECORD_FIELDS:  # metadata is on the host already; one cat per field
            shape = (*getattr(first, name).shape[:-1], total)
            t = _one_buffer(record, packed, name, lambda ps: torch.cat(ps, dim=-1), shape)
            out[name] = t, shape
    if record.embedding is not None:
        emb = record.embedding.detach().to("cpu", torch.float32).contiguous()
        out["embedding"] = emb, tuple(emb.shape)
    return [(name, *out[name]) for name in FILE_ORDER if name in out]


def encode_record(record: Record) -> tuple[list[memoryview | bytes], int]:
    """The safetensors file of a record as buffers to write back to back.

    Returns:
        ``(buffers, total length in bytes)``; the buffers view the record's own host tensors (or
        small new ones), so the record must stay alive and unmodified until they are written.
    """
    # terse because per-tensor Python work here once cost several times the write of a ~23 KB record
    whole = packed_file(record)
    if whole is not None:
        layout, buffers = whole.layout, [memoryview(whole.data.numpy())]
        num_layers, h, d, dv = len(whole.tokens), whole.heads, whole.head_dim, whole.value_dim
    else:
        layout, buffers = _tensor_buffers(_file_tensors(record))
        num_layers = len(record.layers)
        if record.layers:
            first = record.layers[0]
            h, d, dv = first.keys.shape[0], first.keys.shape[-1], first.values.shape[-1]
        else:
            h = d = dv = 0
    metadata = f'"__metadata__":{{"{_META_KEY}":{json.dumps(_meta_json(record, num_layers, h, d, dv))}}}'
    return _with_header(layout, buffers, metadata)


def _tensor_buffers(named) -> tuple[tuple, list[memoryview]]:
    """(layout, buffers) of ``(name, tensor, shape)`` items: the header's ``(name, dtype, shape, nbytes)`` and
    each non-empty tensor's bytes, viewed (copied only where not contiguous)."""
    layout, buffers = [], []
    for name, t, shape in named:
        size = t.nbytes
        if size:
            flat = t if t.is_contiguous() else t.contiguous()  # a C-contiguous buffer is flat bytes
            buffers.append(memoryview((flat.view(torch.int16) if t.dtype == torch.bfloat16 else flat).numpy()))
        layout.append((name, t.dtype, shape, size))
    return tuple(layout), buffers


def _with_header(layout: tuple, buffers: list, metadata: str = "") -> tuple[list[memoryview | bytes], int]:
    """``(buffers, total length)`` of the file: the header (tensor entries, then `metadata`, a JSON member) first."""
    tensor_entries, offset = _tensor_entries(layout)
    head = ("{" + ",".join(part for part in (tensor_entries, metadata) if part) + "}").encode()
    head += b" " * (-len(head) % 8)  # data starts 8-byte aligned, as the reference writer does
    prefix = len(head).to_bytes(8, "little") + head
    return [prefix, *buffers], len(prefix) + offset


def tensors_to_safetensors(tensors: dict[str, torch.Tensor]) -> bytes:
    """Host tensors as one safetensors file, written as records are: `safetensors.torch.save` makes a ctypes
    array type for each byte length it meets, which ctypes keeps for the life of the process (5.6 KB each),
    and a stream's checkpoints grow by its frame times at every save (`bench day` saw the heap creep)."""
    buffers, _ = _with_header(*_tensor_buffers((name, t, tuple(t.shape)) for name, t in tensors.items()))
    return b"".join(buffers)


def to_safetensors(record: Record) -> bytes:
    """The record's safetensors file as one bytes object (see `encode_record`)."""
    buffers, _ = encode_record(record)
    return b"".join(buffers)


def from_safetensors(data: bytes) -> Record:
    """Parse a record's safetensors file (checksum it first: this trusts its structure).

    Raises:
        ValueError: Not a record of this format (bad header, missing tensors, sizes that disagree).
    """
    try:
        meta = json.loads(safe_metadata(data)[_META_KEY])
        tensors = load_bytes(data)
    except Exception as exc:  # safetensors raises its own error type on malformed files
        raise ValueError(f"not a hermes record: {exc}") from exc
    if meta.get("format") != RECORD_FORMAT:
        raise ValueError(f"record format {meta.get('format')!r}; this version reads {RECORD_FORMAT}")
    num_layers, h, d, dv = (int(meta[k]) for k in ("num_layers", "heads", "head_dim", "value_dim"))
    layers = []
    if num_layers:
        needed = ("keys", "values", "offsets") + RECORD_FIELDS
        if any(n not in tensors for n in needed) or tensors["offsets"].shape != (num_layers + 1,):
            raise ValueError(f"record {meta['record_id']}: missing tensors or bad offsets")
        offsets = tensors["offsets"].tolist()
        total = offsets[-1]
        if tensors["keys"].numel() != h * total * d or tensors["values"].numel() != h * total * dv:
            raise ValueError(f"record {meta['record_id']}: key/value sizes disagree with the offsets")
        for l in range(num_layers):
            lo, n = offsets[l], offsets[l + 1] - offsets[l]
            got = {name: tensors[name].narrow(-1, lo, n) for name in RECORD_FIELDS}
            got["keys"] = tensors["keys"].narrow(0, h * lo * d, h * n * d).view(h, n, d)
            got["values"] = tensors["values"].narrow(0, h * lo * dv, h * n * dv).view(h, n, dv)
            if "key_scale" in tensors:
                got["key_scale"], got["value_scale"] = tensors["key_scale"][l], tensors["value_scale"][l]
            layers.append(LayerTokens(**got))
    return Record(record_id=int(meta["record_id"]), t_start_s=float(meta["t_start_s"]),
                  t_end_s=float(meta["t_end_s"]), frame_start=int(meta["frame_start"]),
                  frame_end=int(meta["frame_end"]), layers=layers, value=float(meta["value"]),
                  embedding=tensors.get("embedding"), source_dtype=str(meta["source_dtype"]),
                  kind=str(meta["kind"]), **_eviction_fields(meta))


def _eviction_fields(meta: dict) -> dict:
    """``epoch``, ``frames_seen`` and ``extra`` of a record's metadata. Records written before the two were
    fields kept them in ``extra``: read from there (and taken out of it) when the metadata lacks them."""
    extra = dict(meta.get("extra") or {})
    old = {name: extra.pop(name) for name in ("epoch", "frames_seen") if name in extra}
    epoch, seen = meta.get("epoch", old.get("epoch", 0)), meta.get("frames_seen", old.get("frames_seen"))
    return {"epoch": epoch if type(epoch) is int else 0, "frames_seen": seen if type(seen) is int else None,
            "extra": extra}


def safe_metadata(data: bytes) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file, from its JSON header alone."""
    if len(data) < 8:
        raise ValueError("shorter than a safetensors header")
    n = int.from_bytes(data[:8], "little")
    if n > len(data) - 8:
        raise ValueError("safetensors header runs past the end")
    return json.loads(data[8:8 + n]).get("__metadata__") or {}


def scan_segment(data: bytes, known: dict[int, int] | None = None) -> tuple[list[tuple[int, int, object]], int]:
    """The records a segment's bytes hold from its start, ``([(offset, length, record or None)], end)``,
    `end` the byte after the last record read.

    Args:
        known: ``{offset: length}`` the old manifest names: bytes there that do not parse are stepped
            over (as a record None) instead of ending the scan.
    """
    found, pos = [], 0
    known = known or {}
    while pos + 8 <= len(data):
        n = int.from_bytes(data[pos:pos + 8], "little")
        try:
            header = json.loads(data[pos + 8:pos + 8 + n])
            length = 8 + n + max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"),
                                 default=0)
            if pos + length > len(data):
                raise ValueError("runs past the end")
            record = from_safetensors(data[pos:pos + length])
        except (ValueError, KeyError, TypeError, AttributeError, IndexError):
            if pos in known and pos + known[pos] <= len(data):
                found.append((pos, known[pos], None))
                pos += known[pos]
                continue
            break
        found.append((pos, length, record))
        pos += length
    return found, pos
