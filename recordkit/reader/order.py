"""Keyed permutations of ``[0, n)`` that need no table: a Feistel network with cycle-walking.

``Permutation(n, key)`` maps any array of positions to their images in O(1)
memory per position, in both directions, so an epoch order over a billion
records costs a few numbers, not a table of a billion entries.

The network works on ``k = max(2, ceil(log2 n))`` bits split into two halves of
``k // 2`` and ``k - k // 2`` bits (unbalanced when ``k`` is odd, so the domain
stays below ``2n``); each of the six rounds swaps the halves and XORs a
SplitMix64-finalised hash of one half (keyed per round) into the other. That is a
bijection on ``[0, 2**k)``; *cycle-walking* (encrypt again while the result is
``>= n``) restricts it to a bijection on ``[0, n)`` for every ``n`` — including
``2**k + 1``, where a permutation that sizes its network from ``max_index`` fails.
Six rounds: four leave visible structure on sorted data (the research notes in
``shared/research/shuffle.md`` measured label dispersion 2.9 at four rounds,
1.0 at six).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ..native import ext

_Step = Callable[[np.ndarray], np.ndarray]


# The C twin of the network below (recordkit/native/order.c): same results, ~20x faster.
_c: Any = ext

__all__ = ["Permutation", "mix64", "mixing"]

_ROUNDS = 6
_M64 = (1 << 64) - 1
_C1, _C2, _GOLDEN = 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0x9E3779B97F4A7C15


def mix64(*words: int) -> int:
    """A 64-bit hash of integers (SplitMix64 steps): for deriving keys, not per record."""
    z = 0x243F6A8885A308D3  # pi's fraction: an arbitrary non-zero start
    for w in words:
        z = (z ^ (w & _M64)) + _GOLDEN & _M64
        z = (z ^ (z >> 30)) * _C1 & _M64
        z = (z ^ (z >> 27)) * _C2 & _M64
        z ^= z >> 31
    return z


def _hash(x: np.ndarray, key: np.uint64) -> np.ndarray:
    """SplitMix64's finaliser of ``x ^ key``, on uint64 arrays (wrapping arithmetic)."""
    z = x ^ key
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_C1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_C2)
    out: np.ndarray = z ^ (z >> np.uint64(31))
    return out


class Permutation:
    """A keyed bijection of ``[0, n)``.

    Args:
        n: the domain size (>= 0).
        key: any integer; equal keys give equal permutations.
    """

    __slots__ = ("_keys", "_left", "_right", "n", "round_keys")

    def __init__(self, n: int, key: int) -> None:
        if n < 0:
            raise ValueError(f"a permutation needs n >= 0, got {n}")
        self.n = n
        bits = max(2, (n - 1).bit_length())
        self._left, self._right = bits // 2, bits - bits // 2
        #: the network's round keys (also for ``recordkit/native/order.c``'s ``plan_order``)
        self.round_keys = tuple(mix64(key, r) for r in range(_ROUNDS))
        self._keys = [np.uint64(k) for k in self.round_keys]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """The images of positions ``x`` (int64 array in ``[0, n)``)."""
        return self._apply(x, inverse=False)

    def inverse(self, y: np.ndarray) -> np.ndarray:
        """The positions whose images are ``y``."""
        return self._apply(y, inverse=True)

    def _apply(self, x: np.ndarray, *, inverse: bool, native: bool | None = None) -> np.ndarray:
        if (_c is not None if native is None else native) and self.n > 1:
            src = np.ascontiguousarray(x, dtype=np.int64)
            out = np.empty_like(src)
            _c.permute(src, out, self.n, self._left, self._right, self.round_keys, inverse)
            return out
        return self._walk(x, self._decrypt if inverse else self._encrypt)

    def _walk(self, x: np.ndarray, step: _Step) -> np.ndarray:
        x = np.asarray(x, dtype=np.int64)
        if self.n <= 1:
            same: np.ndarray = x.copy()
            return same
        out = step(x.astype(np.uint64))
        n = np.uint64(self.n)
        out_of_range = np.flatnonzero(out >= n)
        while len(out_of_range):  # cycle-walking: fewer than 2 steps expected
            again = step(out[out_of_range])
            out[out_of_range] = again
            out_of_range = out_of_range[again >= n]
        result: np.ndarray = out.astype(np.int64)
        return result

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        wl, wr = self._left, self._right
        left, right = x >> np.uint64(wr), x & np.uint64((1 << wr) - 1)
        for key in self._keys:
            mask = np.uint64((1 << wl) - 1)
            left, right = right, left ^ (_hash(right, key) & mask)
            wl, wr = wr, wl
        out: np.ndarray = (left << np.uint64(wr)) | right
        return out

    def _decrypt(self, y: np.ndarray) -> np.ndarray:
        # Rounds alternate the halves' widths; with an even number of rounds the
        # widths at the end are those at the start.
        wl, wr = self._left, self._right
        left, right = y >> np.uint64(wr), y & np.uint64((1 << wr) - 1)
        for key in reversed(self._keys):
            # undo (L, R) -> (R, L ^ F(R)): the previous R is the current L
            wl, wr = wr, wl
            mask = np.uint64((1 << wl) - 1)
            left, right = right ^ (_hash(left, key) & mask), left
        out: np.ndarray = (left << np.uint64(wr)) | right
        return out


def mixing(labels: np.ndarray, batch: int, classes: int | None = None) -> dict[str, float]:
    """How well a stream of labels is mixed, batch by batch (for checking a shuffle).

    Returns the mean and 1st percentile of distinct labels per batch, and the
    label dispersion ``D(batch)``: the chi-square of each batch's label counts
    against the stream's overall proportions, divided by ``classes - 1``. A
    uniform permutation gives ``D`` near 1 at every batch size; batches of one
    class give ``batch``.
    """
    labels = np.asarray(labels)
    k = classes or int(labels.max()) + 1
    n = len(labels) // batch * batch
    if not n:
        raise ValueError(f"need at least one batch of {batch} labels, got {len(labels)}")
    rows = labels[:n].reshape(-1, batch)
    counts = np.zeros((len(rows), k), dtype=np.int64)
    np.add.at(counts, (np.repeat(np.arange(len(rows)), batch), rows.reshape(-1)), 1)
    expected = batch * np.bincount(labels, minlength=k)[:k] / len(labels)
    seen = expected > 0
    chi2 = ((counts[:, seen] - expected[seen]) ** 2 / expected[seen]).sum(axis=1)
    distinct = (counts > 0).sum(axis=1)
    return {
        "distinct": float(distinct.mean()),
        "distinct_p1": float(np.percentile(distinct, 1)),
        "dispersion": float(chi2.mean() / max(int(seen.sum()) - 1, 1)),
    }
