"""Key hashes: one key hashed on Python ints agrees with many hashed by numpy, whatever table holds them."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings, strategies as st

from resources.lsm.read.key_hashes import key_hash, key_hashes

TEXT = st.text(alphabet=st.sampled_from("ab\x00é日"), max_size=40)
INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.tuples(TEXT, INT64), min_size=1, max_size=50), cut=st.integers(0, 50))
def test_numpy_and_python_hash_every_key_alike_in_any_table(keys, cut):
    table = pa.table({"s": [k[0] for k in keys], "i": [k[1] for k in keys]})
    hashes = key_hashes(table, ["s", "i"]).tolist()
    assert hashes == [key_hash(k) for k in keys]
    # A key hashes alike beside shorter or longer strings, in a slice, in chunks and as large strings.
    cut = min(cut, len(keys))
    chunked = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    assert key_hashes(chunked.slice(cut // 2), ["s", "i"]).tolist() == hashes[cut // 2 :]
    large = table.cast(pa.schema([pa.field("s", pa.large_string()), pa.field("i", pa.int64())]))
    assert key_hashes(large, ["s", "i"]).tolist() == hashes


def test_integers_hash_by_value_whatever_their_width():
    small = pa.table({"k": pa.array([-1, 7], pa.int32())})
    wide = pa.table({"k": pa.array([2**64 - 1, 7], pa.uint64())})  # -1 as 64 bits
    assert key_hashes(small, ["k"]).tolist() == key_hashes(wide, ["k"]).tolist() == [key_hash([-1]), key_hash([7])]


def test_the_columns_of_a_key_and_the_bytes_of_a_string_all_count():
    keys = [("a", 1), ("b", 1), ("a", 2), ("a\x00", 1), ("", 1), ("abcdefgh", 1), ("abcdefghi", 1)]
    hashes = {key_hash(k) for k in keys}
    assert len(hashes) == len(keys)
    assert key_hash(("a", 1)) != key_hash((1, "a"))
