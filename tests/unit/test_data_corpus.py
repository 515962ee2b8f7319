"""Tests of `bertforge.data.corpus`, `data.sentences` and `data.text_files`: formats, line endings, sentence
splitting, bad input and corpus warnings."""

from __future__ import annotations

import types
from itertools import islice
from pathlib import Path

import pytest

from bertforge.configuration import shared_data_root
from bertforge.data.corpus import CorpusStats, assign_documents, read_documents
from bertforge.data.sentences import detect_format, is_heading, split_sentences
from bertforge.data.text_files import resolve_inputs
from bertforge.errors import ConfigError, DataError

DATA = shared_data_root()
GOOGLE_STYLE = (
    "The cat sat on the mat.\nIt was a sunny day.\nThe dog ran away.\n\n"
    "A second document starts here.\nIt has two sentences.\n"
)


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_bytes(text.encode("utf-8"))
    return path


def sentences_of(path_or_paths, **kwargs) -> list[list[str]]:
    return [document.sentences for document in read_documents(path_or_paths, **kwargs)]


def test_corpus_sentences_format_blank_line_separates_documents(tmp_path):
    path = write(tmp_path / "c.txt", GOOGLE_STYLE)
    assert detect_format(path) == "sentences"
    documents = list(read_documents(path))
    assert [document.sentences for document in documents] == [
        ["The cat sat on the mat.", "It was a sunny day.", "The dog ran away."],
        ["A second document starts here.", "It has two sentences."],
    ]
    assert [document.line for document in documents] == [1, 5]
    assert documents[0].path == str(path)


@pytest.mark.parametrize("ending", ["\n", "\r\n", "\r"])
def test_corpus_any_line_ending_gives_same_documents(tmp_path, ending):
    path = write(tmp_path / "c.txt", GOOGLE_STYLE.replace("\n", ending))
    assert sentences_of(path) == sentences_of(write(tmp_path / "ref.txt", GOOGLE_STYLE))


def test_corpus_byte_order_mark_is_skipped(tmp_path):
    path = write(tmp_path / "c.txt", b"\xef\xbb\xbf" + GOOGLE_STYLE.encode())
    assert sentences_of(path)[0][0] == "The cat sat on the mat."


def test_corpus_wrapped_text_is_joined_and_split_into_sentences(tmp_path):
    text = (
        "CHAPTER I.\n\nIn the year 1878 I took my degree of Doctor of Medicine of the\n"
        "University of London. Mr. Holmes was not\nthere. He came later!\n\n"
        "A new paragraph begins. It ends here.\n\nCHAPTER II.\n\nThe second chapter.\n"
    )
    path = write(tmp_path / "book.txt", text)
    assert detect_format(path) == "text"
    assert sentences_of(path) == [
        ["CHAPTER I.", "In the year 1878 I took my degree of Doctor of Medicine of the University of London.",
         "Mr. Holmes was not there.", "He came later!", "A new paragraph begins.", "It ends here."],
        ["CHAPTER II.", "The second chapter."],
    ]


def test_corpus_documents_format_blank_line_ends_document(tmp_path):
    path = write(tmp_path / "news.txt", "First story. Two sentences.\n\nSecond story! Also two.\n")
    assert sentences_of(path, format="documents") == [
        ["First story.", "Two sentences."], ["Second story!", "Also two."]
    ]


def test_corpus_chinese_text_keeps_closing_quotes_and_joins_without_spaces(tmp_path):
    text = "第一回　开篇\r\n\r\n    他说：“你好！”我说：“好。”然后\r\n走了。真的吗？是的；对\r\n"
    path = write(tmp_path / "zh.txt", text)
    assert sentences_of(path) == [["第一回　开篇", "他说：“你好！”", "我说：“好。”", "然后走了。", "真的吗？", "是的；", "对"]]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Mr. Smith went to Washington. He said hi! Did he? Yes.",
         ["Mr. Smith went to Washington.", "He said hi!", "Did he?", "Yes."]),
        ("It costs 3.14 dollars, e.g. the price. J. R. R. Tolkien wrote it.",
         ["It costs 3.14 dollars, e.g. the price.", "J. R. R. Tolkien wrote it."]),
        ("He lived in the U.S. for years. Then he left.", ["He lived in the U.S. for years.", "Then he left."]),
        ("“Stop!” she cried. “Why?” He ran.", ["“Stop!” she cried.", "“Why?”", "He ran."]),
        ("Wait... What happened? nothing. ok", ["Wait...", "What happened? nothing. ok"]),
        ("He left ! '' Then she came .", ["He left ! ''", "Then she came ."]),
        ("此开卷第一回也．作者自云：因曾历过一番梦幻之后。", ["此开卷第一回也．", "作者自云：因曾历过一番梦幻之后。"]),
        ("「走吧。」他说……她笑了！你好!我很好?", ["「走吧。」", "他说……", "她笑了！", "你好!", "我很好?"]),
        ("", []),
    ],
)
def test_corpus_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_corpus_headings_detected():
    for line in ("CHAPTER IV.", "Chapter 12", "BOOK ONE: 1805", "Letter 3", "第十回 某某", "第一百二十回", "EPILOGUE"):
        assert is_heading(line), line
    for line in ("Part of the problem was his.", "Chapter and verse were quoted at length by everybody in the room "
                 "that evening, and nobody listened to any of it at all."):
        assert not is_heading(line), line


