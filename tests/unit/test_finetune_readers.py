"""Fine-tuning readers: GLUE-style tables, CSV/JSONL, CoNLL and character-per-line BIO, SQuAD-format JSON,
SWAG-style multiple choice — well-formed files and every kind of malformed row, with file:line in errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.configuration import shared_data_root
from bertforge.data.classification import check_labels, label_list, read_classification, sorted_labels
from bertforge.data.finetuning import DataReport
from bertforge.data.multiple_choice import read_choice
from bertforge.data.question_answering import article_split, count_articles, locate_answer, read_squad
from bertforge.data.tagging import check_tag_labels, read_tagged, tag_list
from bertforge.errors import ConfigError, DataError

DATA = shared_data_root()


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


# --- tables -----------------------------------------------------------------------------------------------

def test_read_classification_header_by_name(tmp_path):
    path = write(tmp_path / "train.tsv", "sentence\tlabel\nit 's \"good\" \t1\nbad\t0\n")
    examples = read_classification(path, text_a="sentence", label="label")
    assert [(e.text_a, e.label) for e in examples] == [('it \'s "good" ', "1"), ("bad", "0")]
    assert examples[1].source == f"{path}:3"


def test_read_classification_no_header_by_index(tmp_path):
    path = write(tmp_path / "cola.tsv", "gj04\t1\t\tOur friends won't buy it.\ngj04\t0\t*\tThe more.\n")
    examples = read_classification(path, text_a=3, label="1")  # "1" from a command line is an index
    assert [(e.text_a, e.label) for e in examples] == [("Our friends won't buy it.", "1"), ("The more.", "0")]


def test_read_classification_regression_score_in_last_column(tmp_path):
    path = write(tmp_path / "stsb.tsv", "index\tsentence1\tsentence2\tscore\n0\tA plane.\tAn air plane.\t5.000\n")
    (example,) = read_classification(path, text_a="sentence1", text_b="sentence2", label=-1, regression=True)
    assert (example.text_a, example.text_b, example.label) == ("A plane.", "An air plane.", 5.0)


def test_read_classification_csv_quoting_and_jsonl(tmp_path):
    csv_path = write(tmp_path / "d.csv", 'text,other,label\n"a, quoted ""text""",x,pos\n')
    (row,) = read_classification(csv_path, text_a="text", label="label")
    assert row.text_a == 'a, quoted "text"'
    jsonl = write(tmp_path / "d.jsonl", '{"q": "first", "p": "second", "y": 1}\n\n{"q": "x", "p": "y", "y": 0}\n')
    rows = read_classification(jsonl, text_a="q", text_b="p", label="y")
    assert [(r.text_a, r.text_b, r.label) for r in rows] == [("first", "second", "1"), ("x", "y", "0")]


def test_read_classification_wrong_column_count_names_file_and_line(tmp_path):
    path = write(tmp_path / "bad.tsv", "sentence\tlabel\ngood\t1\nstray\ttab\t0\n")
    with pytest.raises(DataError, match=r"bad\.tsv:3: 3 columns where the header has 2") as error:
        read_classification(path, text_a="sentence", label="label")
    assert error.value.line == 3


def test_read_classification_skip_counts_every_dropped_row(tmp_path):
    path = write(tmp_path / "bad.tsv", "sentence\tlabel\ngood\t1\n \t0\nok\t\nx\ty\tz\n")
    report = DataReport()
    examples = read_classification(path, text_a="sentence", label="label", on_invalid="skip", report=report)
    assert [e.text_a for e in examples] == ["good"]
    assert report["skipped_empty_text"] == 1 and report["skipped_empty_label"] == 1
    assert report["skipped_column_count"] == 1
    assert report.samples["skipped_empty_text"] == [f"{path}:3"]


def test_read_classification_empty_text_and_bad_score_raise(tmp_path):
    path = write(tmp_path / "t.tsv", "a\tlabel\n\t1\n")
    with pytest.raises(DataError, match=r"t\.tsv:2: text_a is missing or empty"):
        read_classification(path, text_a="a", label="label")
    path = write(tmp_path / "r.tsv", "a\tscore\nfine\thigh\n")
    with pytest.raises(DataError, match="not a number"):
        read_classification(path, text_a="a", label="score", regression=True)


