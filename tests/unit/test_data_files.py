"""The file toolkit alone (`data.files`): byte-order marks, line ends, undecodable bytes, rows with their line
numbers, the bad-row policy, columns and id columns — without any reader on top."""

from __future__ import annotations

import pytest

from bertforge.data.files import (
    cell,
    check_on_invalid,
    default_id_column,
    detect_format,
    invalid,
    iter_lines,
    iter_rows,
    no_rows,
    not_utf8,
    open_text,
    parse_column,
    read_text,
)
from bertforge.data.finetuning import DataReport
from bertforge.errors import ConfigError, DataError

BOM = b"\xef\xbb\xbf"


def test_open_text_strips_a_leading_bom_only(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(BOM + "a\n\ufeffb\n".encode())
    with open_text(path) as handle:
        assert handle.read() == "a\n\ufeffb\n"  # the second BOM is data


def test_open_text_missing_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="file not found") as error:
        open_text(tmp_path / "missing.tsv")
    assert error.value.path == str(tmp_path / "missing.tsv")


def test_iter_lines_reads_crlf_and_keeps_blank_lines(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(BOM + b"one\r\n\r\ntwo\r\n")
    assert list(iter_lines(path)) == [(1, "one"), (2, ""), (3, "two")]


@pytest.mark.parametrize("file_format, text, rows", [
    ("tsv", "a\tb\r\n\r\nc\td\r\n", [(1, ["a", "b"]), (3, ["c", "d"])]),
    ("csv", 'a,"b\r\nc"\r\n\r\nd,e\r\n', [(2, ["a", "b\r\nc"]), (4, ["d", "e"])]),
    ("jsonl", '{"t": "x"}\r\n\r\n{"t": "y"}\r\n', [(1, {"t": "x"}), (3, {"t": "y"})]),
], ids=["tsv", "csv", "jsonl"])
def test_iter_rows_strips_bom_reads_crlf_and_numbers_lines(tmp_path, file_format, text, rows):
    path = tmp_path / f"t.{file_format}"
    path.write_bytes(BOM + text.encode())
    assert list(iter_rows(path, file_format)) == rows


def test_iter_rows_jsonl_bad_object_and_inner_bom_name_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"t": 1}\n{"t": \n', encoding="utf-8")
    with pytest.raises(DataError, match="not a JSON object") as error:
        list(iter_rows(path, "jsonl"))
    assert error.value.line == 2
    path.write_text('{"t": 1}\n\n\ufeff{"t": 2}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"byte-order mark \(U\+FEFF\) in the middle") as error:
        list(iter_rows(path, "jsonl"))
    assert error.value.line == 3


@pytest.mark.parametrize("file_format", ["tsv", "csv", "jsonl"])
def test_iter_rows_undecodable_line_is_reported_with_its_number(tmp_path, file_format):
    path = tmp_path / f"t.{file_format}"
    path.write_bytes(b"fine\r\nalso fine\r\ncaf\xe9\r\n")
    with pytest.raises(DataError, match="not UTF-8 text") as error:
        list(iter_rows(path, file_format))
    assert error.value.path == str(path) and error.value.line == 3
    assert f"iconv -f latin1 -t UTF-8 {path}" in str(error.value)


def test_not_utf8_recognises_utf16(tmp_path):
    path = tmp_path / "excel.txt"
    path.write_bytes("a\tb\r\n".encode("utf-16"))
    with pytest.raises(UnicodeDecodeError) as decode_error:
        path.read_text(encoding="utf-8")
    error = not_utf8(path, decode_error.value)
    assert "UTF-16 text" in str(error) and "iconv -f UTF-16 -t UTF-8" in str(error)


def test_read_text_refuses_empty_and_undecodable_files(tmp_path):
    path = tmp_path / "s.json"
    path.write_bytes(BOM + b"{}\r\n")
    assert read_text(path) == "{}\n"
    path.write_bytes(BOM + b" \r\n")
    with pytest.raises(DataError, match="is empty"):
        read_text(path)
    path.write_bytes(b"{\n\xff}\n")
    with pytest.raises(DataError, match="not UTF-8") as error:
        read_text(path)
    assert error.value.line == 2


def test_no_rows_names_the_header_line_when_there_is_one(tmp_path):
    header_only, empty = no_rows(tmp_path / "t.tsv", 1), no_rows(tmp_path / "t.tsv")
    assert "only the header row" in str(header_only) and header_only.line == 1
    assert "is empty" in str(empty) and empty.line is None


def test_invalid_skip_counts_in_the_report_and_error_raises(tmp_path):
    path = tmp_path / "t.tsv"
    report = DataReport()
    invalid(report, "skip", "empty_text", "text_a is missing or empty", path, 3)
    invalid(report, "skip", "empty_text", "text_a is missing or empty", path, 7)
    assert report["skipped_empty_text"] == 2
    assert report.samples["skipped_empty_text"] == [f"{path}:3", f"{path}:7"]
    with pytest.raises(DataError, match=r"text_a is missing or empty \(pass on_invalid='skip'") as error:
        invalid(report, "error", "empty_text", "text_a is missing or empty", path, 9)
    assert error.value.line == 9 and report["skipped_empty_text"] == 2


def test_check_on_invalid_rejects_unknown_policies():
    check_on_invalid("skip")
    with pytest.raises(ConfigError, match=r"on_invalid='drop'; use one of \('error', 'skip'\)"):
        check_on_invalid("drop")


def test_detect_format_from_suffix_or_given():
    assert [detect_format(name) for name in ("a.tsv", "a.txt", "a.CSV", "a.jsonl", "a.json", "a")] == [
        "tsv", "tsv", "csv", "jsonl", "jsonl", "tsv"]
    assert detect_format("a.txt", "csv") == "csv"
    with pytest.raises(ConfigError, match="file_format='xlsx' is not supported"):
        detect_format("a.xlsx", "xlsx")


def test_parse_column_and_cell_by_name_index_and_key():
    assert [parse_column(spec) for spec in ("3", "-1", " label ", 2, None)] == [3, -1, "label", 2, None]
    header = {"text": 0, "label": 1}
    assert cell(["hi", "1"], "label", header) == "1" and cell(["hi", "1"], -1, None) == "1"
    assert cell(["hi"], 5, None) is None
    assert cell({"t": "x"}, "t", None) == "x" and cell({"t": "x"}, 0, None) is None


def test_default_id_column_skips_names_other_roles_use():
    columns = {"text_a": "text", "label": "id", "id": None}
    assert default_id_column(["id", "qid", "text"], columns) == "qid"
    assert default_id_column(["text"], columns) is None


def test_decode_json_whole_numbers_are_integers_as_json_schema_counts_them():
    from bertforge.data.files import decode_json

    assert decode_json("[5.0, 1e3, -0.0, 2.5]") == [5.0, 1000.0, 0.0, 2.5]
    values = decode_json("[5.0, 1e3, -0.0, 2.5, 7]", whole_numbers=True)
    assert values == [5, 1000, 0, 2.5, 7] and [type(v) for v in values] == [int, int, int, float, int]
