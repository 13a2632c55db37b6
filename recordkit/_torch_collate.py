"""``recordkit.torch.collate``: samples into the batch ``RecordDataset(batch_size=N)`` yields.

Imported only by :mod:`recordkit.torch` (it imports torch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch

from .codec.features import Bytes
from .codec.schema import Schema

__all__ = ["collate"]


def _variable(schema: Schema | None, name: str) -> bool | None:
    """Whether the schema gives ``name`` a ``None`` dim (``None``: no schema says)."""
    if schema is None or name not in schema.features:
        return None
    return None in schema.features[name].shape


def _bytes(values: list[Any], name: str, bytes_as: str, out: dict[str, Any]) -> None:
    if bytes_as == "list":
        out[name] = [bytes(v) for v in values]
        return
    lengths = np.fromiter((len(v) for v in values), np.int64, len(values))
    padded = np.zeros((len(values), int(lengths.max(initial=0))), np.uint8)
    for row, value in enumerate(values):
        padded[row, : len(value)] = np.frombuffer(value, np.uint8)
    out[name] = torch.from_numpy(padded)
    out[name + "/lengths"] = torch.from_numpy(lengths)


def collate(
    samples: Sequence[Mapping[str, Any]],
    *,
    schema: Schema | None = None,
    bytes_as: Literal["padded", "list"] = "padded",
) -> dict[str, Any]:
    """Collate samples of ``RecordDataset(batch_size=None)`` into one batch.

    The batch has the layout ``RecordDataset(batch_size=N)`` yields (the table in
    ``docs/pytorch.md``): fixed-shape numbers stacked ``(N, *shape)``; ``Bytes()``
    zero-padded ``uint8 (N, longest)`` plus ``"{name}/lengths"`` (or a list of
    ``bytes`` with ``bytes_as="list"``); features with a ``None`` dim, and
    ``Bytes`` lists, as a list of N values. Use it as a ``DataLoader``'s
    ``collate_fn``; ``RecordDataset.collate`` is this function with the
    dataset's schema and ``bytes_as`` bound.

    Args:
        samples: dicts with the same keys.
        schema: says which features are variable-length. Without it a feature
            whose tensors differ in shape within this batch comes as a list and
            one whose tensors agree is stacked, so give it where lengths vary.
        bytes_as: ``"padded"`` or ``"list"``, for ``Bytes()`` features.

    Raises:
        ValueError: the samples do not have the same keys, or a bad ``bytes_as``.
    """
    if bytes_as not in ("padded", "list"):
        raise ValueError(f"bytes_as must be 'padded' or 'list', got {bytes_as!r}")
    if not samples:
        return {}
    names = list(samples[0])
    out: dict[str, Any] = {}
    for i, sample in enumerate(samples):
        if list(sample) != names:
            raise ValueError(f"sample {i} has keys {list(sample)}, sample 0 has {names}")
    for name in names:
        values = [s[name] for s in samples]
        first = values[0]
        feature = schema.features.get(name) if schema is not None else None
        if isinstance(first, (bytes, bytearray, memoryview)) and (
            feature is None or isinstance(feature, Bytes)
        ):
            _bytes(values, name, bytes_as, out)
        elif isinstance(first, (list, str)):
            out[name] = values  # Bytes lists, text (tfds Text): one value per record
        else:
            tensors = [v if isinstance(v, torch.Tensor) else torch.as_tensor(v) for v in values]
            variable = _variable(schema, name)
            if variable is None:
                variable = len({tuple(t.shape) for t in tensors}) > 1
            out[name] = tensors if variable else torch.stack(tensors)
    return out