def test_read_classification_unknown_column_lists_header(tmp_path):
    path = write(tmp_path / "t.tsv", "sentence\tlabel\nx\t1\n")
    with pytest.raises(DataError, match=r"no column named 'text'.*\['sentence', 'label'\]"):
        read_classification(path, text_a="text", label="label")
    with pytest.raises(DataError, match="file not found"):
        read_classification(tmp_path / "missing.tsv", text_a=0)
    with pytest.raises(ConfigError, match="header=False"):
        read_classification(path, text_a="sentence", header=False)


def test_labels_sorted_and_unseen_dev_label_is_an_error(tmp_path):
    assert sorted_labels(["10", "2", "1"]) == ["1", "2", "10"]
    train = read_classification(write(tmp_path / "train.tsv", "t\ty\na\tb\nc\ta\n"), text_a="t", label="y")
    dev = read_classification(write(tmp_path / "dev.tsv", "t\ty\na\ta\nc\tz\n"), text_a="t", label="y")
    names = label_list(train)
    assert names == ["a", "b"]
    with pytest.raises(DataError, match=r"dev\.tsv:3: label 'z' was never seen in training"):
        check_labels(dev, {n: i for i, n in enumerate(names)})


# --- tagging ----------------------------------------------------------------------------------------------

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

"""


def test_read_tagged_conll_sentences(tmp_path):
    path = write(tmp_path / "train.txt", CONLL)
    report = DataReport()
    sentences = read_tagged(path, report=report)
    assert [s.words for s in sentences] == [["EU", "rejects", "German"], ["Peter", "Blackburn"]]
    assert sentences[1].tags == ["B-PER", "I-PER"]
    assert sentences[1].source == f"{path}:7" and sentences[1].text == "Peter Blackburn"
    assert sentences[1].word_spans() == [(0, 5), (6, 15)]
    assert report["rows"] == 2
    assert tag_list(sentences) == ["O", "B-MISC", "B-ORG", "B-PER", "I-PER"]
    assert tag_list(sentences, "IOBES") == ["O", "B-PER", "E-PER", "S-MISC", "S-ORG"]


def test_read_tagged_character_per_line(tmp_path):
    path = write(tmp_path / "msra.tsv", "张\tB-PER\n三\tI-PER\n住\tO\n\n北\tB-LOC\n京\tI-LOC\n1\tO\n")
    sentences = read_tagged(path, separator="")
    assert sentences[0].text == "张三住" and sentences[1].words == ["北", "京", "1"]
    assert sentences[0].word_spans() == [(0, 1), (1, 2), (2, 3)]


def test_read_tagged_ill_formed_bio_warns_with_line_or_raises(tmp_path):
    path = write(tmp_path / "t.txt", "a X O\nb X I-PER\n\nc X B-LOC\n")
    report = DataReport()
    sentences = read_tagged(path, report=report)
    assert sentences[0].tags == ["O", "I-PER"]  # kept: scored as conlleval reads it
    assert report["bio_problems"] == 1 and report.samples["bio_problems"] == [f"{path}:2"]
    with pytest.raises(DataError, match=r"t\.txt:2: ill-formed BIO: I-PER follows 'O'"):
        read_tagged(path, bio_errors="error")


def test_read_tagged_iobes_input_becomes_bio(tmp_path):
    path = write(tmp_path / "t.txt", "a S-PER\nb B-LOC\nc E-LOC\n")
    report = DataReport()
    (sentence,) = read_tagged(path, report=report)
    assert sentence.tags == ["B-PER", "B-LOC", "I-LOC"] and report["converted_from_iobes"] == 1


def test_read_tagged_malformed_lines(tmp_path):
    path = write(tmp_path / "t.txt", "a O\nlonely\nb O\n\nc O\n")
    with pytest.raises(DataError, match=r"t\.txt:2: expected a token and a tag"):
        read_tagged(path)
    report = DataReport()
    sentences = read_tagged(path, on_invalid="skip", report=report)
    assert [s.words for s in sentences] == [["c"]] and report["skipped_column_count"] == 1
    with pytest.raises(DataError, match=r"t\.txt:1: tag 'X-Y' is not a BIO tag"):
        read_tagged(write(tmp_path / "t.txt", "a X-Y\n"))


def test_check_tag_labels_names_the_line(tmp_path):
    train = read_tagged(write(tmp_path / "train.txt", "a B-PER\nb O\n"))
    dev = read_tagged(write(tmp_path / "dev.txt", "x O\n\ny O\nz B-LOC\n"))
    with pytest.raises(DataError, match=r"dev\.txt:4: tag 'B-LOC' was never seen"):
        check_tag_labels(dev, {t: i for i, t in enumerate(tag_list(train))})


# --- SQuAD-format JSON ------------------------------------------------------------------------------------

def squad(path: Path, qas: list[dict], context: str = "Paris is in France. Paris is big.") -> Path:
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas}]}]}
    return write(path, json.dumps(data, indent=1))


def test_locate_answer_nearest_occurrence():
    context = "Paris is in France. Paris is big."
    assert locate_answer(context, "Paris", 20) == 20
    assert locate_answer(context, "Paris", 18) == 20  # wrong offset: nearest occurrence
    assert locate_answer(context, "Paris", 3) == 0
    assert locate_answer(context, "Rome", 0) is None


def test_read_squad_repairs_wrong_offsets_and_counts(tmp_path):
    path = squad(tmp_path / "d.json", [
        {"id": "q1", "question": "Where?", "answers": [{"text": "Paris", "answer_start": 18},
                                                      {"text": "Lutetia", "answer_start": 0}]},
    ])
    report = DataReport()
    (example,) = read_squad(path, report=report)
    assert (example.answer_start, example.answer_text) == (20, "Paris")
    assert example.answers == ["Paris", "Lutetia"]  # all gold texts are kept for scoring
    assert report["answers_repaired"] == 1 and report["answers_unfound"] == 1
    assert report.samples["answers_repaired"][0].startswith(f"{path}:")


def test_read_squad_unlocatable_answer_raises_with_line_or_is_skipped(tmp_path):
    path = squad(tmp_path / "d.json", [{"id": "ok", "question": "?", "answers": [{"text": "Paris", "answer_start": 0}]},
                                       {"id": "q-bad", "question": "?", "answers": [{"text": "Rome", "answer_start": 3}]}])
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if '"q-bad"' in text)
    with pytest.raises(DataError, match=rf"d\.json:{line}: question 'q-bad': no answer text occurs"):
        read_squad(path)
    report = DataReport()
    examples = read_squad(path, on_invalid="skip", report=report)
    assert len(examples) == 2 and examples[1].answer_start is None
    assert report["skipped_answers_unfound"] == 1


def test_read_squad_v2_and_not_squad(tmp_path):
    path = squad(tmp_path / "d.json", [{"id": "x", "question": "?", "answers": [], "is_impossible": True}])
    (example,) = read_squad(path)
    assert example.is_impossible and example.answers == []
    with pytest.raises(DataError, match="not SQuAD format"):
        read_squad(write(tmp_path / "bad.json", '{"data": [{"title": "no paragraphs"}]}'))
    with pytest.raises(DataError, match="has no answers and is not marked is_impossible"):
        read_squad(squad(tmp_path / "e.json", [{"id": "y", "question": "?", "answers": []}]))


def test_article_split_is_deterministic_36_12():
    train, held = article_split(48)
    assert len(train) == 36 and len(held) == 12 and held[:3] == [3, 7, 11]
    assert not set(train) & set(held)


# --- multiple choice --------------------------------------------------------------------------------------

def test_read_choice_swag_columns(tmp_path):
    path = write(tmp_path / "swag.csv", ",video-id,sent1,sent2,ending0,ending1,ending2,label\n"
                                        '0,v,"She opens, slowly",the door,shuts.,opens.,sings.,1\n')
    (example,) = read_choice(path)
    assert example.context == "She opens, slowly" and example.start == "the door"
    assert example.endings == ["shuts.", "opens.", "sings."] and example.label == 1


def test_read_choice_bad_rows(tmp_path):
    path = write(tmp_path / "swag.csv", "sent1,sent2,ending0,ending1,label\na,b,c,d,2\na,b,,d,0\n")
    with pytest.raises(DataError, match=r"swag\.csv:2: label '2' is not a choice index"):
        read_choice(path)
    report = DataReport()
    assert read_choice(path, on_invalid="skip", report=report) == []
    assert report["skipped_bad_label"] == 1 and report["skipped_empty_text"] == 1
    with pytest.raises(DataError, match="not in the header"):
        read_choice(write(tmp_path / "x.csv", "context,ending0,ending1,label\na,b,c,0\n"))


# --- the real data ----------------------------------------------------------------------------------------

needs_data = pytest.mark.skipif(not DATA.is_dir(), reason="shared data directory not present")


@needs_data
def test_real_files_read_with_known_counts():
    assert len(read_classification(DATA / "glue/SST-2/dev.tsv", text_a="sentence", label="label")) == 872
    assert len(read_classification(DATA / "glue/CoLA/dev.tsv", text_a=3, label=1)) == 1043
    assert len(read_tagged(DATA / "conll2003/valid.txt")) == 3250
    report = DataReport()
    assert len(read_squad(DATA / "cmrc2018/cmrc2018_dev.json", report=report)) == 3219
    assert report["answers_repaired"] == 7 and report["answers_unfound"] == 193


# --- the files people have: byte-order marks, CRLF, quoting, other encodings, empty files ------------------

BOM = b"\xef\xbb\xbf"


def shipped(path: Path, text: str, *, bom: bool = True, crlf: bool = True) -> Path:
    """Write `text` the way Windows tools and GLUE ship it: a UTF-8 byte-order mark and CRLF line ends."""
    body = text.replace("\n", "\r\n") if crlf else text
    path.write_bytes((BOM if bom else b"") + body.encode("utf-8"))
    return path


MRPC = ("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        "1\t702876\t702977\tAmrozi accused his brother , whom he called \" the witness \" .\tReferring to him as "
        "only \" the witness \" , Amrozi accused his brother .\n"
        "0\t2108705\t2108831\tYucaipa owned Dominick 's before selling .\tYucaipa bought Dominick 's in 1995 .\n")


def test_mrpc_as_shipped_bom_and_crlf_read_by_header_names(tmp_path):
    path = shipped(tmp_path / "msr_paraphrase_train.txt", MRPC)
    report = DataReport()
    examples = read_classification(path, text_a="#1 String", text_b="#2 String", label="Quality", report=report)
    assert [e.label for e in examples] == ["1", "0"]
    assert examples[0].text_a.startswith("Amrozi accused") and examples[0].text_b.endswith("his brother .")
    assert not any("\r" in e.text_b or "\ufeff" in e.text_a for e in examples)
    assert [e.source for e in examples] == [f"{path}:2", f"{path}:3"] and report["rows"] == 2
    # By index, the first column of the first row carries no BOM either.
    (first, *_) = read_classification(shipped(tmp_path / "noheader.tsv", MRPC.split("\n", 1)[1]), text_a=3, label=0)
    assert first.label == "1"


def test_bom_in_the_middle_of_a_table_is_data(tmp_path):
    path = shipped(tmp_path / "joined.tsv", "text\tlabel\na\t1\n\ufeffb\t0\n")
    assert [e.text_a for e in read_classification(path, text_a="text", label="label")] == ["a", "\ufeffb"]
    jsonl = shipped(tmp_path / "joined.jsonl", '{"t": "a", "y": 1}\n\ufeff{"t": "b", "y": 0}\n')
    with pytest.raises(DataError, match=r"joined\.jsonl:2: a byte-order mark \(U\+FEFF\) in the middle"):
        read_classification(jsonl, text_a="t", label="y")


def test_stray_tab_in_shipped_tsv_names_line_and_skip_counts(tmp_path):
    path = shipped(tmp_path / "train.tsv", "sentence\tlabel\ngood\t1\nstray\ttab\t0\nfine\t0\n")
    with pytest.raises(DataError, match=r"train\.tsv:3: 3 columns where the header has 2 \(a stray tab"):
        read_classification(path, text_a="sentence", label="label")
    report = DataReport()
    examples = read_classification(path, text_a="sentence", label="label", on_invalid="skip", report=report)
    assert [(e.text_a, e.label) for e in examples] == [("good", "1"), ("fine", "0")]
    assert report["skipped_column_count"] == 1 and report.samples["skipped_column_count"] == [f"{path}:3"]


def test_csv_as_shipped_quoted_commas_tabs_and_newlines(tmp_path):
    path = shipped(tmp_path / "d.csv", 'text,note,label\n"one, two\tthree",x,pos\n'
                                       '"said ""hi""\nthen left",y,neg\nplain,z,pos\n')
    examples = read_classification(path, text_a="text", label="label")
    assert [e.text_a for e in examples] == ["one, two\tthree", 'said "hi"\r\nthen left', "plain"]
    assert [e.label for e in examples] == ["pos", "neg", "pos"]
    assert examples[2].source == f"{path}:5"  # the quoted field spans lines 3-4


def test_jsonl_as_shipped(tmp_path):
    path = shipped(tmp_path / "d.jsonl", '{"q": "first", "y": 1}\n\n{"q": "second", "y": 0}\n')
    assert [(e.text_a, e.label) for e in read_classification(path, text_a="q", label="y")] == [("first", "1"),
                                                                                              ("second", "0")]


def test_conll_as_shipped_docstart_after_bom_is_not_a_word(tmp_path):
    path = shipped(tmp_path / "train.txt", CONLL)
    sentences = read_tagged(path)
    assert [s.words for s in sentences] == [["EU", "rejects", "German"], ["Peter", "Blackburn"]]
    assert sentences[0].tags == ["B-ORG", "O", "B-MISC"] and sentences[1].source == f"{path}:7"
    msra = shipped(tmp_path / "msra.tsv", "张\tB-PER\n三\tI-PER\n\n北\tB-LOC\n")
    assert [s.text for s in read_tagged(msra, separator="")] == ["张三", "北"]
    assert read_tagged(msra, separator="")[0].tags == ["B-PER", "I-PER"]


def test_squad_as_shipped_bom_and_crlf(tmp_path):
    qas = [{"id": "ok", "question": "?", "answers": [{"text": "Paris", "answer_start": 0}]},
           {"id": "q-bad", "question": "?", "answers": [{"text": "Rome", "answer_start": 3}]}]
    data = {"version": "1.1", "data": [{"title": "t", "paragraphs": [{"context": "Paris is big.", "qas": qas}]}]}
    path = shipped(tmp_path / "dev.json", json.dumps(data, indent=1))
    line = next(i for i, text in enumerate(json.dumps(data, indent=1).splitlines(), 1) if '"q-bad"' in text)
    with pytest.raises(DataError, match=rf"dev\.json:{line}: question 'q-bad'"):
        read_squad(path)
    examples = read_squad(path, on_invalid="skip")
    assert [e.answer_start for e in examples] == [0, None]
    assert count_articles(path) == 1


def test_swag_as_shipped(tmp_path):
    path = shipped(tmp_path / "val.csv", 'sent1,sent2,ending0,ending1,label\n"He waits, then",he,"sits, down.",'
                                         '"runs\taway.",1\n')
    (example,) = read_choice(path)
    assert example.context == "He waits, then" and example.endings == ["sits, down.", "runs\taway."]
    assert example.label == 1


LATIN1_TEXT = "text\tlabel\nfine\t1\ncaf\u00e9 cr\u00e8me\t0\n"


@pytest.mark.parametrize("name, read, text", [
    ("t.tsv", lambda p: read_classification(p, text_a="text", label="label"), LATIN1_TEXT),
    ("t.csv", lambda p: read_classification(p, text_a="text", label="label"), LATIN1_TEXT.replace("\t", ",")),
    ("t.jsonl", lambda p: read_classification(p, text_a="t", label="y"),
     '{"t": "fine", "y": 1}\n{"t": "caf\u00e9", "y": 0}\n'),
    ("t.txt", read_tagged, "fine O\n\ncaf\u00e9 B-LOC\n"),
    ("s.json", read_squad, '{"data": [\n{"title": "caf\u00e9"}]}'),
    ("c.csv", read_choice, "sent1,sent2,ending0,ending1,label\ncaf\u00e9,a,b,c,0\n"),
], ids=["tsv", "csv", "jsonl", "conll", "squad", "swag"])
def test_latin1_file_is_one_clear_error_naming_file_line_and_fix(tmp_path, name, read, text):
    path = tmp_path / name
    path.write_bytes(text.replace("\n", "\r\n").encode("latin-1"))
    with pytest.raises(DataError, match="not UTF-8 text") as error:
        read(path)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if not row.isascii())
    assert error.value.path == str(path) and error.value.line == line
    assert f"iconv -f latin1 -t UTF-8 {path}" in str(error.value)


def test_utf16_table_says_utf16(tmp_path):
    path = tmp_path / "excel.txt"
    path.write_bytes("text\tlabel\r\nfine\t1\r\n".encode("utf-16"))
    with pytest.raises(DataError, match="UTF-16 text.*iconv -f UTF-16 -t UTF-8"):
        read_classification(path, text_a="text", label="label")


@pytest.mark.parametrize("name, read, header", [
    ("t.tsv", lambda p: read_classification(p, text_a="text", label="label"), "text\tlabel\n"),
    ("t.csv", lambda p: read_classification(p, text_a="text", label="label"), "text,label\n"),
    ("i.tsv", lambda p: read_classification(p, text_a=0, label=1), None),
    ("t.jsonl", lambda p: read_classification(p, text_a="t", label="y"), None),
    ("t.txt", read_tagged, "-DOCSTART- -X- -X- O\n\n"),
    ("s.json", read_squad, None),
    ("c.csv", read_choice, "sent1,sent2,ending0,ending1,label\n"),
], ids=["tsv", "csv", "tsv-by-index", "jsonl", "conll", "squad", "swag"])
@pytest.mark.parametrize("bom", [False, True], ids=["plain", "bom"])
def test_empty_and_header_only_files_are_clear_errors(tmp_path, name, read, header, bom):
    path = shipped(tmp_path / name, "", bom=bom)
    with pytest.raises(DataError, match="is empty") as error:
        read(path)
    assert error.value.path == str(path)
    shipped(path, "\n  \n", bom=bom)
    with pytest.raises(DataError, match="is empty"):
        read(path)
    if header is not None:
        shipped(path, header, bom=bom)
        expected = "is empty" if name == "t.txt" else "only the header row"
        with pytest.raises(DataError, match=expected) as error:
            read(path)
        assert error.value.line == (None if name == "t.txt" else 1)


def test_squad_without_questions_is_an_error(tmp_path):
    with pytest.raises(DataError, match="holds no questions"):
        read_squad(shipped(tmp_path / "s.json", '{"version": "1.1", "data": []}'))
    path = shipped(tmp_path / "one.json", json.dumps({"data": [{"title": "t", "paragraphs": [
        {"context": "Paris.", "qas": [{"id": "a", "question": "?", "answers": [{"text": "Paris", "answer_start": 0}]}]}
    ]}]}))
    assert read_squad(path, articles=[5]) == []  # an article filter may select nothing


def test_every_row_skipped_is_not_an_empty_file(tmp_path):
    path = shipped(tmp_path / "t.tsv", "text\tlabel\n \t1\n")
    report = DataReport()
    assert read_classification(path, text_a="text", label="label", on_invalid="skip", report=report) == []
    assert report["skipped_empty_text"] == 1
