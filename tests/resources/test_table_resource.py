"""``LsmTableResource`` creates a table only where it was asked to, never among a user's files."""

from __future__ import annotations

import pyarrow as pa
import pytest

from resources.declared_table import DeclaredTable
from resources.lsm import LsmTable, TableNotFoundError
from resources.table_resource import LsmTableResource, TableDeclarationError


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


def _orders(tmp_path, **changes) -> DeclaredTable:
    declaration = {
        "name": "orders",
        "uri": str(tmp_path / "orders.lance"),
        "columns": [
            {"name": "order_id", "type": "int64"},
            {"name": "customer", "type": "string", "nullable": False},
            {"name": "amount", "type": "decimal128(12, 2)"},
        ],
        "primary_key": ["order_id"],
        "shards": 2,
        "declaration_file": "tables/orders/defs.yaml",
    }
    return DeclaredTable(**{**declaration, **changes})


def test_a_declared_table_is_created_from_its_declaration_on_first_use(tmp_path):
    table = LsmTableResource.for_table(_orders(tmp_path)).open()
    assert table.primary_key == ["order_id"] and table.num_shards == 2
    assert table.schema.field("amount").type == pa.decimal128(12, 2)
    assert not table.schema.field("customer").nullable and not table.schema.field("order_id").nullable
    # Opened again, it is the same table: nothing is created twice.
    table.write(pa.table({"order_id": [1], "customer": ["a"], "amount": pa.array([1], pa.decimal128(12, 2))}))
    assert LsmTableResource.for_table(_orders(tmp_path)).open().count() == 1


@pytest.mark.parametrize(
    ("change", "difference"),
    [
        ({"primary_key": ["customer"]}, "primary key ['customer'] is declared, the table's is ['order_id']"),
        ({"columns": [{"name": "order_id", "type": "int64"}, {"name": "customer", "type": "string"}]},
         "column 'amount' (decimal128(12, 2)) is in the table but not declared"),
        ({"columns": [{"name": "order_id", "type": "string"}, {"name": "customer", "type": "string"},
                      {"name": "amount", "type": "decimal128(12, 2)"}]},
         "column 'order_id' is declared string, the table holds int64"),
        ({"columns": [{"name": "order_id", "type": "int64"}, {"name": "customer", "type": "string"},
                      {"name": "amount", "type": "decimal128(12, 2)"}, {"name": "note", "type": "string"}]},
         "columns ['note'] are declared but not in the table (set evolve: true to add them)"),
    ],
    ids=["key", "column-removed", "type", "new-column-without-evolve"],
)  # fmt: skip
def test_a_declaration_that_disagrees_with_its_table_fails_before_writing_anything(tmp_path, change, difference):
    LsmTableResource.for_table(_orders(tmp_path)).open().close()
    versions = sorted(p.name for p in (tmp_path / "orders.lance" / "_versions").iterdir())

    with pytest.raises(TableDeclarationError) as raised:
        LsmTableResource.for_table(_orders(tmp_path, **change)).open()

    assert "tables/orders/defs.yaml" in str(raised.value) and difference in str(raised.value)
    assert sorted(p.name for p in (tmp_path / "orders.lance" / "_versions").iterdir()) == versions


def test_new_nullable_columns_are_added_when_the_declaration_opts_in_to_evolution(tmp_path):
    LsmTableResource.for_table(_orders(tmp_path)).open().write(
        pa.table({"order_id": [1], "customer": ["a"], "amount": pa.array([1], pa.decimal128(12, 2))})
    )
    evolved = _orders(tmp_path, evolve=True)
    columns = [*evolved.columns, {"name": "note", "type": "string"}]
    table = LsmTableResource.for_table(DeclaredTable(**{**evolved.model_dump(), "columns": columns})).open()
    assert table.schema.names == ["order_id", "customer", "amount", "note"]
    assert table.read().to_pylist()[0]["note"] is None


def test_the_default_table_keeps_its_own_schema(tmp_path, monkeypatch):
    """The environment's table is not checked against the default columns: an existing table is served as it is."""
    existing = LsmTable.create(str(tmp_path / "items.lance"), pa.schema([("sku", pa.string())]), ["sku"], num_shards=1)
    assert LsmTableResource(uri=existing.uri).open().primary_key == ["sku"]


def _nullable_orders(tmp_path, **changes) -> DeclaredTable:
    columns = [{**c.model_dump(), "nullable": True} for c in _orders(tmp_path).columns]
    return _orders(tmp_path, columns=columns, **changes)


def test_a_partial_update_declaration_creates_a_partial_update_table(tmp_path):
    table = LsmTableResource.for_table(_nullable_orders(tmp_path, merge_engine="partial-update")).open()
    table.write(pa.table({"order_id": [1], "customer": ["a"], "amount": pa.array([5], pa.decimal128(12, 2))}))
    table.write(pa.table({"order_id": [1], "customer": ["b"]}))  # amount not given: kept
    assert table.merge_engine == "partial-update"
    assert table.read().to_pylist() == [{"order_id": 1, "customer": "b", "amount": 5}]


def test_a_declared_merge_engine_the_table_does_not_have_fails_before_writing_anything(tmp_path):
    LsmTableResource.for_table(_nullable_orders(tmp_path)).open().close()
    with pytest.raises(TableDeclarationError, match="merge_engine is 'last-write-wins' in the table"):
        LsmTableResource.for_table(_nullable_orders(tmp_path, merge_engine="partial-update")).open()


def test_a_partial_update_declaration_with_a_required_column_is_refused_at_load(tmp_path):
    with pytest.raises(
        ValueError, match=r"merge_engine: partial-update needs nullable non-key columns; \['customer'\]"
    ):
        _orders(tmp_path, merge_engine="partial-update")
