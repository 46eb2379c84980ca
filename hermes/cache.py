"""The working KV cache (memory level 1): a transformers `DynamicCache` of `HermesLayer`s.

Each layer owns its keys (stored rotated, as the model wrote them), values and per-token metadata
(`METADATA`), and every change goes through the layer so they never disagree; the cache keeps what
all layers share: the position state and the token-id counter (docs/ARCHITECTURE.md, State and who
owns it). `mark()` / `rewind()` take an answer's tokens out again, bit for bit.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import Cache, DynamicLayer, get_layer_types_and_kwargs

from hermes.errors import ModelError
from hermes.positions import GridStep, Run, VideoBlock, place, run_positions

KIND_PREFIX = 0  # system prompt tokens: never scored, never evicted
KIND_VISUAL = 1  # frame tokens: what memory policies manage
KIND_SUMMARY = 2  # a long-term layer's fold of evicted visual tokens
KIND_RECALLED = 3  # a token brought back from a lower level for one answer

# per token besides key and value: positions (A, T) int64, token_ids (T,) int64, kinds (T,) int8, frame_index (T,) int64, counts (T,) int64
METADATA = ("positions", "token_ids", "kinds", "frame_index", "counts")
_DTYPES = {"positions": torch.long, "token_ids": torch.long, "kinds": torch.int8, "frame_index": torch.long,
           "counts": torch.long}


class UnsupportedCacheError(ModelError):
    """The model's cache layout is one hermes cannot manage (exit 4, like any unsupported model)."""


