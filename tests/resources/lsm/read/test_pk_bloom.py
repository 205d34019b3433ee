"""Point lookups skip generations by their bloom filters: Lance's key hash reproduced, no row ever missed."""

from __future__ import annotations

import logging
import os

import lance
import numpy as np
import pyarrow as pa
import pytest

from resources.lsm import LsmTable
from resources.lsm.format.layout import shard_dir
from resources.lsm.format.schema import TOMBSTONE_COLUMN
from resources.lsm.read.pk_bloom import (
    BLOOM_FILTER_FILE,
    FilterStack,
    GenerationFilters,
    SplitBlockBloomFilter,
    pk_hashes,
)
from tests.helpers import drop_pending_runs, reads_of, rows_by_key

KEYED_SCHEMAS = {
    "int64": (pa.schema([("id", pa.int64()), ("v", pa.string())]), ["id"]),
    "int32": (pa.schema([("id", pa.int32()), ("v", pa.string())]), ["id"]),
    "string": (pa.schema([("id", pa.string()), ("v", pa.string())]), ["id"]),
    "composite": (pa.schema([("region", pa.string()), ("id", pa.int64()), ("v", pa.string())]), ["region", "id"]),
}


def keys_for(schema: pa.Schema, key: list[str], numbers: range) -> dict[str, list]:
    return {c: [f"k{n}" if pa.types.is_string(schema.field(c).type) else n for n in numbers] for c in key}


def generation_filters(table: LsmTable) -> GenerationFilters:
    """The bloom filters a lookup of ``table`` consults."""
    key_fields = [table.schema.field(k) for k in table.primary_key]
    return GenerationFilters(table.handle.storage, key_fields)


def generation_path(table: LsmTable, shard_id: str, directory: str) -> str:
    return f"{table.uri}/{shard_dir(shard_id)}/{directory}"


def put(table: LsmTable, numbers: range, label: str) -> None:
    """Upsert ``id`` = each number (ITEMS_SCHEMA) and flush: one generation per touched shard."""
    table.write(
        pa.table({"id": pa.array(numbers, pa.int64()), "name": [label] * len(numbers), "price": [1.0] * len(numbers)})
    )
    table.close()


@pytest.mark.parametrize("kind", sorted(KEYED_SCHEMAS))
def test_every_key_of_a_generation_passes_its_filter_and_absent_keys_mostly_do_not(make_table, kind):
    schema, key = KEYED_SCHEMAS[kind]
    table = make_table(schema, key, num_shards=2)
    table.write(pa.table({**keys_for(schema, key, range(600)), "v": ["x"] * 600}))
    table.close()
    table.write(pa.table({**keys_for(schema, key, range(0, 900, 6)), "_op": ["delete"] * 150}))
    table.close()
    types = [schema.field(c).type for c in key]
    absent = list(zip(*keys_for(schema, key, range(10_000, 12_000)).values(), strict=True))
    tombstones = 0
    for shard in table.shards():
        for _, directory in shard.pending_generations:
            path = generation_path(table, shard.shard_id, directory)
            with open(f"{path}/{BLOOM_FILTER_FILE}", "rb") as f:
                bloom = SplitBlockBloomFilter(f.read())
            rows = lance.dataset(path).to_table(columns=[*key, TOMBSTONE_COLUMN])
            tombstones += sum(rows[TOMBSTONE_COLUMN].to_pylist())
            present = list(zip(*(rows[c].to_pylist() for c in key), strict=True))
            assert bloom.might_contain_all(pk_hashes(present, types)).all()
            assert bloom.might_contain_all(pk_hashes(absent, types)).sum() < len(absent) * 0.05
    assert tombstones == 150, "deletes are rows of their generation, and their filter admits them"


def candidates(table, shard, key: list) -> tuple:
    """The shard's pending generations whose filter may hold ``key``."""
    held = generation_filters(table).candidate_keys(shard.shard_id, shard.pending_generations, [tuple(key)])
    return tuple(g for g in shard.pending_generations if held[g].size)


def test_a_lookup_plans_only_over_the_generations_that_may_hold_its_key(make_table):
    table = make_table(num_shards=1)
    for g in range(4):
        put(table, range(g * 100, g * 100 + 100), f"g{g}")
    table.write(pa.table({"id": pa.array([150], pa.int64()), "_op": ["delete"]}))
    table.close()
    shard = table.shards()[0]
    generations = shard.pending_generations
    assert len(generations) == 5
    assert candidates(table, shard, [250]) == (generations[2],)
    assert candidates(table, shard, [150]) == (
        generations[1],
        generations[4],
    )
    assert candidates(table, shard, [10_000]) == ()

    probe = [*range(0, 420, 7), 150]
    expected = rows_by_key(table.read())
    assert rows_by_key(table.lookup(probe)) == {(k,): expected[(k,)] for k in probe if (k,) in expected}
    assert table.lookup([150]).num_rows == 0


