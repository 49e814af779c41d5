"""Rows of a batched decode that come and go: the running rows' KV cache, attention mask and next-token logits.

``LocalStudent``'s shrinking decoding (atlas_core/teaching/student.py) keeps at most its ``max_active_rows`` rows
writing; rows that finished leave (:meth:`Rows.select`) and rows that waited are prefilled (:func:`prefill`) and
join (:meth:`Rows.join`). Rows are left-padded to a common length: a row's positions come from its own mask (as
``generate`` computes them), so the padding a join adds changes no row's positions, and the attention mask hides it.

Joining edits the cache's per-layer tensors (transformers' ``DynamicLayer.keys``/``values``, no public API to
concatenate two caches), and the cache of a joinable model is :class:`RoomyLayer`s, which write each step's token in
place instead of copying the whole cache (``DynamicLayer.update``'s ``torch.cat``): :func:`joinable` is the one fence
— a model whose cache has other layers (sliding windows, recurrent states) decodes without joins in transformers' own
cache, and a changed ``DynamicLayer`` fails here loudly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def joinable(model: Any) -> bool:
    """Whether ``model``'s cache is plain full-attention layers, whose tensors :meth:`Rows.join` may pad and stack."""
    layers = DynamicCache(config=model.config).layers
    if not all(type(layer) is DynamicLayer for layer in layers):
        return False
    probe = DynamicLayer()
    if not all(hasattr(probe, name) for name in ("keys", "values", "is_initialized", "lazy_initialization")):
        raise ImportError(
            "atlas_core.teaching.kv_rows: transformers' DynamicLayer no longer has keys/values/is_initialized/"
            "lazy_initialization (tested with transformers 5.24.0, constraints.txt); port Rows.join and RoomyLayer"
        )
    return True


class RoomyLayer(DynamicLayer):
    """A ``DynamicLayer`` whose ``keys``/``values`` are the filled part of buffers with room for ``room`` more
    tokens: a decoding step writes its token in place. Whatever replaces ``keys``/``values`` (a row leaving or
    joining, trimmed padding) is copied into new buffers at the next ``update``."""

    def __init__(self, room: int):
        super().__init__()
        self.room = max(1, room)
        self._key_buffer = self._value_buffer = None

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.keys, self._key_buffer = _appended(self.keys, self._key_buffer, key_states, self.room)
        self.values, self._value_buffer = _appended(self.values, self._value_buffer, value_states, self.room)
        return self.keys, self.values


def _appended(held, buffer, new, room: int):
    """``held`` (``[rows, heads, length, dim]``, or empty) with ``new`` after it, as a view of ``buffer`` when
    ``held`` is its filled part and there is room; else of a new buffer with ``room`` to spare."""
    length = held.shape[-2] if held.dim() == 4 else 0
    end = length + new.shape[-2]
    in_place = (
        buffer is not None
        and length
        and held.data_ptr() == buffer.data_ptr()
        and held.shape[:2] == buffer.shape[:2]
        and held.stride() == buffer.stride()
        and end <= buffer.shape[-2]
    )
    if not in_place:
        grown = new.new_empty((*new.shape[:2], end + room, new.shape[-1]))
        if length:
            grown[:, :, :length] = held
        buffer = grown
    buffer[:, :, length:end] = new
    return buffer[:, :, :end], buffer


def new_cache(model: Any, joinable: bool, room: int = 64):
    """A cache for ``model``'s rows: of :class:`RoomyLayer`s with ``room`` tokens to grow when ``joinable`` (what
    :func:`joinable` said of ``model``), else transformers' own."""
    cache = DynamicCache(config=model.config)
    if joinable:
        cache.layers = [RoomyLayer(room) for _ in cache.layers]
    return cache


