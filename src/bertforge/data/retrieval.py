"""Retrieval evaluation sets and the labelled sentence pairs the embedding evaluations read.

Owns:

- `RetrievalSet`: a corpus (ids, titles, texts), queries (ids, texts) and qrels (query id -> {doc id:
  relevance}), the data of one retrieval evaluation.
- The BEIR folder layout, both ways (`read_beir`, `write_beir`): ``corpus.jsonl`` (one
  ``{"_id", "title", "text"}`` per line), ``queries.jsonl`` (``{"_id", "text"}``) and ``qrels/<split>.tsv``
  (header ``query-id<TAB>corpus-id<TAB>score``, one judgement per line). A bad line is a `DataError`
  naming file and line (or, with ``on_invalid="skip"``, dropped and counted in the `DataReport`).
- Retrieval sets from SQuAD-format QA files (SQuAD v1.1/v2.0, CMRC 2018, DRCD: `build_from_squad`): every
  question a query, every distinct paragraph a document, the question's own paragraph its one relevant
  document; optionally held apart by article from (question, paragraph) training pairs
  (`write_train_pairs`: a TSV ``anchor<TAB>positive`` that sentence-embedding training reads).
- Labelled sentence pairs (`read_sentence_pairs`): STS scores or 0/1 paraphrase labels from TSV, CSV or
  JSON Lines (GLUE's STS-B, MRPC, QQP and RTE files as shipped; LCQMC/AFQMC's headerless three columns),
  read through `data.classification`'s table reader (byte-order marks, CRLF, bad rows handled there).

Ids are strings throughout; a document's id from SQuAD is a hash of its text, so the same paragraph has the
same id in every set built from it (whatever files, fraction or seed).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from bertforge.data.classification import read_classification
from bertforge.data.files import (
    BOM,
    Column,
    check_on_invalid,
    detect_format,
    invalid,
    iter_lines,
    iter_rows,
    no_rows,
    parse_column,
    read_text,
)
from bertforge.data.finetuning import DataReport
from bertforge.data.question_answering import id_lines
from bertforge.errors import ConfigError, DataError
from bertforge.metrics.embedding import relevant_queries
from bertforge.storage import open_atomic, write_jsonl

QRELS_HEADER = ("query-id", "corpus-id", "score")
TRAIN_PAIRS_HEADER = ("anchor", "positive")
EVAL_CORPORA = ("all", "eval")


@dataclass
class RetrievalSet:
    """The data of one retrieval evaluation.

    Attributes:
        corpus_ids, corpus_titles, corpus_texts: [D] each; ids distinct, titles may be "".
        query_ids, query_texts: [Q] each; ids distinct.
        qrels: query id -> {document id: relevance}; relevance > 0 is relevant (see `metrics.embedding`).
        split: the qrels split's name (``qrels/<split>.tsv``).
    """

    corpus_ids: list[str]
    corpus_titles: list[str]
    corpus_texts: list[str]
    query_ids: list[str]
    query_texts: list[str]
    qrels: dict[str, dict[str, int]] = field(default_factory=dict)
    split: str = "test"

    def __post_init__(self) -> None:
        if not len(self.corpus_ids) == len(self.corpus_titles) == len(self.corpus_texts):
            raise DataError(f"a retrieval set needs one title and text per document id: {len(self.corpus_ids)} "
                            f"ids, {len(self.corpus_titles)} titles, {len(self.corpus_texts)} texts")
        if len(self.query_ids) != len(self.query_texts):
            raise DataError(f"{len(self.query_ids)} query ids for {len(self.query_texts)} query texts")
        for what, ids in (("document", self.corpus_ids), ("query", self.query_ids)):
            if len(set(ids)) != len(ids):
                raise DataError(f"{what} ids must be distinct")
            # The qrels TSV has no quoting: an id with a tab or line break could not be written back.
            bad = [i for i in ids if not isinstance(i, str) or not i or _one_line(i) != i]
            if bad:
                raise DataError(f"{what} id {bad[0]!r} must be a non-empty string without tabs or line breaks")

    def documents(self, with_title: bool = True) -> list[str]:
        """[D] texts to embed: ``"title text"`` (BEIR's usual input) when `with_title` and a title exists."""
        if not with_title:
            return list(self.corpus_texts)
        return [f"{title} {text}".strip() if title else text
                for title, text in zip(self.corpus_titles, self.corpus_texts)]

    def evaluated_queries(self) -> list[str]:
        """The query ids with a relevant document: those the retrieval figures average over."""
        return relevant_queries(self.query_ids, self.qrels)

    def summary(self) -> str:
        judgements = sum(len(docs) for docs in self.qrels.values())
        return (f"{len(self.corpus_ids)} documents, {len(self.query_ids)} queries "
                f"({len(self.evaluated_queries())} with a relevant document), {judgements} judgements")


# --- BEIR layout -----------------------------------------------------------------------------------------

def _records(path: Path, text_keys: tuple[str, ...], report: DataReport,
             on_invalid: str) -> Iterator[tuple[int, str, dict[str, str]]]:
    """(line, id, {key: text}) of each good record of a BEIR JSON Lines file; bad ones raise or are skipped."""
    seen: set[str] = set()
    count = 0
    for line, text in iter_lines(path):
        if not text.strip():
            continue
        count += 1
        row, problem = _json_line(text)
        problem = problem or _record_problem(row, text_keys, seen)
        if problem is not None:
            invalid(report, on_invalid, *problem, path, line)
            continue
        seen.add(str(row["_id"]))
        report.note(f"{path.stem}_rows")
        yield line, str(row["_id"]), {key: row.get(key) or "" for key in text_keys}
    if not count:
        raise no_rows(path)


def _record_problem(row: object, text_keys: tuple[str, ...], seen: set[str]) -> tuple[str, str] | None:
    """(reason, message) of a BEIR record that is not {"_id", "text"[, "title"]} with a new id, else None."""
    if not isinstance(row, dict):
        return "not_an_object", "expected a JSON object per line"
    identifier = row.get("_id")
    if isinstance(identifier, bool) or not isinstance(identifier, (str, int)) or not str(identifier).strip():
        return "missing_id", 'no "_id" (a non-empty string)'
    if not isinstance(row.get("text"), str):
        return "missing_text", 'no "text" string'
    if "title" in text_keys and not isinstance(row.get("title", ""), (str, type(None))):
        return "bad_title", '"title" must be a string'
    if str(identifier) in seen:
        return "duplicate_id", f"_id {str(identifier)!r} occurs on an earlier line too"
    return None


def _json_line(text: str) -> tuple[object, tuple[str, str] | None]:
    """(value, None) of one JSON Lines line, or (None, (reason, message)); read here rather than by
    `files.iter_rows` so that ``on_invalid="skip"`` can skip a line that is not JSON."""
    if text.startswith(BOM):
        return None, ("not_json", "a byte-order mark (U+FEFF) in the middle of the file (files joined together?)")
    try:
        return json.loads(text), None
    except json.JSONDecodeError as error:
        return None, ("not_json", f"not a JSON object ({error.msg}); a .jsonl file holds one object per line")


def _relevance(text: str) -> int | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return int(value) if value.is_integer() else None


def _read_qrels(path: Path, query_ids: set[str], doc_ids: set[str], report: DataReport,
                on_invalid: str) -> dict[str, dict[str, int]]:
    """qrels/<split>.tsv as query id -> {doc id: relevance}; the header line is optional."""
    qrels: dict[str, dict[str, int]] = {}
    header_line, judgements = None, 0
    for line, row in iter_rows(path, "tsv"):
        cells = [cell.strip() for cell in row]
        if header_line is None and not judgements and len(cells) == 3 and _relevance(cells[2]) is None:
            header_line = line  # BEIR's `query-id corpus-id score`, or any names
            continue
        judgements += 1
        problem = None
        if len(cells) != 3:
            problem = ("column_count", f"{len(cells)} columns; a qrels line is query-id<TAB>corpus-id<TAB>score")
        elif _relevance(cells[2]) is None:
            problem = ("bad_score", f"score {cells[2]!r} is not an integer relevance")
        elif cells[0] not in query_ids:
            problem = ("unknown_query", f"query-id {cells[0]!r} is not in queries.jsonl")
        elif cells[1] not in doc_ids:
            problem = ("unknown_document", f"corpus-id {cells[1]!r} is not in corpus.jsonl")
        elif cells[1] in qrels.get(cells[0], {}):
            problem = ("duplicate_judgement", f"({cells[0]}, {cells[1]}) is judged on an earlier line too")
        if problem is not None:
            invalid(report, on_invalid, *problem, path, line)
            continue
        qrels.setdefault(cells[0], {})[cells[1]] = _relevance(cells[2])
        report.note("qrels_rows")
    if not judgements:
        raise no_rows(path, header_line)
    return qrels


def read_beir(directory: str | os.PathLike, split: str = "test", *, on_invalid: str = "error",
              report: DataReport | None = None) -> RetrievalSet:
    """Read a BEIR-layout folder.

    Args:
        directory: holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv.
        split: which qrels file ("test", "dev", "train").
        on_invalid: "error" raises at the first bad line; "skip" drops it, counted as `skipped_<reason>`.
        report: gets `corpus_rows`, `queries_rows`, `qrels_rows` and the skipped lines.

    Returns:
        The set; every query of queries.jsonl is kept, judged or not (the figures use the judged ones).

    Raises:
        DataError: a missing file (naming the splits qrels/ has), an empty file, or a bad line (file:line):
            not JSON, no "_id" or "text", a repeated id, a qrels line with the wrong columns, a score that is
            no integer, or an id that corpus.jsonl / queries.jsonl does not have.
    """
    check_on_invalid(on_invalid)
    report = report if report is not None else DataReport()
    root = Path(directory)
    qrels_path = root / "qrels" / f"{split}.tsv"
    for path in (root / "corpus.jsonl", root / "queries.jsonl"):
        if not path.is_file():
            raise DataError("not found; a BEIR folder holds corpus.jsonl, queries.jsonl and qrels/<split>.tsv", path)
    if not qrels_path.is_file():
        splits = sorted(p.stem for p in (root / "qrels").glob("*.tsv"))
        raise DataError(f"not found; qrels/ has splits {splits} (choose one with split= / --split)", qrels_path)
    corpus = [(doc_id, record) for _, doc_id, record in
              _records(root / "corpus.jsonl", ("title", "text"), report, on_invalid)]
    queries = [(qid, record["text"]) for _, qid, record in
               _records(root / "queries.jsonl", ("text",), report, on_invalid)]
    qrels = _read_qrels(qrels_path, {qid for qid, _ in queries}, {doc_id for doc_id, _ in corpus}, report,
                        on_invalid)
    return RetrievalSet([doc_id for doc_id, _ in corpus], [str(r["title"]) for _, r in corpus],
                        [str(r["text"]) for _, r in corpus], [qid for qid, _ in queries],
                        [text for _, text in queries], qrels, split)


def write_beir(retrieval_set: RetrievalSet, directory: str | os.PathLike) -> Path:
    """Write the set as a BEIR folder (each file atomically: a crash leaves the old file or none).

    Returns:
        The folder.
    """
    root = Path(directory)
    write_jsonl(root / "corpus.jsonl", ({"_id": i, "title": t, "text": x} for i, t, x in
                                        zip(retrieval_set.corpus_ids, retrieval_set.corpus_titles,
                                            retrieval_set.corpus_texts)))
    write_jsonl(root / "queries.jsonl", ({"_id": i, "text": x} for i, x in
                                         zip(retrieval_set.query_ids, retrieval_set.query_texts)))
    with open_atomic(root / "qrels" / f"{retrieval_set.split}.tsv", newline="") as handle:
        handle.write("\t".join(QRELS_HEADER) + "\n")
        for qid, docs in retrieval_set.qrels.items():
            for doc_id, relevance in docs.items():
                handle.write(f"{_one_line(qid)}\t{_one_line(doc_id)}\t{int(relevance)}\n")
    return root


def _one_line(text: str) -> str:
    """A TSV cell: tabs and line breaks become spaces (the format has no quoting)."""
    return " ".join(str(text).replace("\t", " ").splitlines())


# --- SQuAD-format QA files -------------------------------------------------------------------------------

class SquadRetrieval(NamedTuple):
    """What `build_from_squad` returns: the evaluation set and the (question, paragraph) training pairs."""

    eval_set: RetrievalSet
    train_pairs: list[tuple[str, str]]


@dataclass
class _Paragraph:
    doc_id: str
    title: str
    context: str
    unit: tuple[int, int]  # (file, article) it first appeared in
    questions: list[tuple[str, str]] = field(default_factory=list)  # (query id, question)


def _doc_id(context: str) -> str:
    # A hash of the text: the same paragraph gets the same id in every set built from it.
    return "p" + hashlib.sha1(context.encode("utf-8")).hexdigest()[:16]


def _squad_articles(path: str | os.PathLike) -> tuple[list, dict[str, int]]:
    raw = read_text(path)
    try:
        dataset = json.loads(raw)
    except json.JSONDecodeError as error:
        raise DataError(f"not valid JSON ({error.msg}); pass a SQuAD-format JSON file", path, error.lineno) from None
    if not isinstance(dataset, dict) or not isinstance(dataset.get("data"), list):
        raise DataError('not SQuAD format: no "data" list of articles', path)
    return dataset["data"], id_lines(raw)


def _read_paragraphs(paths: Sequence[str | os.PathLike], report: DataReport,
                     unite: dict[tuple[int, int], tuple[int, int]]) -> dict[str, _Paragraph]:
    """Every distinct paragraph of the files with its questions (unanswerable v2.0 ones left out, counted).
    `unite` gets an edge between two articles that share a paragraph."""
    paragraphs: dict[str, _Paragraph] = {}
    taken: set[str] = set()
    for file_index, path in enumerate(paths):
        articles, lines = _squad_articles(path)
        try:
            for article_index, article in enumerate(articles):
                unit = (file_index, article_index)
                title = str(article.get("title", "") or "")
                for paragraph_index, paragraph in enumerate(article["paragraphs"]):
                    context = paragraph["context"]
                    if not isinstance(context, str) or not context.strip():
                        raise DataError(f"article {article_index} paragraph {paragraph_index} has an empty "
                                        "context", path)
                    if context not in paragraphs:
                        paragraphs[context] = _Paragraph(_doc_id(context), title, context, unit)
                    else:
                        _union(unite, unit, paragraphs[context].unit)
                    for number, qa in enumerate(paragraph["qas"]):
                        given = str(qa.get("id", "") or "")
                        where = f"{os.fspath(path)}:{lines.get(given, 0)} ({given or 'no id'})"
                        if qa.get("is_impossible"):
                            report.note("skipped_unanswerable", where)
                            continue
                        question = qa["question"]
                        if not isinstance(question, str) or not question.strip():
                            raise DataError(f"question {given!r} is empty", path, lines.get(given))
                        qid = _unique(given or f"{Path(path).stem}-{article_index}-{paragraph_index}-{number}",
                                      taken)
                        paragraphs[context].questions.append((qid, question))
                        report.note("questions")
        except (KeyError, TypeError, AttributeError) as error:
            raise DataError(f"not SQuAD format: missing or malformed {error}; expected data[].paragraphs[] with "
                            "'context' and qas[] with 'question' (and 'id')", path) from None
    if not any(p.questions for p in paragraphs.values()):
        raise DataError("the files hold no questions; are these SQuAD-format QA files?",
                        paths[0] if len(paths) == 1 else None)
    return paragraphs


def _unique(qid: str, taken: set[str]) -> str:
    # The same id in two files (or one file given twice) is two queries: the later ones get "#2", "#3".
    candidate, copy = qid, 1
    while candidate in taken:
        copy += 1
        candidate = f"{qid}#{copy}"
    taken.add(candidate)
    return candidate


def _root(unit: tuple[int, int], unite: dict[tuple[int, int], tuple[int, int]]) -> tuple[int, int]:
    while unit in unite:
        unit = unite[unit]
    return unit


def _union(unite: dict[tuple[int, int], tuple[int, int]], a: tuple[int, int], b: tuple[int, int]) -> None:
    """Put the article groups of `a` and `b` together (the earlier article is the group's root)."""
    root_a, root_b = _root(a, unite), _root(b, unite)
    if root_a != root_b:
        unite[max(root_a, root_b)] = min(root_a, root_b)


def _eval_units(paragraphs: dict[str, _Paragraph], unite: dict, eval_fraction: float,
                seed: int) -> set[tuple[int, int]]:
    """The article groups held out for evaluation: shuffled by `seed`, taken until they hold
    `eval_fraction` of the questions."""
    sizes: dict[tuple[int, int], int] = {}
    for paragraph in paragraphs.values():
        root = _root(paragraph.unit, unite)
        sizes[root] = sizes.get(root, 0) + len(paragraph.questions)
    units = sorted(sizes)
    random.Random(seed).shuffle(units)
    total, held, chosen = sum(sizes.values()), 0, set()
    for unit in units:
        if held >= eval_fraction * total:
            break
        chosen.add(unit)
        held += sizes[unit]
    if eval_fraction < 1 and len(chosen) == len(units):
        raise ConfigError(f"eval_fraction={eval_fraction} holds out every article ({len(units)} article groups); "
                          "use a smaller fraction or more files")
    return chosen


def build_from_squad(paths: str | os.PathLike | Sequence[str | os.PathLike], *, eval_fraction: float | None = None,
                     seed: int = 0, eval_corpus: str = "all", split: str = "test",
                     report: DataReport | None = None) -> SquadRetrieval:
    """A retrieval set from SQuAD-format QA files (SQuAD v1.1/v2.0, CMRC 2018, DRCD), with training pairs.

    Every question is a query (id: the file's question id; a repeated one gets "#2", ...), every distinct
    paragraph a document (id: a hash of its text; title: its article's title) and the question's own
    paragraph its one relevant document (relevance 1). SQuAD v2.0's unanswerable questions are left out
    (counted as `skipped_unanswerable`): their paragraph does not answer them.

    With `eval_fraction`, whole articles are held out for evaluation, chosen at random by `seed` until they
    hold that share of the questions; the questions of the other articles become (question, paragraph)
    training pairs. The split is by article, not by question, because questions of one article share
    paragraphs: a split by question would train on (question, paragraph) pairs whose paragraph is the
    relevant document of an evaluation question, so evaluation would measure recall of memorised
    paragraphs. Articles that share a paragraph (the same text in two files) are held out together, so no
    paragraph of an evaluation question is ever the positive of a training pair.

    Args:
        paths: one or more JSON files.
        eval_fraction: share of the questions (by article) to evaluate on, in (0, 1]; None: every question
            is a query and there are no training pairs.
        seed: the shuffle of articles (the same files, fraction and seed give the same split).
        eval_corpus: "all" (every paragraph, training ones as distractors) or "eval" (the held-out
            articles' paragraphs only).
        split: the qrels split's name.
        report: gets `questions` and `skipped_unanswerable`.

    Returns:
        (eval_set, train_pairs); train_pairs in file order.

    Raises:
        DataError: a file that is not SQuAD-format JSON (naming the file and what is missing), an empty
            question, no questions at all.
        ConfigError: eval_fraction outside (0, 1], or one that leaves no article for training.
    """
    if eval_fraction is not None and not 0 < eval_fraction <= 1:
        raise ConfigError(f"eval_fraction must be in (0, 1] (or None: no training pairs), got {eval_fraction}")
    if eval_corpus not in EVAL_CORPORA:
        raise ConfigError(f"eval_corpus={eval_corpus!r}; use one of {EVAL_CORPORA}")
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not paths:
        raise ConfigError("build_from_squad needs at least one SQuAD-format file")
    report = report if report is not None else DataReport()
    unite: dict[tuple[int, int], tuple[int, int]] = {}
    paragraphs = _read_paragraphs(paths, report, unite)
    held = None if eval_fraction is None or eval_fraction == 1 else _eval_units(paragraphs, unite, eval_fraction, seed)
    docs, queries, qrels, pairs = [], [], {}, []
    for paragraph in paragraphs.values():
        evaluated = held is None or _root(paragraph.unit, unite) in held
        if evaluated or eval_corpus == "all":
            docs.append(paragraph)
        for qid, question in paragraph.questions:
            if evaluated:
                queries.append((qid, question))
                qrels[qid] = {paragraph.doc_id: 1}
            else:
                pairs.append((question, paragraph.context))
    eval_set = RetrievalSet([p.doc_id for p in docs], [p.title for p in docs], [p.context for p in docs],
                            [qid for qid, _ in queries], [text for _, text in queries], qrels, split)
    return SquadRetrieval(eval_set, pairs)


# --- training pairs --------------------------------------------------------------------------------------

def write_train_pairs(path: str | os.PathLike, pairs: Sequence[tuple[str, str]]) -> int:
    """Write (anchor, positive) pairs as a TSV with the header ``anchor<TAB>positive``, atomically.

    Tabs and line breaks inside a text become spaces (TSV has no quoting).

    Returns:
        How many pairs were written.
    """
    with open_atomic(path, newline="") as handle:
        handle.write("\t".join(TRAIN_PAIRS_HEADER) + "\n")
        for anchor, positive in pairs:
            handle.write(f"{_one_line(anchor)}\t{_one_line(positive)}\n")
    return len(pairs)


def read_train_pairs(path: str | os.PathLike) -> list[tuple[str, str]]:
    """The (anchor, positive) pairs of a `write_train_pairs` file (any TSV/CSV/JSONL with those columns).

    Raises:
        DataError: as `data.classification.read_classification` (file:line of a bad row).
    """
    file_format = detect_format(path)
    rows = read_classification(path, text_a="anchor", text_b="positive", file_format=file_format)
    return [(row.text_a, row.text_b or "") for row in rows]


# --- labelled sentence pairs (STS, paraphrase) -----------------------------------------------------------

# Column names by role, first match wins: GLUE STS-B/RTE/WNLI (sentence1, sentence2, score | label), MRPC
# ("#1 String", "#2 String", Quality), QQP (question1, question2, is_duplicate), sentence-transformers'
# datasets (sentence1/sentence2/score, anchor/positive/label), text_a/text_b.
PAIR_COLUMNS = {
    "text_a": ("sentence1", "sentence_1", "#1 String", "question1", "text_a", "s1", "anchor", "premise"),
    "text_b": ("sentence2", "sentence_2", "#2 String", "question2", "text_b", "s2", "positive", "hypothesis"),
    "label": ("score", "similarity", "label", "is_duplicate", "Quality", "gold_label"),
}
# 0/1 paraphrase labels as files write them (numbers and GLUE's RTE/QNLI names, compared lower-cased).
BINARY_LABELS = {"1": 1, "0": 0, "true": 1, "false": 0, "yes": 1, "no": 0, "entailment": 1, "not_entailment": 0}


@dataclass
class SentencePairs:
    """Labelled pairs: [N] first sentences, [N] second sentences, [N] labels (scores, or 0/1), and where
    each came from ("file:line")."""

    sentences_a: list[str]
    sentences_b: list[str]
    labels: list[float]
    sources: list[str]


def _pair_columns(path: str | os.PathLike, file_format: str, given: dict[str, Column | None]) -> tuple[dict, bool]:
    """(role -> column, whether the first row is a header) for a pair file: the given columns, else the
    header's names (`PAIR_COLUMNS`), else a headerless three-column file's columns 0, 1, 2 (LCQMC, AFQMC)."""
    first = next(iter_rows(path, file_format), None)
    if first is None:
        raise no_rows(path)
    line, row = first
    names = [str(name).strip() for name in (row if isinstance(row, list) else row.keys())]
    known = {name for role_names in PAIR_COLUMNS.values() for name in role_names}
    header = file_format != "jsonl" and (any(isinstance(c, str) for c in given.values()) or bool(known & set(names)))
    if header or file_format == "jsonl":
        found = {role: given[role] if given[role] is not None else
                 next((name for name in PAIR_COLUMNS[role] if name in names), None) for role in PAIR_COLUMNS}
    else:
        # Headerless (LCQMC, AFQMC): sentence, sentence, label, when the first row's last cell is a label.
        defaults = {"text_a": 0, "text_b": 1, "label": 2} if len(row) == 3 and _is_label(row[2]) else {}
        found = {role: given[role] if given[role] is not None else defaults.get(role) for role in PAIR_COLUMNS}
    if all(column is not None for column in found.values()):
        return found, header
    raise DataError(f"cannot tell which columns hold the two sentences and the label (found {found}; the first "
                    f"row has {names[:12]}); name them (text_a=/text_b=/label=, or --text-a/--text-b/--label)",
                    path, line)


def _is_label(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return text.strip().lower() in BINARY_LABELS
    return True


def _binary(example) -> float:
    raw = str(example.label).strip().lower()
    if raw in BINARY_LABELS:
        return float(BINARY_LABELS[raw])
    try:
        value = float(raw)
    except ValueError:
        value = None
    if value in (0.0, 1.0):
        return value
    where, _, line = example.source.rpartition(":")
    raise DataError(f"label {example.label!r} is not a 0/1 pair label (use 0/1, true/false or "
                    "entailment/not_entailment)", where, int(line) if line.isdigit() else None)


def read_sentence_pairs(path: str | os.PathLike, *, binary: bool, text_a: Column | None = None,
                        text_b: Column | None = None, label: Column | None = None,
                        file_format: str | None = None) -> SentencePairs:
    """Read labelled sentence pairs: an STS file (scores) or a paraphrase file (0/1 labels).

    Columns are found by header name (`PAIR_COLUMNS`: GLUE's STS-B dev.tsv as shipped, with its ten columns
    and the score last, MRPC, QQP, RTE, sentence-transformers' sentence1/sentence2/score), else a
    headerless three-column file is read as sentence, sentence, label (LCQMC, AFQMC); or name them.

    Args:
        path: a .tsv/.txt (tab-separated, no quoting), .csv or .jsonl file.
        binary: labels are 0/1 (`BINARY_LABELS` spellings too) rather than real-valued scores.
        text_a, text_b, label: the columns (header name, JSON key or 0-based index), to override the search.
        file_format: "tsv", "csv" or "jsonl" (default: from the file name).

    Raises:
        DataError: missing, empty or non-UTF-8 file, columns that cannot be found, or a bad row (file:line:
            wrong column count, empty sentence, a score that is no number, a label that is not 0/1).
    """
    file_format = detect_format(path, file_format)
    given = {"text_a": parse_column(text_a), "text_b": parse_column(text_b), "label": parse_column(label)}
    columns, header = _pair_columns(path, file_format, given)
    rows = read_classification(path, text_a=columns["text_a"], text_b=columns["text_b"], label=columns["label"],
                               header=header if file_format != "jsonl" else None, regression=not binary,
                               file_format=file_format)
    labels = [_binary(row) if binary else float(row.label) for row in rows]
    return SentencePairs([row.text_a for row in rows], [row.text_b or "" for row in rows], labels,
                         [row.source for row in rows])
