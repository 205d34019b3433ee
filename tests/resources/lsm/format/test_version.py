"""Table versions: text form, parsing and order."""

import pytest

from resources.lsm import TableVersion
from resources.lsm.format.version import ShardPosition


def test_a_version_prints_and_parses_back():
    version = TableVersion(12, (ShardPosition(3, 7), ShardPosition(0, 0), ShardPosition(41, 1025)))
    assert str(version) == "12@3.7,0.0,41.1025"
    assert TableVersion.parse(str(version)) == version
    assert TableVersion.parse(version) is version


def test_later_versions_compare_greater():
    older = TableVersion(4, (ShardPosition(2, 9), ShardPosition(1, 3)))
    assert older < TableVersion(4, (ShardPosition(2, 9), ShardPosition(1, 4)))  # a write to shard 1
    assert older < TableVersion(5, (ShardPosition(2, 9), ShardPosition(1, 3)))  # a merge
    assert sorted([TableVersion.parse("5@1.1"), TableVersion.parse("4@9.9")])[0].base == 4


@pytest.mark.parametrize("text", ["", "12", "12@", "12@3", "a@1.2", "12@3.7;drop", "12@3.7,"])
def test_text_that_is_no_version_is_refused(text):
    with pytest.raises(ValueError, match="not a table version"):
        TableVersion.parse(text)