@dataclass
class Rows:
    ids: list[int]  # the input row each batch row decodes
    cache: Any  # a DynamicCache over these rows
    mask: Any  # [rows, length]: 0 on padding (left of a row, or between a shared prefix and the rest)
    logits: Any  # [rows, vocab]: the next token's
    joinable: bool  # joinable(model): the cache's tensors may be padded, stacked and trimmed

    @property
    def size(self) -> int:
        return len(self.ids)

    def select(self, keep) -> Rows:
        """Only the rows at ``keep`` (a 1-D index tensor), the padding that every remaining row has cut away."""
        self.cache.batch_select_indices(keep)
        rows = Rows([self.ids[i] for i in keep.tolist()], self.cache, self.mask[keep], self.logits[keep], self.joinable)
        return rows._trimmed()

    def join(self, other: Rows) -> Rows:
        """These rows and ``other``'s in one batch: the shorter side left-padded to the longer."""
        if not (self.joinable and other.joinable):
            raise ValueError("kv_rows: this model's cache cannot take joining rows (joinable() is False)")
        length = max(self.mask.shape[1], other.mask.shape[1])

        def padded(tensor, dim_from_end: int):
            missing = length - tensor.shape[-dim_from_end]
            return F.pad(tensor, (0, 0) * (dim_from_end - 1) + (missing, 0)) if missing else tensor

        for mine, theirs in zip(self.cache.layers, other.cache.layers, strict=True):
            mine.keys = torch.cat([padded(mine.keys, 2), padded(theirs.keys, 2)])
            mine.values = torch.cat([padded(mine.values, 2), padded(theirs.values, 2)])
        mask = torch.cat([padded(self.mask, 1), padded(other.mask, 1)])
        return Rows(self.ids + other.ids, self.cache, mask, torch.cat([self.logits, other.logits]), True)

    def step(self, model: Any, tokens) -> None:
        """Feed each row its next token (``tokens``, one per row): the cache grows by one, ``logits`` are the next."""
        self.mask = torch.cat([self.mask, self.mask.new_ones((self.size, 1))], dim=-1)
        self.logits = model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=self.mask.long().sum(-1, keepdim=True) - 1,
            cache=self.cache,
            use_cache=True,
        ).logits[:, -1, :]

    def _trimmed(self) -> Rows:
        """Without the leading columns that are padding on every row (the rows that needed them left); only
        on a cache :func:`joinable` vouched for."""
        start = _first_used_column(self.mask)
        if start and self.joinable:
            self.mask = self.mask[:, start:]
            for layer in self.cache.layers:
                layer.keys = layer.keys[:, :, start:]
                layer.values = layer.values[:, :, start:]
        return self


def _first_used_column(mask) -> int:
    used = mask.any(dim=0).nonzero()
    return int(used[0]) if used.numel() else 0


def shared_prefix_length(prompts: list) -> int:
    """How many leading tokens every prompt (1-D token tensors) shares, leaving each at least one of its own
    (whose logits start its answer)."""
    shortest = min(len(p) for p in prompts)
    length = 0
    while length < shortest - 1 and all(int(p[length]) == int(prompts[0][length]) for p in prompts):
        length += 1
    return length


@dataclass(frozen=True)
class Prefix:
    """The cache of the tokens every prompt of a call starts with (the chat template's system turn, the
    protocol's instructions), computed once and copied into each prefill."""

    length: int
    layers: list  # (keys, values) per layer, batch of one

    @classmethod
    def of(cls, model: Any, tokens) -> Prefix:
        cache = DynamicCache(config=model.config)
        model(input_ids=tokens[None, :], cache=cache, use_cache=True, logits_to_keep=1)
        # A causal LM's DynamicCache holds attention layers, each with its keys and values (no linear-attention one).
        return cls(len(tokens), [(layer.keys, layer.values) for layer in cache.layers])  # type: ignore[union-attr]


def prefill(
    model: Any, prompts: list, ids: list[int], joinable: bool, pad_id: int, prefix: Prefix | None, room: int = 64
) -> Rows:
    """Rows ``ids`` (their prompts, 1-D token tensors) prefilled into a fresh cache (:func:`new_cache`, ``room``
    tokens to grow in place), left-padded to the longest; with ``prefix`` (a :func:`joinable` model's only), its
    cached tokens are copied in and only what follows them is computed: the padding then sits between the prefix
    and the rest, hidden by the mask and skipped by the positions. ``joinable``: :func:`joinable`'s verdict on
    ``model``."""
    shared = prefix.length if prefix is not None else 0
    rests = [p[shared:] for p in prompts]
    width = max(len(r) for r in rests)
    input_ids = torch.full((len(rests), width), pad_id, dtype=rests[0].dtype, device=rests[0].device)
    mask = torch.zeros((len(rests), width + shared), dtype=torch.long, device=rests[0].device)
    mask[:, :shared] = 1
    for row, rest in enumerate(rests):
        input_ids[row, width - len(rest) :] = rest
        mask[row, shared + width - len(rest) :] = 1
    # With a prefix, its copy is the first update: room for the rest of the prompts, then the answer, in place.
    cache = new_cache(model, joinable, room + width if prefix is not None else room)
    if prefix is not None:
        for index, (keys, values) in enumerate(prefix.layers):
            cache.update(keys.expand(len(rests), -1, -1, -1), values.expand(len(rests), -1, -1, -1), index)
    positions = (mask.cumsum(-1) - 1).masked_fill(mask == 0, 0)[:, shared:]
    logits = model(
        input_ids=input_ids,
        attention_mask=mask,
        position_ids=positions,
        cache=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1, :]
    return Rows(list(ids), cache, mask, logits, joinable)
