"""A record: what a lower memory level keeps for one chunk's evicted tokens, and its compressed forms.

When level 1 evicts tokens of a chunk that are still worth keeping, they become one `Record`: for
every layer l the evicted keys and values (layers keep different tokens, so each layer has its own
count n_l), each token's original rotary positions, stable id, frame, importance score and count
(how many original tokens it stands for: 1, or more for a summary token), plus what the lower
levels need to manage it: an id, the time span, a `value` (importance, used to choose which record
leaves DRAM first) and an `embedding` used to find it again for a question.

Keys and values can be stored three ways (`compress`):

- ``int8``: per-channel symmetric quantisation. For each (layer, head, channel) the scale is
  ``s = max_t |x[t]| / 127`` over the layer's tokens and the code ``q = round(x / s)`` in
  [-127, 127]; dequantised ``x' = q * s``. Rounding to the nearest code bounds the error:
  ``|x - x'| <= s / 2`` per channel (plus fp32 rounding of the product, below ``1e-5 * s``). A
  channel that is zero everywhere gets ``s = 0`` and is restored exactly. Per channel rather than
  per token because key outliers live in fixed channels (KIVI, arXiv 2402.02750), so one scale per
  channel wastes the fewest codes. About 4x smaller than fp32, 2x smaller than fp16/bf16.
- ``fp16``: a cast; exact for fp16 data, about 1e-3 relative for fp32/bf16 data in range.
- ``fp32``: lossless for fp32, fp16 and bf16 data (the passthrough).

`Record.dequantize` brings any form back to floating point (by default the dtype the keys had
when the record was built) on any device; metadata always stays on the host.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

STORAGES = ("int8", "fp16", "fp32")
_FLOAT = {"fp16": torch.float16, "fp32": torch.float32}
_QMAX = 127.0  # symmetric int8 range [-127, 127]; -128 is unused so that 0 stays exact
_DTYPE_NAMES = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
# What a record keeps per token besides key and value, in the order of the record file's tensors
# (level 1's `hermes.cache.METADATA`, less the kind, plus the importance score)
RECORD_FIELDS = ("positions", "token_ids", "frame_index", "scores", "counts")


@dataclass
class LayerTokens:
    """One layer's tokens of a record, in time order.

    Attributes:
        keys: (H, n, D) keys as cached (already rotated at `positions`): float, or int8 codes.
        values: (H, n, Dv) values: float, or int8 codes.
        positions: (A, n) int64 rotary positions the keys are rotated at (A = 1 for 1-D RoPE,
            3 for M-RoPE).
        token_ids: (n,) int64 stable token ids (as in level 1; -1 for a record's mean token).
        frame_index: (n,) int64 frame each token came from (-1 for summary tokens).
        scores: (n,) float32 importance of each token when it was evicted.
        counts: (n,) int64 original tokens each entry stands for (1, or more for summaries).
        key_scale: (H, 1, D) float32 int8 scales of the keys; None unless int8.
        value_scale: (H, 1, Dv) float32 int8 scales of the values; None unless int8.
    """

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    token_ids: torch.Tensor
    frame_index: torch.Tensor
    scores: torch.Tensor
    counts: torch.Tensor
    key_scale: torch.Tensor | None = None
    value_scale: torch.Tensor | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.keys.shape[-2])

    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of the layer by field name (scales only when present)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {k: v for k, v in out.items() if v is not None}

    def nbytes(self) -> int:
        return sum(t.nbytes for t in (self.keys, self.values, self.positions, self.token_ids,
                   self.frame_index, self.scores, self.counts, self.key_scale, self.value_scale) if t is not None)

    def scale(self, field: str) -> torch.Tensor | None:
        """(H, 1, D) the int8 scales of `field` ("keys" or "values"); None unless int8."""
        return self.key_scale if field == "keys" else self.value_scale

    def dequantized(self, field: str) -> torch.Tensor:
        """(H, n, D) float32 keys or values, on their device (int8 codes times their scales)."""
        rows, scale = getattr(self, field), self.scale(field)
        return torch.mul(rows, scale) if scale is not None else rows.float()  # int8 times float32 is float32


@dataclass
class Record:
    """One chunk's evicted tokens in every layer, as stored by level 2 or 3.

    Attributes:
        record_id: Unique id, increasing in creation order.
        t_start_s: Timestamp (seconds) of the chunk's first frame.
        t_end_s: Timestamp (seconds) of the chunk's last frame.
        frame_start: Index of the chunk's first sampled frame.
        frame_end: Index one past the chunk's last sampled frame (half-open range).
        layers: One `LayerTokens` per decoder layer (each may hold a different number of tokens).
        value: Importance of the whole record; the least valuable leaves DRAM first.
        embedding: (E,) float32 vector that a question's vector is compared with; None if unset.
        source_dtype: Name of the float dtype the keys had when built ("float32", "bfloat16", ...);
            `dequantize` returns that dtype by default.
        kind: "full" (every evicted token) or "summary" (anchors plus a mean, see `summarise`).
        epoch: Level 1's position epoch (its compaction count) when the eviction ran: a record of an
            older epoch is shifted when recalled.
        frames_seen: Frames encoded when the eviction ran, which names the eviction in its stream (see
            `identity`); None for a record no eviction made (a tool's, a benchmark's).
        extra: Small JSON-able notes the caller wants kept.
    """

    record_id: int
    t_start_s: float
    t_end_s: float
    frame_start: int
    frame_end: int
    layers: list[LayerTokens]
    value: float = 0.0
    embedding: torch.Tensor | None = None
    source_dtype: str = "float32"
    kind: str = "full"
    epoch: int = 0
    frames_seen: int | None = None
    extra: dict = field(default_factory=dict)

    # ---- construction ------------------------------------------------------------------------

    @classmethod
    def build(
        cls,
        record_id: int,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        positions: list[torch.Tensor],
        token_ids: list[torch.Tensor],
        frame_index: list[torch.Tensor],
        scores: list[torch.Tensor],
        counts: list[torch.Tensor] | None = None,
        *,
        t_start_s: float,
        t_end_s: float,
        frame_start: int,
        frame_end: int,
        value: float | None = None,
        embedding: torch.Tensor | None = None,
        kind: str = "full",
    ) -> Record:
        """Validate per-layer tensors and make an uncompressed record (K/V kept in their dtype).

        Args:
            record_id: Unique id.
            keys: Per layer l, (H, n_l, D) rotated keys (any device, float dtype).
            values: Per layer, (H, n_l, Dv) values.
            positions: Per layer, (n_l,) or (A, n_l) integer positions.
            token_ids: Per layer, (n_l,) token ids.
            frame_index: Per layer, (n_l,) frame indices.
            scores: Per layer, (n_l,) importance scores.
            counts: Per layer, (n_l,) counts; default all ones.
            t_start_s: Time of the chunk's first frame, seconds.
            t_end_s: Time of the chunk's last frame, seconds.
            frame_start: First frame index.
            frame_end: One past the last frame index.
            value: Record importance; default the count-weighted mean score over all layers.
            embedding: (E,) search vector; default `default_embedding` of the record.
            kind: "full" or "summary".

        Returns:
            The record; metadata moved to the host, keys and values left where they are.

        Raises:
            ValueError: Layer lists of different lengths or per-layer shapes that disagree.
        """
        num = len(keys)
        lists = [values, positions, token_ids, frame_index, scores] + ([counts] if counts is not None else [])
        if any(len(x) != num for x in lists):
            raise ValueError(f"every per-layer list needs {num} entries (one per layer)")
        layers = []
        for l in range(num):
            k, v = keys[l], values[l]
            n = k.shape[-2] if k.dim() == 3 else -1
            pos = positions[l].reshape(1, -1) if positions[l].dim() == 1 else positions[l]
            cnt = counts[l] if counts is not None else torch.ones(max(n, 0), dtype=torch.long)
            meta = (token_ids[l], frame_index[l], scores[l], cnt)
            if (k.dim() != 3 or v.dim() != 3 or v.shape[:2] != k.shape[:2] or pos.dim() != 2
                    or pos.shape[1] != n or any(m.shape != (n,) for m in meta)):
                raise ValueError(
                    f"layer {l}: keys {tuple(k.shape)} and values {tuple(v.shape)} must be (H, n, D) with "
                    f"positions (A, n) and ids/frames/scores/counts (n,); got positions {tuple(pos.shape)}, "
                    f"others {[tuple(m.shape) for m in meta]}")
            def cpu(t: torch.Tensor, dt: torch.dtype) -> torch.Tensor:
                return t.detach().to("cpu", dt).contiguous()
            layers.append(LayerTokens(
                keys=k.detach(), values=v.detach(), positions=cpu(pos, torch.long),
                token_ids=cpu(token_ids[l], torch.long), frame_index=cpu(frame_index[l], torch.long),
                scores=cpu(scores[l], torch.float32), counts=cpu(cnt, torch.long)))
        source = _DTYPE_NAMES.get(keys[0].dtype, "float32") if num else "float32"
        rec = cls(record_id=int(record_id), t_start_s=float(t_start_s), t_end_s=float(t_end_s),
                  frame_start=int(frame_start), frame_end=int(frame_end), layers=layers,
                  source_dtype=source, kind=kind)
        rec.value = float(value) if value is not None else mean_score(rec)
        rec.embedding = (embedding.detach().to("cpu", torch.float32).reshape(-1).contiguous()
                         if embedding is not None else default_embedding(rec))
        return rec

    # ---- properties ------------------------------------------------------------------------------

    @property
    def storage(self) -> str:
        """How K/V are held: "int8", "fp16", "fp32" (or "bf16" for an uncompressed bf16 record)."""
        if not self.layers or self.layers[0].key_scale is not None:
            return "int8" if self.layers else "fp32"
        return {torch.float16: "fp16", torch.float32: "fp32", torch.bfloat16: "bf16"}.get(
            self.layers[0].keys.dtype, str(self.layers[0].keys.dtype))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def num_tokens(self) -> list[int]:
        """n_l of every layer."""
        whole = packed_file(self)
        if whole is not None:
            return list(whole.tokens)
        return [layer.num_tokens for layer in self.layers]

    def nbytes(self) -> int:
        """Bytes of every tensor in its stored form (K/V, scales, metadata, embedding)."""
        whole = packed_file(self)
        if whole is not None:  # every tensor in one buffer with the file's offsets: the rest is the sum
            return whole.data.numel() - whole.layout[0][3]
        emb = self.embedding.numel() * 4 if self.embedding is not None else 0
        packed = packed_fields(self)
        if packed is not None:  # one buffer per field: the same sum without a pass over every layer
            return sum(t.nbytes for t in packed.values()) + emb
        return sum(layer.nbytes() for layer in self.layers) + emb

    # ---- conversions -------------------------------------------------------------------------------

    def compress(self, storage: str) -> Record:
        """This record with K/V in `storage` form (see module docstring); see `compress`."""
        return compress(self, storage)

    def kv_to(self, device: torch.device | str, non_blocking: bool = False) -> Record:
        """This record with K/V (and int8 scales) on `device` as stored: one copy per field of a packed
        record (`to_device`), int8 codes a quarter of fp32's bytes on the link; metadata stays on the host.
        From pinned host memory the copies can be non-blocking; later work on the same CUDA stream is
        ordered after them. Returns this record itself where its K/V are on `device` already.
        """
        if not self.layers or self.layers[0].keys.device == torch.device(device):
            return self
        names = ("keys", "values") + (("key_scale", "value_scale") if self.storage == "int8" else ())
        moved = {name: to_device([getattr(l, name) for l in self.layers], device, non_blocking) for name in names}
        return dataclasses.replace(self, layers=[dataclasses.replace(l, **{name: moved[name][i] for name in names})
                                                 for i, l in enumerate(self.layers)])

    def dequantize(self, device: torch.device | str = "cpu", dtype: torch.dtype | None = None,
                   non_blocking: bool = False) -> Record:
        """A floating-point copy of this record with K/V on `device`: copied there as stored (`kv_to`),
        then multiplied there.

        Args:
            device: Where keys and values should live.
            dtype: Their dtype; default the record's `source_dtype`.
            non_blocking: Ask for asynchronous host-to-device copies.

        Returns:
            A new record (never sharing K/V storage with this one); metadata stays on the host.
        """
        dtype = dtype or getattr(torch, self.source_dtype)
        layers = self.kv_to(device, non_blocking).layers
        if self.storage == "int8":
            keys = [l.dequantized("keys").to(dtype) for l in layers]
            values = [l.dequantized("values").to(dtype) for l in layers]
        else:
            # same device and dtype: .to() returns the tensor itself, and the caller must not get our storage
            def fresh(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
                return new.clone() if new.data_ptr() == old.data_ptr() else new

            keys = [fresh(l.keys.to(dtype), old.keys) for l, old in zip(layers, self.layers)]
            values = [fresh(l.values.to(dtype), old.values) for l, old in zip(layers, self.layers)]
        layers = [dataclasses.replace(l, keys=k, values=v, key_scale=None, value_scale=None)
                  for l, k, v in zip(self.layers, keys, values)]
        return dataclasses.replace(self, layers=layers)


def identity(record: Record) -> tuple[int, int, int, int] | None:
    """What makes a record the same eviction as another in one stream, whatever id it was given.

    A stream evicts at most once per chunk, and a chunk is named by how many frames were encoded
    when its eviction ran (`Record.frames_seen`); re-encoding the same frames after a resume
    evicts the same tokens again, under the same position epoch (`Record.epoch`, level 1's
    compaction count), over the same frame span. A record stored twice (a commit replayed after a
    crash) has the same identity under two ids.

    Returns:
        ``(frame_start, frame_end, epoch, frames_seen)``, or None for a record that does not say which
        eviction made it (no ``frames_seen``: written by a tool, a benchmark or an older version).
    """
    if record.frames_seen is None:
        return None
    return int(record.frame_start), int(record.frame_end), record.epoch, record.frames_seen


def compress(record: Record, storage: str) -> Record:
    """Convert a record's K/V to `storage`: "int8" (per-channel symmetric), "fp16" or "fp32".

    Works on whatever device the K/V are on (quantise on the GPU, then copy the small codes).
    Converting an int8 record to another form dequantises first; int8 to int8 is a no-op.

    Args:
        record: Any record.
        storage: One of `STORAGES`.

    Returns:
        A new record (metadata shared, K/V new) in that form.

    Raises:
        ValueError: Unknown storage name.
    """
    if storage not in STORAGES:
        raise ValueError(f"storage must be one of {STORAGES}, got {storage!r}")
    if record.storage == storage:
        return record
    src = record if record.storage != "int8" else record.dequantize(record.layers[0].keys.device, torch.float32)
    layers = []
    for layer in src.layers:
        if storage == "int8":
            kq, ks = quantize_int8(layer.keys)
            vq, vs = quantize_int8(layer.values)
            layers.append(dataclasses.replace(layer, keys=kq, values=vq, key_scale=ks, value_scale=vs))
        else:
            dt = _FLOAT[storage]
            layers.append(dataclasses.replace(layer, keys=layer.keys.to(dt), values=layer.values.to(dt),
                                              key_scale=None, value_scale=None))
    return dataclasses.replace(record, layers=layers)


def quantize_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-channel symmetric int8 codes of ``x (H, n, D)``, scale over the n tokens.

    Returns:
        ``(codes (H, n, D) int8, scale (H, 1, D) float32)`` with ``x ~= codes * scale`` and
        ``|x - codes * scale| <= scale / 2``.
    """
    xf = x.float()
    if xf.shape[-2] == 0:
        return xf.to(torch.int8), torch.zeros(xf.shape[0], 1, xf.shape[-1], dtype=torch.float32, device=x.device)
    scale = xf.abs().amax(dim=-2, keepdim=True) / _QMAX  # (H, 1, D)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero channel codes to 0
    codes = torch.round(xf / safe).clamp_(-_QMAX, _QMAX).to(torch.int8)
    return codes, scale


def mean_score(record: Record) -> float:
    """Count-weighted mean importance over every token of every layer (0 for an empty record)."""
    num = sum(float((layer.scores.double() * layer.counts).sum()) for layer in record.layers)
    den = sum(float(layer.counts.sum()) for layer in record.layers)
    return num / den if den > 0 else 0.0


def default_embedding(record: Record) -> torch.Tensor:
    """A search vector when the caller gives none: the last layer's count-weighted mean key.

    Flattened over heads to (H * D,), float32, on the host. Keys (not values) because a question's
    query vectors are compared with keys by attention itself (ReKV, arXiv 2503.00540, retrieves
    by the same inner product). Empty records get a zero vector.
    """
    if not record.layers:
        return torch.zeros(0)
    layer = record.layers[-1]
    keys = layer.keys.float() * (layer.key_scale if layer.key_scale is not None else 1.0)
    if keys.shape[-2] == 0:
        return torch.zeros(keys.shape[0] * keys.shape[-1])
    w = (layer.counts.float() / layer.counts.float().sum()).to(keys.device)  # (n,)
    return (keys * w[None, :, None]).sum(dim=-2).reshape(-1).to("cpu", torch.float32).contiguous()


# ---- packing: one buffer per record ------------------------------------------------------------------

# The order of a record file's tensors (`hermes.tiers.codec`): 8-byte fields, then 4-byte ones, then keys
# and values, so that every tensor starts aligned for its dtype (the order the safetensors reference
# writer chooses for the same reason) and `pack` can hold them all in one byte buffer as typed views.
# ``offsets`` is the file's split of tokens over layers (not a field of the layers).
FILE_ORDER = ("offsets", "positions", "token_ids", "frame_index", "counts", "key_scale", "value_scale", "scores",
              "embedding", "keys", "values")
_FLAT = ("keys", "values")  # packed flat: (sum of numel,), each layer a contiguous block
_SCALES = ("key_scale", "value_scale")  # packed stacked: (L, H, 1, D)


@dataclass(frozen=True)
class PackedFile:
    """A packed record's tensors as one host byte buffer, in `FILE_ORDER`: what `codec.encode_record`
    writes after the header. ``layout`` is ``(name, dtype, shape, nbytes)`` per tensor, in order.
    The shapes the writers name per record are kept beside it, so that writing a record reads this
    and the record's scalars, not every layer's tensors (a writer meets each record once, cold)."""

    data: torch.Tensor  # (bytes,) uint8, contiguous
    layout: tuple[tuple[str, torch.dtype, tuple[int, ...], int], ...]
    tokens: tuple[int, ...]  # n_l per layer
    heads: int  # H
    head_dim: int  # D
    value_dim: int  # Dv


def pack(record: Record, pin_memory: bool = False) -> Record:
    """The record with all its tensors in one contiguous host buffer (layers and embedding become views).

    Why: one host allocation per record instead of one per layer and field (page-locked allocations
    are slow, one per call); one buffer per field for copies back to the device (`to_device`); and
    the record file's tensor bytes back to back, which the disk and S3 writers checksum and write as
    one buffer (`codec.encode_record`, `packed_file`).

    Args:
        record: Any record, K/V on any device.
        pin_memory: Allocate the buffer in page-locked memory (needs CUDA).

    Returns:
        An equal record whose tensors are all on the host.
    """
    if not record.layers:
        return record
    layers = record.layers
    ends = [0]
    for layer in layers:
        ends.append(ends[-1] + layer.num_tokens)
    sources: dict[str, list[torch.Tensor] | torch.Tensor] = {"offsets": torch.tensor(ends, dtype=torch.long)}
    for name in FILE_ORDER:
        if name == "embedding":
            if record.embedding is not None:
                sources[name] = record.embedding.detach().reshape(-1)
        elif name != "offsets" and (name not in _SCALES or layers[0].key_scale is not None):
            sources[name] = [getattr(l, name) for l in layers]
    layout = []
    for name, src in sources.items():
        if isinstance(src, torch.Tensor):
            dtype, shape = (torch.float32 if name == "embedding" else src.dtype), tuple(src.shape)
        elif name in _FLAT:
            dtype, shape = src[0].dtype, (sum(p.numel() for p in src),)
        elif name in _SCALES:
            dtype, shape = torch.float32, (len(src), *src[0].shape)
        else:  # along the token axis
            dtype, shape = src[0].dtype, (*src[0].shape[:-1], ends[-1])
        layout.append((name, dtype, shape, torch.Size(shape).numel() * dtype.itemsize))
    data = torch.empty(sum(entry[3] for entry in layout), dtype=torch.uint8, pin_memory=pin_memory)
    views, at, whole = {}, 0, True
    for name, dtype, shape, size in layout:
        if at % dtype.itemsize:  # FILE_ORDER aligns every storage form; any other dtype gets a buffer of its own
            views[name], whole = torch.empty(shape, dtype=dtype, pin_memory=pin_memory), False
        else:
            views[name] = data[at:at + size].view(dtype).view(shape)
        at += size
    for name, src in sources.items():
        dst = views[name]
        if isinstance(src, torch.Tensor):
            dst.copy_(src)
        elif name in _FLAT:
            _fill(dst, [p.reshape(-1) for p in src], 0)
        elif name in _SCALES:
            _fill(dst, src, None)
        else:
            _fill(dst, src, -1)
    fields: dict[str, list[torch.Tensor]] = {}
    for name in _FLAT:
        fields[name] = _split_flat(views[name], [getattr(l, name).shape for l in layers])
    for name in RECORD_FIELDS:
        fields[name] = list(torch.split(views[name], [l.num_tokens for l in layers], dim=-1))
    for name in _SCALES:
        fields[name] = list(views[name].unbind(0)) if name in views else [None] * len(layers)
    out = [LayerTokens(**{name: fields[name][i] for name in fields}) for i in range(len(layers))]
    packed = dataclasses.replace(record, layers=out, embedding=views.get("embedding"))
    # the buffers themselves, for the writers and `nbytes`; a record made from this one by
    # `dataclasses.replace` is a new object without them, so they never describe other tensors
    packed.__dict__[_PACKED] = {name: views[name] for name in fields if name in views}
    if whole:
        first = layers[0]
        packed.__dict__[_PACKED_FILE] = PackedFile(data, tuple(layout), tuple(b - a for a, b in zip(ends, ends[1:])),
                                                   first.keys.shape[0], first.keys.shape[-1], first.values.shape[-1])
    return packed


def _fill(dst: torch.Tensor, pieces: list[torch.Tensor], dim: int | None) -> None:
    """Write `pieces` joined along `dim` (stacked along a new first axis if None) into host `dst`."""
    if not all(p.device.type == "cpu" and p.dtype == dst.dtype for p in pieces):  # joined on their device, one copy
        dst.copy_(torch.stack(pieces) if dim is None else torch.cat(pieces, dim=dim))
    elif dim is None:
        torch.stack(pieces, out=dst)
    else:
        torch.cat(pieces, dim=dim, out=dst)


_PACKED = "_packed_fields"
_PACKED_FILE = "_packed_file"


def packed_fields(record: Record) -> dict[str, torch.Tensor] | None:
    """``{field: its one host buffer}`` of a record `pack` made (layers in order), else None.

    Keys and values are flat (sum of numel,), scales (L, H, 1, D), the per-token fields (..., N).
    """
    return record.__dict__.get(_PACKED)


def packed_file(record: Record) -> PackedFile | None:
    """The tensor bytes of a record `pack` made, in file order in one buffer, else None."""
    return record.__dict__.get(_PACKED_FILE)


def _split_flat(flat: torch.Tensor, shapes: list[torch.Size]) -> list[torch.Tensor]:
    sizes = [int(torch.Size(s).numel()) for s in shapes]
    return [chunk.view(shape) for chunk, shape in zip(torch.split(flat, sizes), shapes)]


def packed_base(pieces: list[torch.Tensor]) -> torch.Tensor | None:
    """One flat tensor over the memory `pieces` fill back to back, if they do; else None.

    Pieces of one dtype, each contiguous, views of one storage laid end to end (as `pack` and
    `codec.from_safetensors` make them): then the span's bytes are the pieces' bytes back to back,
    and one copy or write of it replaces one per piece.
    """
    if not pieces:
        return None
    first = pieces[0]
    if first._base is None:
        return None
    storage, start = first.untyped_storage().data_ptr(), first.storage_offset()
    offset = start
    for p in pieces:
        if (p.dtype != first.dtype or p.storage_offset() != offset or not p.is_contiguous()
                or p.untyped_storage().data_ptr() != storage):
            return None
        offset += p.numel()
    return first.new_empty(0).set_(first.untyped_storage(), start, (offset - start,))


def to_device(pieces: list[torch.Tensor], device: torch.device | str, non_blocking: bool) -> list[torch.Tensor]:
    """Copy per-layer tensors to `device`: one copy of their packed base when there is one."""
    base = packed_base(pieces)
    if base is None or torch.device(device) == base.device:
        return [p.to(device, non_blocking=non_blocking) for p in pieces]
    moved = base.to(device, non_blocking=non_blocking).reshape(-1)
    return _split_flat(moved, [p.shape for p in pieces])
