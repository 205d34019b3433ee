"""Which landing files look completely written."""

from __future__ import annotations

from resources.lsm.ingest.landing import is_complete, list_landing_files


def test_tiny_and_empty_text_files_are_judged_without_error(tmp_path):
    (tmp_path / "a.csv").write_text("i\n")
    (tmp_path / "b.csv").write_text("")
    (tmp_path / "c.jsonl").write_text("{")
    files = {f.name: f for f in list_landing_files(str(tmp_path))}
    assert is_complete(files["a.csv"], settle_seconds=30)
    assert not is_complete(files["b.csv"], settle_seconds=0), "an empty file is still being written"
    assert not is_complete(files["c.jsonl"], settle_seconds=30) and is_complete(files["c.jsonl"], settle_seconds=0)
