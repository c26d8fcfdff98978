"""The prefix cache: chained block hashes of token ids, LRU under a capacity in tokens.

Only hashes and lengths are kept, never per-token KV: a 256k-token prompt is 16k hashes at block 16.
Block k's hash covers tokens 0 .. (k+1)*B - 1 (it chains the previous block's hash), so a hit on block k
means the whole prefix up to it matches, as in a radix cache.
"""
from __future__ import annotations

from collections import OrderedDict


class BlockHasher:
    """Incremental chained hashes of one token sequence (the prompt, then each generated token)."""

    __slots__ = ("block", "hashes", "tail", "_last")

    def __init__(self, block: int):
        self.block = block
        self.hashes: list[int] = []
        self.tail: list[int] = []  # ids of the last, incomplete block
        self._last = 0

    def extend(self, ids: list[int]) -> None:
        b = self.block
        if self.tail:
            need = b - len(self.tail)
            self.tail += ids[:need]
            ids = ids[need:]
            if len(self.tail) < b:
                return
            self._push(self.tail)
            self.tail = []
        full = len(ids) - len(ids) % b
        for i in range(0, full, b):
            self._push(ids[i:i + b])
        self.tail = list(ids[full:])

    def append(self, token_id: int) -> None:
        self.tail.append(token_id)
        if len(self.tail) == self.block:
            self._push(self.tail)
            self.tail = []

    def _push(self, ids: list[int]) -> None:
        self._last = hash((self._last, tuple(ids)))
        self.hashes.append(self._last)


class PrefixCache:
    """LRU set of block hashes; capacity in tokens (whole blocks)."""

    def __init__(self, block: int, capacity_tokens: int, enabled: bool = True):
        self.block = block
        self.capacity_blocks = capacity_tokens // block if enabled else 0
        self.enabled = enabled and self.capacity_blocks > 0
        self._lru: OrderedDict[int, None] = OrderedDict()
        self.queried_tokens = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._lru)

    def match(self, hashes: list[int], prompt_len: int) -> int:
        """Tokens of the prompt served from the cache (a whole-block prefix), refreshing their recency."""
        self.queried_tokens += prompt_len
        if not self.enabled:
            return 0
        n = 0
        for h in hashes:
            if h not in self._lru:
                break
            self._lru.move_to_end(h)
            n += 1
        hit = min(n * self.block, prompt_len)
        self.hit_tokens += hit
        return hit

    def insert(self, hashes: list[int]) -> None:
        if not self.enabled:
            return
        lru = self._lru
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
        while len(lru) > self.capacity_blocks:
            lru.popitem(last=False)

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