def two_generations(make_table) -> tuple[LsmTable, str]:
    """Keys 0..99 'old' in generation 1, keys 0..49 'new' in generation 2; returns generation 2's path.

    Without a pending run, so that lookups search the generations.
    """
    table = make_table(num_shards=1)
    put(table, range(100), "old")
    put(table, range(50), "new")
    drop_pending_runs(table)
    shard = table.shards()[0]
    return table, generation_path(table, shard.shard_id, shard.pending_generations[-1][1])


def test_a_filter_that_rejects_its_own_keys_is_not_used(make_table, caplog):
    table, newer = two_generations(make_table)
    with open(f"{newer}/{BLOOM_FILTER_FILE}", "r+b") as f:
        f.write(bytes(len(f.read())))  # admits no key: trusted, it would hide every 'new' row

    with caplog.at_level(logging.WARNING, logger="resources.lsm.read.pk_bloom"):
        assert LsmTable.open(table.uri).lookup([5, 75])["name"].to_pylist() == ["new", "old"]
    assert "does not admit its own keys" in caplog.text


def test_a_generation_without_a_filter_is_always_searched(make_table):
    table, newer = two_generations(make_table)
    os.remove(f"{newer}/{BLOOM_FILTER_FILE}")
    assert LsmTable.open(table.uri).lookup([5, 75])["name"].to_pylist() == ["new", "old"]


def test_a_table_object_opened_anew_reads_and_checks_no_filter_again(make_table):
    """Filters never change once listed: the process keeps them for every table object (each Dagster step's)."""
    table, _ = two_generations(make_table)
    assert table.lookup([5, 75])["name"].to_pylist() == ["new", "old"]
    reopened = LsmTable.open(table.uri)
    filter_reads = reads_of(reopened, BLOOM_FILTER_FILE)
    assert reopened.lookup([5, 75])["name"].to_pylist() == ["new", "old"]
    assert not filter_reads


@pytest.mark.parametrize("key_type", [pa.uint16(), pa.large_string()])
def test_keys_lance_hashes_differently_are_never_pruned(make_table, key_type):
    table = make_table(pa.schema([("id", key_type), ("v", pa.string())]), ["id"], num_shards=1)
    value = (lambda n: f"k{n}") if key_type == pa.large_string() else (lambda n: n)
    for label in ("a", "b"):
        table.write(pa.table({"id": pa.array([value(n) for n in range(20)], key_type), "v": [label] * 20}))
        table.close()
    shard = table.shards()[0]
    assert candidates(table, shard, [value(5)]) == shard.pending_generations
    assert table.lookup([value(5)])["v"].to_pylist() == ["b"]


@pytest.mark.parametrize("kind", sorted(KEYED_SCHEMAS))
def test_a_few_keys_hash_as_they_do_among_many(kind):
    # Few keys are hashed on Python ints, many with numpy: the filters were checked against the latter.
    schema, key = KEYED_SCHEMAS[kind]
    types = [schema.field(c).type for c in key]
    numbers = [*range(-3, 40), 2**31 - 1, -(2**31)] if kind == "int32" else [*range(-3, 40), 2**63 - 1, -(2**63)]
    keys = [tuple(f"{'é' * (n % 11)}k{n}" if pa.types.is_string(t) else n for t in types) for n in numbers]
    together = pk_hashes(keys, types)
    assert len(set(together.tolist())) == len(keys)
    assert [pk_hashes([k], types)[0] for k in keys] == together.tolist()


SALTS = (0x47B6137B, 0x44974D91, 0x8824AD5B, 0xA2B7289D, 0x705495C7, 0x2DF1424B, 0x9EFC4947, 0x5C6BFB31)


def sbbf_holds(data: bytes, key_hash: int) -> bool:
    """Parquet's split-block bloom filter check, word by word (the definition the stacked test must match)."""
    blocks = len(data) // 32
    block = ((key_hash >> 32) * blocks) >> 32
    words = [int.from_bytes(data[32 * block + 4 * i : 32 * block + 4 * i + 4], "little") for i in range(8)]
    bits = [((key_hash & 0xFFFFFFFF) * salt & 0xFFFFFFFF) >> 27 for salt in SALTS]
    return all(word >> bit & 1 for word, bit in zip(words, bits, strict=True))


def test_filters_of_several_sizes_tested_together_answer_as_each_filter_alone():
    rng = np.random.default_rng(4)
    # Random filters of 1, 4 and 64 blocks, interleaved, dense enough that some hashes pass each, most do not.
    data = [np.packbits(rng.random(256 * blocks) < 0.8, bitorder="little").tobytes() for blocks in (4, 1, 64, 4, 64)]
    hashes = rng.integers(0, 2**63, 400, dtype=np.uint64) * np.uint64(2) + rng.integers(0, 2, 400, dtype=np.uint64)
    held = FilterStack([SplitBlockBloomFilter(d) for d in data]).held(hashes)
    expected = [[sbbf_holds(d, int(h)) for h in hashes] for d in data]
    assert held.tolist() == expected
    assert 0 < held.sum() < held.size
