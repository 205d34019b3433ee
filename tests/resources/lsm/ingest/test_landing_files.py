"""Which landing files look completely written."""

from __future__ import annotations

from resources.lsm.ingest.landing import LandingLocation


def test_tiny_and_empty_text_files_are_judged_without_error(tmp_path):
    (tmp_path / "a.csv").write_text("i\n")
    (tmp_path / "b.csv").write_text("")
    (tmp_path / "c.jsonl").write_text("{")
    landing = LandingLocation(str(tmp_path))
    files = {f.name: f for f in landing.files()}
    assert landing.is_complete(files["a.csv"], settle_seconds=30)
    assert not landing.is_complete(files["b.csv"], settle_seconds=0), "an empty file is still being written"
    assert not landing.is_complete(files["c.jsonl"], settle_seconds=30)
    assert landing.is_complete(files["c.jsonl"], settle_seconds=0)


def test_rejected_lines_keep_their_text_and_true_line_numbers_blank_lines_counted(tmp_path):
    from resources.lsm.ingest.landing import read_landing_file

    (tmp_path / "a.jsonl").write_text('{"id": 1}\n\n\n{"id": 2\n{"id": 3}\n')
    read = read_landing_file(str(tmp_path / "a.jsonl"))
    assert [(r.row, r.record) for r in read.rejections] == [(3, '{"id": 2')]
    assert [read.file_row(i) for i in range(read.table.num_rows)] == [0, 4]

    (tmp_path / "b.csv").write_text("id,name\n1,a\n\n2,b,c\n3,c\n")
    read = read_landing_file(str(tmp_path / "b.csv"))
    assert [(r.row, r.reason, r.record) for r in read.rejections] == [(2, "line has 3 fields, the header 2", "2,b,c")]
    assert [read.file_row(i) for i in range(read.table.num_rows)] == [0, 3]
