"""The texts behind search hits: the records of the input `bertforge embed` read, found again by their place
in it (`bertforge search --show-text` / `--field`).

Owns: `record_texts` (the text, or another field, of chosen records of an embedding folder's input) and
`InputTexts` (every record's text in one pass, for an export). The
manifest records the input's path, how it was read (`CorpusSettings`) and each file's size and mtime; the
input is read again the same way and refused when a file changed since (the rows would no longer be the
records that were embedded). Memory: only the chosen records' texts are kept.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from bertforge.data.corpus_records import CorpusSettings, SourceFile, parse_record, read_records, source_files
from bertforge.errors import ConfigError


def input_settings(manifest: dict[str, Any]) -> tuple[CorpusSettings, bool]:
    """(how the input was read, whether it is a single file) from an embedding manifest."""
    settings = dict(manifest["input"]["settings"])
    single = bool(settings.pop("single_file"))
    return CorpusSettings(**settings), single


def checked_input(manifest: dict[str, Any], field: str | None = None,
                  ) -> tuple[list[SourceFile], CorpusSettings, bool]:
    """(the input's files, how they are read, whether it is a single file), each file checked against the
    manifest's record of it.

    Raises:
        ConfigError: the input is gone or changed since it was embedded (names the file and what to do).
    """
    path = Path(manifest["input"]["path"])
    if not path.exists():
        raise ConfigError(f"{path}: the input that was embedded is not there any more; --show-text and --field "
                          "read the texts from it")
    settings, single = input_settings(manifest)
    if field is not None:
        settings = replace(settings, text_column=field)
    sources = source_files(path, settings)
    now = {source.name: source.path.stat() for source in sources}
    for recorded in manifest["input"]["files"]:
        stat = now.get(recorded["name"])
        if stat is None or (stat.st_size, stat.st_mtime_ns) != (recorded["size"], recorded["mtime_ns"]):
            raise ConfigError(f"{path}: {recorded['name']} changed since it was embedded; its rows are no longer "
                              "the records that were embedded: embed it again (or search without --show-text)")
    return sources, settings, single


def record_texts(manifest: dict[str, Any], records: Iterable[int], field: str | None = None) -> dict[int, str]:
    """The text (or `field`, a TSV/CSV column or JSONL field) of each chosen record (0-based, in input order).

    Raises:
        ConfigError: the input is gone or changed since it was embedded (names the file and what to do).
        DataError: `field` is missing from a record or is not a string (names file:line).
    """
    wanted = set(records)
    sources, settings, single = checked_input(manifest, field)
    found: dict[int, str] = {}
    for index, record in enumerate(read_records(sources, settings)):
        if index in wanted:
            found[index] = parse_record(record, settings, single)[1]
            if len(found) == len(wanted):
                break
    return found


class InputTexts:
    """The texts of an embedded input's records read in one pass, for a reader that asks for them in input
    order (an export walking a folder's rows): a record before the last one asked restarts the pass. Memory:
    the last record's text.

    Raises:
        ConfigError: as `checked_input`, when opened.
    """

    def __init__(self, manifest: dict[str, Any]):
        self.sources, self.settings, self.single = checked_input(manifest)
        self.records: Iterator[Any] | None = None
        self.at, self.text = -1, ""

    def text_of(self, record: int) -> str:
        """Record `record`'s text (0-based, in input order)."""
        if self.records is None or record < self.at:
            self.records, self.at = iter(read_records(self.sources, self.settings)), -1
        while self.at < record:
            self.text = parse_record(next(self.records), self.settings, self.single)[1]
            self.at += 1
        return self.text


__all__ = ["InputTexts", "checked_input", "input_settings", "record_texts"]
