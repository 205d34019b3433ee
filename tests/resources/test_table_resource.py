"""``LsmTableResource`` creates a table only where it was asked to, never among a user's files."""

from __future__ import annotations

import pytest

from resources.lsm import LsmTable, TableNotFoundError
from resources.table_resource import LsmTableResource


def test_a_mistyped_uri_fails_instead_of_creating_a_table(tmp_path, monkeypatch):
    monkeypatch.delenv("LSM_CREATE_TABLE", raising=False)
    with pytest.raises(TableNotFoundError, match="set create_if_missing"):
        LsmTableResource(uri=str(tmp_path / "tabel.lance")).open()
    assert not (tmp_path / "tabel.lance").exists()


def test_creation_is_explicit_or_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("LSM_CREATE_TABLE", raising=False)
    created = LsmTableResource(uri=str(tmp_path / "a.lance"), create_if_missing=True).open()
    assert created.primary_key == ["id"]
    monkeypatch.setenv("LSM_CREATE_TABLE", "true")
    assert LsmTableResource(uri=str(tmp_path / "b.lance")).open().primary_key == ["id"]
    monkeypatch.setenv("LSM_CREATE_TABLE", "false")
    with pytest.raises(TableNotFoundError):
        LsmTableResource(uri=str(tmp_path / "c.lance")).open()


def test_creation_refuses_a_folder_of_someone_elses_files(tmp_path):
    folder = tmp_path / "reports"
    folder.mkdir()
    (folder / "q3.xlsx").write_bytes(b"numbers")
    with pytest.raises(FileExistsError, match="non-empty folder that is not a table"):
        LsmTableResource(uri=str(folder), create_if_missing=True).open()
    assert [p.name for p in folder.iterdir()] == ["q3.xlsx"]
    with pytest.raises(TableNotFoundError):
        LsmTable.open(str(folder))
