"""Extractive QA data: SQuAD v1.1/v2.0-format JSON (also CMRC 2018 and DRCD), answer repair, article splits.

Reading checks every gold answer against its context. When `context[answer_start:][:len(text)]` is not the
answer text (CMRC 2018 has 200 such answers), the span is recovered by searching the context for the text
and taking the occurrence nearest the given offset (`answers_repaired`); an answer whose text does not occur
at all is counted (`answers_unfound`) and kept for scoring only. An answerable question none of whose answers
can be located cannot be trained on: a `DataError` naming file, line and question id, or with
`on_invalid="skip"` it is left out of training, counted. Line numbers are found by searching the raw file for
the question id (JSON parsers do not keep positions).

Features, windows and answer decoding are the question-answering family's (`families.question_answering`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from bertforge.data.files import check_on_invalid, read_text
from bertforge.data.finetuning import DataReport
from bertforge.errors import DataError


@dataclass
class QAExample:
    """One question.

    Attributes:
        qid: question id.
        question, context: the texts.
        answers: every gold answer text (what scoring uses); empty for an unanswerable (v2.0) question.
        answer_start, answer_text: the training target (first locatable answer, offsets repaired), or None.
        is_impossible: SQuAD v2.0 unanswerable question.
        article: index of the article in its file (for article-level splits).
        source: "file:line (question id)", the line of the question id in the file.
    """

    qid: str
    question: str
    context: str
    answers: list[str]
    answer_start: int | None
    answer_text: str | None
    is_impossible: bool = False
    article: int = 0
    source: str = ""
    title: str = field(default="", repr=False)


def locate_answer(context: str, text: str, start: int) -> int | None:
    """The start of `text` in `context`: `start` if it matches there, else the occurrence nearest `start`.

    Returns None when `text` does not occur in `context` (or is empty).
    """
    if not text:
        return None
    if 0 <= start and context[start:start + len(text)] == text:
        return start
    best = None
    position = context.find(text)
    while position != -1:
        if best is None or abs(position - start) < abs(best - start):
            best = position
        position = context.find(text, position + 1)
    return best


_ID_KEY = re.compile(r'"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)')


def id_lines(raw: str) -> dict[str, int]:
    """1-based line of the first `"id": ...` of each id in the raw JSON text (JSON parsers keep no positions)."""
    lines: dict[str, int] = {}
    line, last = 1, 0
    for match in _ID_KEY.finditer(raw):
        line += raw.count("\n", last, match.start())
        last = match.start()
        lines.setdefault(str(json.loads(match.group(1))), line)
    return lines


def read_squad(
    path: str | os.PathLike,
    *,
    articles: Sequence[int] | None = None,
    labelled: bool = True,
    on_invalid: str = "error",
    report: DataReport | None = None,
) -> list[QAExample]:
    """Read a SQuAD-format JSON file (SQuAD v1.1/v2.0, CMRC 2018, DRCD).

    Args:
        path: the JSON file (``{"data": [{"title", "paragraphs": [{"context", "qas": [...]}]}]}``).
        articles: keep only these article indices (None: all).
        labelled: False reads questions only (answers, if any, are ignored): for prediction.
        on_invalid: "error" raises for an answerable question with no locatable answer; "skip" keeps it for
            scoring but without a training target (counted as `skipped_answers_unfound`).
        report: gets `rows` (questions), `answers_repaired`, `answers_unfound`, `skipped_*`.

    Returns:
        The questions in file order.

    Raises:
        DataError: unreadable, not UTF-8 or empty file, no questions at all, not SQuAD format (naming the
            missing key), or an unlocatable answer.
    """
    check_on_invalid(on_invalid)
    report = report if report is not None else DataReport()
    raw = read_text(path)
    try:
        dataset = json.loads(raw)
    except json.JSONDecodeError as error:
        raise DataError(f"not valid JSON ({error.msg}); pass a SQuAD-format JSON file", path, error.lineno) from None
    questions = _Questions(path, id_lines(raw), labelled, on_invalid, report)
    keep = None if articles is None else set(articles)
    examples: list[QAExample] = []
    try:
        for article_index, article in enumerate(dataset["data"]):
            if keep is not None and article_index not in keep:
                continue
            for paragraph in article["paragraphs"]:
                context = paragraph["context"]
                for qa in paragraph["qas"]:
                    title = str(article.get("title", ""))
                    examples.append(questions.example(qa, context, article_index, title))
                    report.note("rows")
    except (KeyError, TypeError, ValueError) as error:
        raise DataError(f"not SQuAD format: missing or malformed {error}; expected data[].paragraphs[] with "
                        "'context' and qas[] with 'id', 'question', 'answers'[{'text', 'answer_start'}]",
                        path) from None
    if not examples and keep is None:
        raise DataError("holds no questions (data[].paragraphs[].qas[] are all empty); is this the right file?",
                        path)
    return examples


@dataclass
class _Questions:
    """Turns a SQuAD file's questions into examples: its path and id lines (for every message), the reading
    options, and the report that counts repaired, unfound and skipped answers."""

    path: str | os.PathLike
    lines: dict[str, int]
    labelled: bool
    on_invalid: str
    report: DataReport

    def where(self, qid: str) -> str:
        return f"{os.fspath(self.path)}:{self.lines.get(qid)} ({qid})"

    def example(self, qa: dict, context: str, article: int, title: str) -> QAExample:
        """One question of a paragraph, its training target the first gold answer found in the context.

        Raises:
            DataError: an answerable question without answers, or (on_invalid="error") none of them found.
            KeyError, TypeError, ValueError: the question is not SQuAD format (the caller names the file).
        """
        qid = str(qa["id"])
        impossible = bool(qa.get("is_impossible", False)) and self.labelled
        answers = qa["answers"] if self.labelled and not impossible else []
        texts = [str(a["text"]) for a in answers]
        target_start, target_text = self._target(qid, context, answers)
        if self.labelled and not impossible and not texts:
            raise DataError(f"question {qid!r} has no answers and is not marked is_impossible; "
                            "SQuAD v1.1 needs an answer (v2.0: set is_impossible)", self.path, self.lines.get(qid))
        if texts and target_start is None:
            if self.on_invalid == "error":
                raise DataError(f"question {qid!r}: no answer text occurs in its context "
                                "(pass on_invalid='skip' / --on-invalid skip to train without it, "
                                "counted)", self.path, self.lines.get(qid))
            self.report.note("skipped_answers_unfound", self.where(qid))
        return QAExample(qid, qa["question"], context, texts, target_start, target_text, impossible, article,
                         f"{os.fspath(self.path)}:{self.lines.get(qid, 0)} ({qid})", title)

    def _target(self, qid: str, context: str, answers: Sequence[dict]) -> tuple[int | None, str | None]:
        """(start, text) of the first answer located in the context; every answer is checked and counted."""
        target_start = target_text = None
        for answer in answers:
            text, given = str(answer["text"]), int(answer["answer_start"])
            found = locate_answer(context, text, given)
            if found is None:
                self.report.note("answers_unfound", self.where(qid))
                continue
            if found != given:
                self.report.note("answers_repaired", self.where(qid))
            if target_start is None:
                target_start, target_text = found, text
        return target_start, target_text


def count_articles(path: str | os.PathLike) -> int:
    """How many articles a SQuAD-format file holds."""
    raw = read_text(path)
    try:
        return len(json.loads(raw)["data"])
    except (json.JSONDecodeError, KeyError, TypeError) as error:
        raise DataError(f"cannot read the article list ({error})", path) from None


def article_split(num_articles: int, eval_every: int = 4) -> tuple[list[int], list[int]]:
    """Deterministic (train, eval) article indices: every `eval_every`-th article (3, 7, 11, ...) is eval.

    For SQuAD v1.1 dev (48 articles) this gives 36 training and 12 evaluation articles, spread over the
    file rather than taken from one end.
    """
    eval_ids = [i for i in range(num_articles) if i % eval_every == eval_every - 1]
    train_ids = [i for i in range(num_articles) if i % eval_every != eval_every - 1]
    return train_ids, eval_ids
