"""`bertforge predict` over a stream: lines of text or JSONL in, one JSON result per line out, in order.

`predict_stream(pipeline, lines, out)` parses each line (`read_line`: a JSON object line is an input object, any
other line raw text), runs a pipeline (`inference.pipelines`) over them a chunk at a time, and names the source
and line of a bad input. `predict_corpus` runs it over the chunks of a file under torchrun.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import IO, Any

from bertforge.data.files import UntrustedJson, decode_json
from bertforge.errors import DataError, InputError


def read_line(line: str, source: str, number: int) -> Any:
    """A JSONL object line as a dict, any other line as raw text (trailing newline removed)."""
    text = line.rstrip("\r\n")
    if not text.lstrip().startswith("{") and any("\ud800" <= char <= "\udfff" for char in text):
        raise DataError("the line holds a lone surrogate, which is not a character; send valid Unicode text",
                        source, number)
    if text.lstrip().startswith("{"):
        try:
            value = decode_json(text)
        except UntrustedJson as error:
            raise DataError(f"line starts with '{{' but was refused: {error}; fix it or send plain text", source,
                            number) from None
        if not isinstance(value, dict):
            raise DataError("expected a JSON object", source, number)
        return value
    return text


def predict_stream(pipeline: Any, lines: Iterable[str], out: IO[str], *, source: str = "<stdin>",
                   chunk_size: int = 256, first_line: int = 1, **options: Any) -> int:
    """Run `pipeline` (a `family_pipelines.Pipeline`) over lines of text or JSONL and write one JSON result per input line.

    Each non-blank line is either raw text or a JSON object (`{"text": ...}`, `{"text": ..., "text_pair": ...}`,
    `{"question": ..., "context": ...}`); blank lines are skipped. An object's "id" field is copied into its
    result. Lines are processed in chunks of `chunk_size`, so memory stays bounded on endless input.
    `first_line` is the number of the first of `lines` in `source` (a part of a file, `predict_corpus`).

    Returns:
        The number of results written.

    Raises:
        DataError: a line is malformed or its input invalid (names `source` and the 1-based line).
    """
    merged = pipeline.check_options(options)
    written = 0
    pending: list[tuple[int, Any, Any]] = []  # (line number, parsed input, id)

    def flush() -> None:
        nonlocal written
        if not pending:
            return
        try:
            results = pipeline.run_parsed([p for _, p, _ in pending], merged)
        except InputError as error:
            # Inputs fail one at a time only in featurize; name the line by re-running them singly.
            for number, parsed, _ in pending:
                try:
                    pipeline.run_parsed([parsed], merged)
                except InputError as single:
                    raise DataError(str(single).removeprefix("input 0: "), source, number) from None
            raise DataError(str(error), source) from None
        lines = []
        for (number, _, ident), result in zip(pending, results):
            if ident is not None:
                result = {"id": ident, **result}
            try:  # NaN or infinity is not JSON: a broken model must not write an unreadable file
                lines.append(json.dumps(result, ensure_ascii=False, allow_nan=False) + "\n")
            except ValueError:
                raise DataError("the model gave a non-finite output (NaN or infinity) for this line; its weights "
                                "or its precision are broken, so nothing more is written (check the model "
                                "directory, or try --precision fp32)", source, number) from None
        out.writelines(lines)
        out.flush()
        written += len(pending)
        pending.clear()

    for number, line in enumerate(lines, start=first_line):
        if not line.strip():
            continue
        value = read_line(line, source, number)
        try:
            parsed = pipeline.parse(value)
        except InputError as error:
            raise DataError(str(error), source, number) from None
        pending.append((number, parsed, value.get("id") if isinstance(value, dict) else None))
        if len(pending) >= chunk_size:
            flush()
    flush()
    return written


__all__ = ["predict_stream", "read_line"]