def test_corpus_nul_byte_raises_data_error_with_line(tmp_path):
    path = write(tmp_path / "bin.txt", b"fine line\nsecond\nbad \x00 byte\n")
    with pytest.raises(DataError, match="NUL byte") as error:
        list(read_documents(path))
    assert error.value.line == 3 and error.value.path == str(path)
    assert "UTF-8" in str(error.value)


def test_corpus_utf16_file_is_rejected_with_fix(tmp_path):
    path = write(tmp_path / "u16.txt", "hello world.\n".encode("utf-16"))
    with pytest.raises(DataError, match="convert"):
        list(read_documents(path))


def test_corpus_non_utf8_raises_data_error_with_line(tmp_path):
    path = write(tmp_path / "gbk.txt", b"line one.\r\nline two.\r\n" + "中文".encode("gbk") + b"\n")
    with pytest.raises(DataError, match="not valid UTF-8") as error:
        list(read_documents(path))
    assert error.value.line == 3
    assert "iconv" in str(error.value)


def test_corpus_empty_file_is_skipped_with_warning(tmp_path):
    empty = write(tmp_path / "a_empty.txt", "\n  \n")
    full = write(tmp_path / "b.txt", GOOGLE_STYLE)
    stats = CorpusStats()
    assert len(list(read_documents([empty, full], stats=stats))) == 2
    assert stats.empty_files == [str(empty)]
    assert any("empty file" in warning for warning in stats.warnings())


def test_corpus_no_document_breaks_warned_and_cut_at_headings(tmp_path):
    lines = ["CHAPTER I"] + [f"Sentence number {i} is here." for i in range(30)]
    lines += ["CHAPTER II"] + [f"Another sentence {i} follows." for i in range(30)]
    path = write(tmp_path / "nobreaks.txt", "\n".join(lines) + "\n")
    stats = CorpusStats()
    documents = sentences_of(path, stats=stats)
    assert [document[0] for document in documents] == ["CHAPTER I", "CHAPTER II"]
    assert stats.files_without_breaks == [str(path)]
    assert any("no blank line between documents" in warning for warning in stats.warnings())


def test_corpus_long_documents_cut_at_max_document_sentences(tmp_path):
    path = write(tmp_path / "c.txt", "\n".join(f"Sentence {i} here." for i in range(25)) + "\n")
    documents = sentences_of(path, max_document_sentences=10)
    assert [len(document) for document in documents] == [10, 10, 5]


def test_corpus_duplicates_counted_and_warned(tmp_path):
    block = "\n".join(f"This is a distinct sentence number {i}." for i in range(50))
    path = write(tmp_path / "dupes.txt", block + "\n\n" + block + "\n")
    stats = CorpusStats()
    list(read_documents(path, stats=stats))
    assert stats.checked_sentences == 100
    assert stats.duplicate_sentences == 50
    assert stats.first_duplicate == f"{path}:52"
    assert any("duplicates" in warning and "stuck near 7" in warning for warning in stats.warnings())


def test_corpus_separator_lines_are_not_duplicates(tmp_path):
    path = write(tmp_path / "c.txt", "One sentence here is long.\n*     *     *     *     *\n" * 3)
    stats = CorpusStats()
    list(read_documents(path, stats=stats))
    assert stats.duplicate_sentences == 2 and stats.checked_sentences == 3


def test_corpus_single_sentence_documents_warned(tmp_path):
    path = write(tmp_path / "c.txt", "\n\n".join(f"Only one sentence {i} in this document." for i in range(10)))
    stats = CorpusStats()
    list(read_documents(path, format="sentences", stats=stats))
    assert stats.single_sentence_documents == 10
    assert any("one sentence" in warning for warning in stats.warnings())


def test_corpus_inputs_folder_glob_and_missing(tmp_path):
    b = write(tmp_path / "dir" / "b.txt", GOOGLE_STYLE)
    a = write(tmp_path / "dir" / "sub" / "a.txt", GOOGLE_STYLE)
    write(tmp_path / "dir" / ".hidden" / "x.txt", GOOGLE_STYLE)
    assert resolve_inputs(tmp_path / "dir") == [b, a]
    assert resolve_inputs(str(tmp_path / "dir" / "**" / "*.txt")) == sorted([a, b])
    assert resolve_inputs([b, b]) == [b]
    with pytest.raises(DataError, match="no such file"):
        resolve_inputs(tmp_path / "missing.txt")
    with pytest.raises(DataError, match="matches no file"):
        resolve_inputs(str(tmp_path / "*.none"))
    with pytest.raises(DataError, match="no input files"):
        resolve_inputs([])


