"""Vector search across LSM levels (recall against brute force, newest versions only) and the
full-text index declared at creation."""

from __future__ import annotations

import lance
import numpy as np
import pyarrow as pa
import pytest

from resources.lsm import VectorIndex, train_vector_index
from resources.lsm.testing.changegen import events_schema

DIM = 16
SCHEMA = events_schema(vector_dim=DIM, with_text=True)
INDEX = VectorIndex("embedding", num_partitions=8, num_sub_vectors=4)


def rows(ids, vectors: np.ndarray, label: str) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "customer": [label] * len(ids),
            "amount": [float(i) for i in ids],
            "status": ["new"] * len(ids),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(vectors.astype(np.float32).ravel()), DIM),
            "description": [f"{label} order {i}" for i in ids],
        }
    )


def clustered(rng: np.random.Generator, n: int) -> np.ndarray:
    centers = np.random.default_rng(0).standard_normal((16, DIM)) * 4
    return centers[rng.integers(0, len(centers), n)] + rng.standard_normal((n, DIM))


@pytest.fixture
def table(make_table):
    """Base of 3000 trained rows, a generation rewriting 0..599, a WAL tail rewriting 600..699."""
    rng = np.random.default_rng(1)
    t = make_table(SCHEMA, num_shards=2, vector_index=INDEX, fts_column="description")
    t.write(rows(range(3000), clustered(rng, 3000), "base"))
    t.close()
    t.compact()
    assert train_vector_index(t.dataset())
    t.write(rows(range(600), clustered(rng, 600), "gen"))
    t.close()
    t.write(rows(range(600, 700), clustered(rng, 100), "tail"))
    assert sum(s.unflushed_wal_entries for s in t.shards()) > 0
    return t


def brute_force(t, query: np.ndarray, k: int, filter: str | None = None) -> list[int]:
    view = t.read(columns=["id", "embedding"], filter=filter)
    vectors = np.stack(view["embedding"].to_numpy(zero_copy_only=False))
    return view["id"].to_numpy()[np.argsort(((vectors - query) ** 2).sum(axis=1))[:k]].tolist()


def test_recall_against_brute_force_across_levels(table):
    rng = np.random.default_rng(2)
    hits = total = 0
    for query in clustered(rng, 20):
        found = table.search(query, k=10)
        assert found.num_rows == 10
        assert found["_distance"].to_pylist() == sorted(found["_distance"].to_pylist())
        hits += len(set(found["id"].to_pylist()) & set(brute_force(table, query, 10)))
        total += 10
    assert hits / total >= 0.9


def test_returns_only_the_newest_version_of_each_key(table):
    old_vector = np.stack(
        table.dataset().to_table(columns=["embedding"], filter="id = 5")["embedding"].to_numpy(zero_copy_only=False)
    )[0]
    found = table.search(old_vector, k=20, columns=["id", "customer"])
    assert len(set(found["id"].to_pylist())) == found.num_rows
    current = {r["id"]: r["customer"] for r in table.read(columns=["id", "customer"]).to_pylist()}
    assert all(current[r["id"]] == r["customer"] for r in found.to_pylist())
    assert not any(r["id"] == 5 and r["_distance"] == 0 for r in found.to_pylist())


def test_wal_tail_rows_are_found_and_deletes_hidden(table):
    tail_row = table.lookup([650], columns=["embedding"])
    query = np.asarray(tail_row["embedding"][0].as_py(), np.float32)
    found = table.search(query, k=5, columns=["id", "customer"])
    assert found["id"][0].as_py() == 650 and found["customer"][0].as_py() == "tail"
    assert found["_distance"][0].as_py() == pytest.approx(0.0, abs=1e-4)

    table.write(pa.table({"id": pa.array([650], pa.int64()), "_op": ["delete"]}))
    assert 650 not in table.search(query, k=5)["id"].to_pylist()
    stale = table.search(query, k=1, fresh=False, columns=["customer"])
    assert stale["customer"][0].as_py() != "tail" and stale["_distance"][0].as_py() > 1e-4


def test_filter_applies_to_the_newest_version(table):
    rng = np.random.default_rng(3)
    for query in clustered(rng, 5):
        found = table.search(query, k=10, filter="customer = 'base'", columns=["id", "customer"])
        assert set(found["customer"].to_pylist()) == {"base"}
        assert not set(found["id"].to_pylist()) & set(range(700))
        expected = brute_force(table, query, 10, filter="customer = 'base'")
        assert len(set(found["id"].to_pylist()) & set(expected)) >= 8


def test_create_validates_the_index_request(make_table):
    with pytest.raises(ValueError, match="fixed_size_list"):
        make_table(SCHEMA, name="bad", vector_index=VectorIndex("customer"))
    with pytest.raises(ValueError, match="divide"):
        make_table(SCHEMA, name="bad2", vector_index=VectorIndex("embedding", num_sub_vectors=5))
    with pytest.raises(ValueError, match="no vector index"):
        make_table(SCHEMA, name="plain").search(np.zeros(DIM), k=1)


TEXT_SCHEMA = events_schema(with_text=True)


def text_rows(ids, description) -> pa.Table:
    ids = list(ids)
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "customer": ["c"] * len(ids),
            "amount": [1.0] * len(ids),
            "status": ["new"] * len(ids),
            "description": [description(i) for i in ids],
        }
    )


def inverted_indexes(dataset) -> list[list[str]]:
    return [index["fields"] for index in dataset.list_indices() if index["type"] == "Inverted"]


def test_full_text_index_is_created_kept_in_generations_and_caught_up_by_merges(make_table):
    t = make_table(TEXT_SCHEMA, num_shards=2, fts_column="description")
    assert inverted_indexes(t.dataset()) == [["description"]]

    t.write(text_rows(range(200), lambda i: "a rare zebra order" if i == 42 else f"order {i} of apples"))
    t.close()
    for shard in t.shards():
        for _, directory in shard.pending_generations:
            generation = lance.dataset(f"{t.uri}/_mem_wal/{shard.shard_id}/{directory}")
            assert inverted_indexes(generation) == [["description"]]

    t.compact()
    stats = t.dataset().stats.index_stats("description_idx")
    assert (stats["num_indexed_rows"], stats["num_unindexed_rows"]) == (200, 0)
    found = t.dataset().to_table(full_text_query="zebra", columns=["id", "description"])
    assert found["id"].to_pylist() == [42]
    assert t.dataset().to_table(full_text_query="apples", columns=["id"]).num_rows == 199

    t.write(text_rows([7], lambda i: "now a zebra too"))  # only in the WAL
    assert t.dataset().to_table(full_text_query="zebra", columns=["id"])["id"].to_pylist() == [42]
    merged = t.read(columns=["id"], filter="description LIKE '%zebra%'")["id"].to_pylist()
    assert sorted(merged) == [7, 42]


def test_create_refuses_a_full_text_column_that_is_not_text(make_table):
    for column in ("amount", "missing"):
        with pytest.raises(ValueError, match="full-text column"):
            make_table(TEXT_SCHEMA, name=f"bad_{column}", fts_column=column)
