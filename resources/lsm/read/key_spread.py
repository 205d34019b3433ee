"""How many distinct values each column of a composite key holds in the base, estimated once per table."""

from __future__ import annotations

import lance
import pyarrow as pa
import pyarrow.compute as pc

from ..lru_cache import LruCache

_SAMPLE_ROWS = 65_536
_SPREADS: LruCache[tuple[str, tuple[str, ...]], dict[str, int]] = LruCache(max_entries=1024)
"""Each table's estimate, by location and key columns."""


def key_spread(dataset: lance.LanceDataset, key: list[str]) -> dict[str, int]:
    """Distinct values per key column among the base's first rows (at most 64Ki); empty for a one-column key.

    Point queries on the base filter a composite key on its most selective
    column (:func:`~resources.lsm.read.filter_text.keys_filter`). How
    selective each column is changes little as a table grows, so the
    estimate is taken once per table location and process (a base with no
    rows yet is sampled again next time).
    """
    if len(key) < 2:
        return {}
    cache_key = (dataset.uri, tuple(key))
    if (known := _SPREADS.find(cache_key)) is not None:
        return known
    sample = dataset.to_table(columns=key, limit=_SAMPLE_ROWS)
    if not sample.num_rows:
        return {}
    spread = {name: pc.count_distinct(sample.column(name)).as_py() for name in key}
    _SPREADS.put(cache_key, spread)
    return spread


_UNIQUE_SHARE = 0.9
"""Distinct values per sampled row from which a key column counts as nearly unique."""


def unique_columns(dataset: lance.LanceDataset, key: list[str]) -> list[str]:
    """The columns of a composite key nearly unique in the base (distinct in 9 of 10 sampled rows), most first.

    A row found by such a column alone is, but for a few, the row of the key
    looked for. Judged against the rows a sample of the base would hold now:
    an estimate taken while the base was smaller finds none.
    """
    spread = key_spread(dataset, key)
    sampled = min(_SAMPLE_ROWS, dataset.count_rows())
    unique = [name for name in key if sampled and spread.get(name, 0) >= _UNIQUE_SHARE * sampled]
    return sorted(unique, key=lambda name: -spread[name])


def unique_integer_column(dataset: lance.LanceDataset, key: list[str]) -> str | None:
    """A composite key's integer column the base holds nearly unique (the most distinct one), if it has one.

    Scans and joins test such a column alone, then compare the other key
    columns of the few rows it finds: an integer is cheaper to hash and
    look up than a whole key with a string in it. ``None`` for a one-column
    key.
    """
    if len(key) < 2:
        return None
    integers = (c for c in unique_columns(dataset, key) if pa.types.is_integer(dataset.schema.field(c).type))
    return next(integers, None)
