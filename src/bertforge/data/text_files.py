"""Corpus input files: expanding files, folders and globs, and reading UTF-8 text line by line.

The edge between disk and text for every corpus reader (`data.corpus`, the vocabulary builder of the CLI):
which files a path, a folder or a pattern names, and their lines with any line ending, the byte-order mark
skipped, and a file that is not UTF-8 text refused with its file, line and the fix.
"""

from __future__ import annotations

import glob
import io
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from bertforge.data.files import undecodable_line
from bertforge.errors import DataError


def resolve_inputs(inputs: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """Expand files, folders (recursively, files in sorted order, hidden files skipped) and glob patterns.

    Args:
        inputs: one path or pattern, or several.

    Returns:
        The files, in the order given (each folder or pattern expanded in sorted order), without repeats.

    Raises:
        DataError: a path does not exist or a pattern matches no file.
    """
    items = [inputs] if isinstance(inputs, str | os.PathLike) else list(inputs)
    if not items:
        raise DataError("no input files given; pass a file, a folder or a glob pattern")
    files: list[Path] = []
    for item in items:
        text = os.fspath(item)
        path = Path(text)
        if path.is_file():
            found = [path]
        elif path.is_dir():
            found = _folder_files(path)
            if not found:
                raise DataError("the folder holds no files", path)
        elif glob.has_magic(text):
            found = sorted(Path(match) for match in glob.glob(text, recursive=True) if Path(match).is_file())
            if not found:
                raise DataError(f"the pattern {text!r} matches no file")
        else:
            raise DataError("no such file or folder", path)
        files.extend(found)
    unique = list(dict.fromkeys(files))
    return unique


def _folder_files(folder: Path) -> list[Path]:
    """Files under `folder` in sorted order, following symbolic links (but not a link back to a folder it is
    inside, which would loop), skipping hidden files and folders."""
    found = []
    for root, folders, names in os.walk(folder, followlinks=True):
        here = Path(root)
        ancestors = {os.path.realpath(folder / parent) for parent in here.relative_to(folder).parents}
        if os.path.realpath(here) in ancestors:
            folders[:] = []
            continue
        folders[:] = sorted(name for name in folders if not name.startswith("."))
        found += [here / name for name in names if not name.startswith(".") and (here / name).is_file()]
    return sorted(found)


def iter_lines(path: str | os.PathLike) -> Iterator[str]:
    """The lines of a UTF-8 text file without their line endings (``\\n``, ``\\r\\n`` or ``\\r``).

    A byte-order mark is skipped at the start of the file only (the "utf-8-sig" decoder drops U+FEFF as the
    first character of the stream): a BOM further on, e.g. where two files were concatenated, is text.

    Raises:
        DataError: the file cannot be read, holds a NUL byte (binary or UTF-16), or is not valid UTF-8; the
            message names the line and how to convert the file.
    """
    path = Path(path)
    try:
        handle = open(path, "rb")  # closed by the TextIOWrapper below
    except OSError as error:
        raise DataError(f"cannot read the file ({error.strerror})", path) from None
    # newline=None: universal newlines, so "\r\n" and a lone "\r" both end a line.
    with io.TextIOWrapper(handle, encoding="utf-8-sig", errors="strict", newline=None) as text:
        try:
            for number, line in enumerate(text, 1):
                if "\x00" in line:
                    raise DataError(
                        "holds a NUL byte: this is a binary file or UTF-16 text, not UTF-8 text; convert it "
                        "(e.g. iconv -f UTF-16 -t UTF-8) or remove it from the inputs",
                        path,
                        number,
                    )
                yield line.rstrip("\n")
        except UnicodeDecodeError:
            raise DataError(
                "is not valid UTF-8; convert the file to UTF-8 (e.g. iconv -f latin1 -t UTF-8 for a Latin-1 or "
                "Windows-1252 file, iconv -f GBK -t UTF-8 for Chinese text saved as GBK)",
                path,
                undecodable_line(path),
            ) from None