def to_device_no_sync(index: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`index` (host) on `device` without stalling the host (CUDA: pinned memory, non-blocking copy)."""
    if device.type == "cuda" and index.device.type == "cpu":
        return index.pin_memory().to(device, non_blocking=True)
    return index.to(device)


@dataclass
class TokenEntries:
    """Copies of some of one layer's tokens: keys, values and their metadata, in cache order.

    Attributes:
        keys, values: (H, n, D) as cached (keys rotated at `positions`).
        positions: (A, n) int64.
        token_ids, kinds, frame_index, counts: (n,) (int64, int8, int64, int64).
    """

    keys: torch.Tensor
    values: torch.Tensor
    positions: torch.Tensor
    token_ids: torch.Tensor
    kinds: torch.Tensor
    frame_index: torch.Tensor
    counts: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return self.keys.shape[-2]


@dataclass(frozen=True)
class CacheMark:
    """A point to rewind the cache to: its length, next free position and open video block when marked."""

    length: int
    next_position: int
    block: VideoBlock | None = None


# tokens of room to spare in a new key/value buffer: a question and its answer, or a probe, fit without a copy
APPEND_HEADROOM_TOKENS = 512


class HermesLayer(DynamicLayer):
    """One layer of the working cache: keys (1, H, T, D), values, and per-token metadata (`METADATA`).

    The model appends through `update` and `describe` then gives those tokens metadata (until then
    `num_described` < `num_tokens`); ready-made tokens come with theirs in one `append`. Appends
    write into a buffer with room to spare (`_append_in_place`) and never over held tokens, so an
    earlier `state_dict` stays as it was; what replaces the tensors drops the buffer.

    Args:
        num_axes: position axes, 1 for 1-D RoPE, 3 for M-RoPE.
    """

    def __init__(self, num_axes: int = 1) -> None:
        super().__init__()
        self.num_axes = num_axes
        self._key_room: torch.Tensor | None = None  # (1, H, capacity, D): `keys` is its first T tokens
        self._value_room: torch.Tensor | None = None
        for name in METADATA:
            setattr(self, name, torch.empty(0, dtype=_DTYPES[name]))
        self.positions = torch.empty(num_axes, 0, dtype=torch.long)

    @property
    def num_tokens(self) -> int:
        """Tokens whose keys and values are cached (described or not)."""
        return self.get_seq_length()

    @property
    def num_described(self) -> int:
        """Tokens the metadata covers (the first `num_described` cached tokens)."""
        return self.token_ids.shape[0]

    def nbytes(self) -> int:
        if not self.is_initialized:
            return 0
        return self.keys.numel() * self.keys.element_size() + self.values.numel() * self.values.element_size()

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """transformers' protocol: append (1, H, q, D) keys and values; returns the whole layer's."""
        if torch.compiler.is_compiling():  # a compiled decode step (`model.compile_decode`) traces the plain
            self._drop_room()  # concatenation: one graph for every length, no checks on the buffer's storage
            return super().update(key_states, value_states, *args, **kwargs)
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self._key_room = _append_in_place(self.keys, self._key_room, key_states)
        self.values, self._value_room = _append_in_place(self.values, self._value_room, value_states)
        return self.keys, self.values

    def _drop_room(self) -> None:
        self._key_room = self._value_room = None

    def release_room(self) -> None:
        """Hold keys and values as plain contiguous tensors without a buffer (a compiled decode step's need)."""
        if self._key_room is not None:
            self.keys, self.values = self.keys.contiguous(), self.values.contiguous()
            self._drop_room()

    def describe(self, positions: torch.Tensor, token_ids: torch.Tensor, kind: int,
                 frame_index: torch.Tensor | None = None) -> None:
        """Give metadata to the next `n` tokens the model appended through `update`.

        Args:
            positions: (A, n) positions the tokens were encoded at.
            token_ids: (n,) their ids.
            kind: a `KIND_*`.
            frame_index: (n,) frame of each token; None for non-visual tokens (-1).

        Raises:
            ValueError: fewer than `n` cached tokens lack metadata.
        """
        n = token_ids.shape[0]
        if self.num_described + n > self.num_tokens:
            raise ValueError(f"describing {n} tokens, but only {self.num_tokens - self.num_described} cached "
                             f"tokens lack metadata")
        self._extend(positions, token_ids, kind, frame_index, None)

    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor, token_ids: torch.Tensor,
               kind: int, frame_index: torch.Tensor, counts: torch.Tensor | None = None) -> None:
        """Append ready-made tokens (e.g. recalled from a lower level) with their metadata, in one call.

        Args:
            keys, values: (H, m, D), keys already rotated at `positions` (cast to the cache's dtype).
            positions: (A, m) their positions.
            token_ids: (m,) their ids.
            kind: a `KIND_*`.
            frame_index: (m,) the frames they came from.
            counts: (m,) tokens each stands for (default 1).

        Raises:
            ValueError: the layer holds tokens without metadata (a forward in progress).
        """
        if self.num_described != self.num_tokens:
            raise ValueError(f"cannot append while {self.num_tokens - self.num_described} tokens lack metadata")
        if not self.is_initialized:
            self.lazy_initialization(keys[None], values[None])
        self.update(keys[None].to(self.keys.device, self.keys.dtype),
                    values[None].to(self.values.device, self.values.dtype))  # in place, as the model's appends
        self._extend(positions, token_ids, kind, frame_index, counts)

    def _extend(self, positions, token_ids, kind, frame_index, counts) -> None:
        n = token_ids.shape[0]
        frames = frame_index if frame_index is not None else torch.full((n,), -1, dtype=torch.long)
        counts = counts if counts is not None else torch.ones(n, dtype=torch.long)
        self.positions = torch.cat([self.positions, positions.to("cpu", torch.long).reshape(self.num_axes, n)], dim=1)
        self.token_ids = torch.cat([self.token_ids, token_ids.to("cpu", torch.long)])
        self.kinds = torch.cat([self.kinds, torch.full((n,), kind, dtype=torch.int8)])
        self.frame_index = torch.cat([self.frame_index, frames.to("cpu", torch.long).reshape(n)])
        self.counts = torch.cat([self.counts, counts.to("cpu", torch.long).reshape(n)])

    def entries(self, index: torch.Tensor, index_on_device: torch.Tensor | None = None) -> TokenEntries:
        """Copies of the described tokens at cache indices `index` (n,) (`index_on_device`: the same, moved)."""
        dev = index_on_device if index_on_device is not None else index.to(self.keys.device)
        return TokenEntries(keys=self.keys[0].index_select(-2, dev), values=self.values[0].index_select(-2, dev),
                            **{name: getattr(self, name)[..., index] for name in METADATA})

    def select(self, keep: torch.Tensor, keep_on_device: torch.Tensor | None = None) -> None:
        """Keep the described tokens at cache indices `keep` (K,), in that order (`keep_on_device`: the same, moved)."""
        idx = keep_on_device if keep_on_device is not None else keep.to(self.keys.device)
        self.keys = self.keys.index_select(-2, idx)
        self.values = self.values.index_select(-2, idx)
        self._drop_room()  # the kept tokens are new tensors; the old buffer would only hold memory
        for name in METADATA:
            setattr(self, name, getattr(self, name)[..., keep])

    def truncate(self, length: int) -> None:
        """Drop every token from cache index `length` on (keys, values and metadata); earlier ones untouched."""
        if self.num_tokens > length:
            self.crop(length - self.num_tokens)  # transformers' convention: a negative count to remove
        else:
            self._cut_metadata(length)

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' crop (a negative count of tokens to remove), metadata included."""
        super().crop(tokens_to_remove)
        self._cut_metadata(self.num_tokens)

    def reset(self) -> None:
        """transformers' reset: no tokens left, metadata included."""
        super().reset()
        self._drop_room()
        self._cut_metadata(0)

    def _cut_metadata(self, length: int) -> None:
        for name in METADATA:
            setattr(self, name, getattr(self, name)[..., :length])

    def write(self, index: int, key: torch.Tensor, value: torch.Tensor, position: torch.Tensor, token_id: int,
              kind: int, frame: int, count: int) -> None:
        """Overwrite the token at cache index `index` (key, value (H, D); position (A,))."""
        self.keys[0, :, index] = key
        self.values[0, :, index] = value
        self.positions[:, index] = position
        self.token_ids[index] = token_id
        self.kinds[index] = kind
        self.frame_index[index] = frame
        self.counts[index] = count

    def move(self, positions: torch.Tensor, keys: torch.Tensor | None) -> None:
        """Give the described tokens new positions (A, T), with their keys re-rotated to them (None: unchanged)."""
        if keys is not None:
            self.keys = keys
            self._drop_room()
        self.positions = positions

    def move_tail(self, positions: torch.Tensor, keys: torch.Tensor) -> None:
        """Give the last n described tokens new positions (A, n) and keys (1, H, n, D), written in place;
        only tokens no earlier `state_dict` holds (a new chunk's) may move so."""
        n, end = positions.shape[-1], self.num_described
        with torch.inference_mode():  # the buffer may be the model's (made under inference mode)
            self.keys[..., end - n:end, :] = keys
        self.positions = torch.cat([self.positions[:, :end - n], positions.to("cpu", torch.long)], dim=1)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Keys, values (1, H, T, D) and every token field, as they are (no copy)."""
        state = {name: getattr(self, name) for name in METADATA}
        if self.is_initialized:
            state.update(keys=self.keys, values=self.values)
        return state

    def load_state_dict(self, state: dict[str, torch.Tensor], device: torch.device | str | None = None) -> None:
        """Replace this layer's tokens with `state` (from `state_dict`); keys and values go to `device`.

        Raises:
            ValueError: a field is missing or the fields disagree in length.
        """
        missing = [name for name in METADATA if name not in state]
        if missing:
            raise ValueError(f"cache layer state lacks {', '.join(missing)}")
        if "keys" not in state or "values" not in state:  # a layer that never held a token
            if state["token_ids"].numel():
                raise ValueError("cache layer state has token fields but no keys and values")
            self.reset()
        else:
            length = state["keys"].shape[-2]
            if any(state[name].shape[-1] != length for name in METADATA) or state["values"].shape[-2] != length:
                raise ValueError("cache layer state: keys, values and token fields disagree in length")
            keys, values = state["keys"].to(device), state["values"].to(device)
            if not self.is_initialized:
                self.lazy_initialization(keys, values)
            self.keys, self.values = keys, values
            self._drop_room()
        for name in METADATA:
            setattr(self, name, state[name].to("cpu", _DTYPES[name]).clone())


def _append_in_place(held: torch.Tensor, room: torch.Tensor | None,
                     new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(`held` (B, H, T, D) with `new` (B, H, q, D) appended, the room it views): into `room` if `held` is its
    head and q more fit, else into a new room with `APPEND_HEADROOM_TOKENS` to spare."""
    n = held.shape[-2] if held.numel() else 0  # transformers starts a layer from an empty 1-D tensor
    q = new.shape[-2]
    reusable = (room is not None and n and held.data_ptr() == room.data_ptr() and held.stride() == room.stride()
                and held.shape[:-2] == room.shape[:-2] and room.dtype == new.dtype and n + q <= room.shape[-2])
    if reusable and room.is_inference() and not torch.is_inference_mode_enabled():
        reusable = False  # made under `torch.inference_mode` (the probe's): not writable outside it
    if not reusable:
        room = torch.empty((*new.shape[:-2], n + q + APPEND_HEADROOM_TOKENS, new.shape[-1]), dtype=new.dtype,
                           device=new.device)
        if n:
            room[..., :n, :].copy_(held)
    room[..., n:n + q, :].copy_(new)
    return room[..., :n + q, :], room


def check_layer_types(config) -> None:
    """Refuse a config whose cache layers are not full attention (other layers drop or share tokens on their own).

    Raises:
        UnsupportedCacheError: a layer of another type.
    """
    layer_types, _ = get_layer_types_and_kwargs(config.get_text_config(decoder=True))
    other = sorted({t for t in layer_types if t != "full_attention"})
    if other:
        raise UnsupportedCacheError(f"this model's cache has {', '.join(other)} layers; hermes manages full-attention "
                                    f"layers only (a sliding-window or hybrid model is not supported)")


class HermesCache(DynamicCache):
    """A `DynamicCache` of `HermesLayer`s: every token carries position, id, kind, frame and count.

    Every layer holds the same *number* of tokens (the library's attention masks need it), but
    maybe different tokens, each layer's metadata describing its own.

    Args:
        config: the language model's config (number and type of layers).
        num_axes: position axes, 1 for 1-D RoPE, 3 for M-RoPE.

    Raises:
        UnsupportedCacheError: the config asks for layers other than full attention.

    Attributes (written by the cache's own methods only):
        next_position: first free rotary position (every axis); new tokens are placed from here on.
        block: the open M-RoPE video block that the next grid step continues, or None.
        compactions: how often positions were compacted (a lower-level record's position frame).
    """

    layers: list[HermesLayer]

    def __init__(self, config, num_axes: int = 1) -> None:
        check_layer_types(config)
        Cache.__init__(self, layers=[HermesLayer(num_axes) for _ in range(config.num_hidden_layers)])
        self.num_layers = config.num_hidden_layers
        self.num_axes = num_axes
        self.next_position = 0
        self.block: VideoBlock | None = None
        self.compactions = 0
        self._next_token_id = 0

    # metadata views (L, ..., T): write through the layers

    def _stacked(self, name: str) -> torch.Tensor:
        return torch.stack([getattr(layer, name) for layer in self.layers])

    def _set_rows(self, name: str, rows: torch.Tensor) -> None:
        for layer, row in zip(self.layers, rows):
            setattr(layer, name, row)

    positions = property(lambda self: self._stacked("positions"), lambda self, v: self._set_rows("positions", v),
                         doc="(L, A, T) int64 rotary position each cached key was rotated to.")
    token_ids = property(lambda self: self._stacked("token_ids"), lambda self, v: self._set_rows("token_ids", v),
                         doc="(L, T) int64 stable id of each token (never reused), for matching across layers.")
    kinds = property(lambda self: self._stacked("kinds"), lambda self, v: self._set_rows("kinds", v),
                     doc="(L, T) int8 `KIND_*` of each token.")
    frame_index = property(lambda self: self._stacked("frame_index"), lambda self, v: self._set_rows("frame_index", v),
                           doc="(L, T) int64 sampled frame a visual token came from (-1 otherwise).")
    counts = property(lambda self: self._stacked("counts"), lambda self, v: self._set_rows("counts", v),
                      doc="(L, T) int64 tokens each entry stands for (1; more for a summary token).")

    @property
    def prefix_len(self) -> int:
        """Prefix tokens (the same in every layer, always first)."""
        return int((self.layers[0].kinds == KIND_PREFIX).sum())

    def allocate_positions(self, n: int) -> torch.Tensor:
        """Reserve the next `n` positions for text, (A, n) int64 equal on every axis; closes the video block."""
        positions = run_positions(self.next_position, n, self.num_axes)
        self.next_position += n
        self.block = None
        return positions

    def place(self, layout: list[Run | GridStep], start: int | None = None, beyond: int = 0) -> torch.Tensor:
        """Reserve positions for a chunk's layout (see `hermes.positions.place`).

        Args:
            layout: the chunk's segments.
            start: place it from this position, as a block of its own (None: from the next free
                position, continuing the open block).
            beyond: positions past the placed ones that the next free position must also clear (a
                layer's copy placed further on, `memory.chunk_positions: per_layer`).

        Returns:
            (A, n) int64 positions, n = the layout's token count.
        """
        before = self.next_position
        if start is not None:
            self.next_position, self.block = start, None
        placement = place(layout, self.next_position, self.block, self.num_axes)
        self.next_position, self.block = placement.next_position, placement.block
        if start is not None:
            self.next_position = max(self.next_position + beyond, before)
        return placement.positions

    def compacted(self, next_position: int) -> None:
        """Every layer's positions were packed (`compact_positions`): set the next free position, close the block."""
        self.next_position, self.block = next_position, None
        self.compactions += 1

    def write_summary(self, layer: int, index: int, key: torch.Tensor, value: torch.Tensor, position: torch.Tensor,
                      count: int) -> None:
        """Write a summary token (fresh id) over cache index `index` of one layer (key, value (H, D);
        position (A,)); text and later frames are placed after it."""
        self.layers[layer].write(index, key, value, position, int(self.new_token_ids(1)), KIND_SUMMARY, -1, count)
        self._clear(position)

    def _clear(self, positions: torch.Tensor) -> None:
        """Move the next free position (closing the video block) past `positions` if they reach it."""
        if positions.numel() and int(positions.max()) + 1 > self.next_position:
            self.next_position, self.block = int(positions.max()) + 1, None

    def layer_next_positions(self) -> torch.Tensor:
        """(L,) int64 one past each layer's largest position (0 if empty), where the reference continues it."""
        return torch.tensor([int(layer.positions.max()) + 1 if layer.positions.numel() else 0 for layer in self.layers],
                            dtype=torch.long)

    def new_token_ids(self, n: int) -> torch.Tensor:
        """`n` fresh ids (for tokens a policy creates, such as summary tokens)."""
        ids = torch.arange(self._next_token_id, self._next_token_id + n, dtype=torch.long)
        self._next_token_id += n
        return ids

    def record(self, positions: torch.Tensor, kind: int, frame_index: torch.Tensor | None = None) -> None:
        """Describe the next `n` tokens the model appended to every layer (fresh ids, the same in every layer).

        Args:
            positions: (A, n) positions the tokens were encoded at.
            kind: `KIND_PREFIX` or `KIND_VISUAL`.
            frame_index: (n,) frame of each token; None for non-visual tokens.
        """
        n = positions.shape[-1]
        ids = self.new_token_ids(n)
        positions = positions.reshape(self.num_axes, n)
        for layer in self.layers:
            layer.describe(positions, ids, kind, frame_index)

    def append(self, keys: list[torch.Tensor], values: list[torch.Tensor], positions: list[torch.Tensor], kind: int,
               frame_index: list[torch.Tensor]) -> None:
        """Append ready-made tokens to every layer at once (e.g. recalled from a lower level), with fresh ids;
        the next free position moves past them if they reach it.

        Args:
            keys, values: per layer, (H, m, D); keys already rotated at `positions`.
            positions: per layer, (A, m).
            kind: what they are (a `KIND_*`).
            frame_index: per layer, (m,) the frames they came from.

        Raises:
            ValueError: not one entry per layer, or layers given different numbers of tokens.
        """
        sizes = {k.shape[-2] for k in keys}
        if len(keys) != self.num_layers or len(sizes) != 1:
            raise ValueError(f"append needs equally many tokens for each of the {self.num_layers} layers, "
                             f"found {len(keys)} layers with {sorted(sizes)} tokens")
        ids = self.new_token_ids(sizes.pop())
        for layer, k, v, p, f in zip(self.layers, keys, values, positions, frame_index):
            layer.append(k, v, p, ids, kind, f)
            self._clear(p)

    def select_(self, keep: torch.Tensor) -> None:
        """Keep, in each layer l, the tokens at cache indices `keep[l]` (in that order).

        Args:
            keep: (L, K) int64 cache indices; the same K for every layer.
        """
        keep_on_device = to_device_no_sync(keep, self.layers[0].keys.device)  # one move for every layer
        for layer, row, row_on_device in zip(self.layers, keep, keep_on_device):
            layer.select(row, row_on_device)

    def release_rooms(self) -> None:
        """Every layer's `HermesLayer.release_room`."""
        for layer in self.layers:
            layer.release_room()

    def mark(self) -> CacheMark:
        """Remember the current state so that `rewind` can return to it."""
        return CacheMark(length=self.get_seq_length(), next_position=self.next_position, block=self.block)

    def rewind(self, mark: CacheMark) -> None:
        """Drop every token appended after `mark` in every layer (earlier ones untouched)."""
        for layer in self.layers:
            layer.truncate(mark.length)
        self.next_position = mark.next_position
        self.block = mark.block

    @property
    def num_tokens(self) -> int:
        """Tokens per layer (every layer holds the same number)."""
        return self.get_seq_length()

    @property
    def num_visual_tokens(self) -> int:
        """Visual tokens per layer (summary tokens excluded)."""
        return int((self.layers[0].kinds == KIND_VISUAL).sum())

    def nbytes(self) -> int:
        """Bytes of the held keys and values over all layers (append buffers' spare room not counted)."""
        return sum(layer.nbytes() for layer in self.layers)

    def layer_tensors(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(keys, values) per layer, each (B, H, T, D); for inspection and tests."""
        return [(layer.keys, layer.values) for layer in self.layers if layer.is_initialized]

    def state_dict(self) -> dict[str, Any]:
        """Every layer's tensors (``layers.<l>.<field>``) and the position state (JSON-able values)."""
        state: dict[str, Any] = {f"layers.{l}.{name}": t for l, layer in enumerate(self.layers)
                                 for name, t in layer.state_dict().items()}
        state.update(next_position=self.next_position, next_token_id=self._next_token_id,
                     compactions=self.compactions,
                     block=dataclasses.asdict(self.block) if self.block is not None else None)
        return state

    def load_state_dict(self, state: dict[str, Any], device: torch.device | str | None = None) -> None:
        """Replace the cache's contents with `state` (from `state_dict`); keys and values go to `device`.

        Raises:
            ValueError: a layer's state is missing or inconsistent.
        """
        for l, layer in enumerate(self.layers):
            prefix = f"layers.{l}."
            layer.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}, device)
        self.next_position = int(state["next_position"])
        self._next_token_id = int(state["next_token_id"])
        self.compactions = int(state["compactions"])
        self.block = VideoBlock(**state["block"]) if state["block"] else None