def test_corpus_rejects_bad_options(tmp_path):
    path = write(tmp_path / "c.txt", GOOGLE_STYLE)
    with pytest.raises(ConfigError, match="format"):
        list(read_documents(path, format="csv"))
    with pytest.raises(ConfigError, match="max_document_sentences"):
        list(read_documents(path, max_document_sentences=0))


def test_corpus_reading_is_streamed(tmp_path):
    path = write(tmp_path / "c.txt", GOOGLE_STYLE * 3)
    stats = CorpusStats()
    stream = read_documents(path, stats=stats)
    assert isinstance(stream, types.GeneratorType)
    next(stream)
    assert stats.documents == 1  # one document produced, the rest not read yet


def test_corpus_assign_documents_partitions_deterministically(tmp_path):
    path = write(tmp_path / "c.txt", "\n\n".join(f"Doc {i} first.\nDoc {i} second." for i in range(10)))
    parts = [[d.sentences[0] for d in assign_documents(read_documents(path, format="sentences"), k, 3)] for k in range(3)]
    assert parts[0] == ["Doc 0 first.", "Doc 3 first.", "Doc 6 first.", "Doc 9 first."]
    assert sorted(sum(parts, [])) == sorted(f"Doc {i} first." for i in range(10))
    with pytest.raises(ConfigError):
        assign_documents(read_documents(path), 3, 3)


@pytest.mark.skipif(not (DATA / "pretrain_en").is_dir(), reason="shared pretraining data not available")
def test_corpus_real_english_slice():
    nltk = DATA / "pretrain_en" / "nltk_gutenberg" / "austen-emma.txt"
    book = DATA / "pretrain_en" / "books" / "sherlock_holmes_canon.txt"
    assert detect_format(nltk) == "sentences"
    assert detect_format(book) == "text"
    documents = list(islice(read_documents([book]), 3))
    sentences = [sentence for document in documents for sentence in document.sentences]
    assert len(sentences) > 100
    # Wrapped lines were joined: most sentences end with sentence punctuation (or a closing quote).
    ending = sum(sentence.rstrip("\"'”’)_").endswith((".", "!", "?")) for sentence in sentences)
    assert ending / len(sentences) > 0.9
    assert all("\n" not in sentence for sentence in sentences)


@pytest.mark.skipif(not (DATA / "pretrain_zh").is_dir(), reason="shared pretraining data not available")
def test_corpus_real_chinese_slice():
    path = DATA / "pretrain_zh" / "hongloumeng.txt"  # CRLF line ends, fullwidth full stops
    assert detect_format(path) == "text"
    documents = list(islice(read_documents(path), 3))
    assert documents[1].sentences[0].startswith("第")  # chapters start documents
    sentences = [sentence for document in documents for sentence in document.sentences]
    assert len(sentences) > 200
    assert not any("\r" in sentence for sentence in sentences)
    ending = sum(sentence.rstrip("”’」』\"").endswith(tuple("。！？；．…")) for sentence in sentences)
    assert ending / len(sentences) > 0.8


# --- the files people have: a byte-order mark at the start of the file only ---------------------------------

BOM = b"\xef\xbb\xbf"


def test_corpus_bom_and_crlf_as_shipped_give_the_same_documents_and_format(tmp_path):
    path = write(tmp_path / "c.txt", BOM + GOOGLE_STYLE.replace("\n", "\r\n").encode())
    assert detect_format(path) == "sentences"
    documents = list(read_documents(path))
    assert [d.sentences for d in documents] == sentences_of(write(tmp_path / "ref.txt", GOOGLE_STYLE))
    assert [d.line for d in documents] == [1, 5]
    assert not any("\ufeff" in s or "\r" in s for d in documents for s in d.sentences)


def test_corpus_bom_of_every_file_skipped_but_one_in_the_middle_is_text(tmp_path):
    first = write(tmp_path / "a.txt", BOM + b"First file line one.\r\nLine two.\r\n")
    second = write(tmp_path / "b.txt", BOM + b"Second file.\r\n\r\n" + BOM + b"Joined after a BOM.\r\n")
    assert sentences_of([first, second], format="sentences") == [
        ["First file line one.", "Line two."], ["Second file."], ["\ufeffJoined after a BOM."]]


def test_corpus_file_of_only_a_bom_is_empty(tmp_path):
    empty = write(tmp_path / "a_bom.txt", BOM + b"\r\n")
    full = write(tmp_path / "b.txt", GOOGLE_STYLE)
    stats = CorpusStats()
    assert len(list(read_documents([empty, full], stats=stats))) == 2
    assert stats.empty_files == [str(empty)] and detect_format(empty) == "empty"


def test_corpus_latin1_file_names_line_and_fix(tmp_path):
    path = write(tmp_path / "latin1.txt", BOM + b"Plain line.\r\nCaf\xe9 cr\xe8me.\r\n")
    with pytest.raises(DataError, match="not valid UTF-8.*iconv -f latin1 -t UTF-8") as error:
        list(read_documents(path))
    assert error.value.line == 2 and error.value.path == str(path)
