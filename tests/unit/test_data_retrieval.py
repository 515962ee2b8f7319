"""Retrieval sets (`data.retrieval`): the BEIR layout both ways, bad lines named by file:line, retrieval
sets and training pairs from SQuAD-format files (held apart by article), labelled sentence-pair files."""

from __future__ import annotations

import json

import pytest

from bertforge.configuration import shared_data_root
from bertforge.data.finetuning import DataReport
from bertforge.data.retrieval import (
    RetrievalSet,
    build_from_squad,
    read_beir,
    read_sentence_pairs,
    read_train_pairs,
    write_beir,
    write_train_pairs,
)
from bertforge.errors import ConfigError, DataError


def small_set() -> RetrievalSet:
    return RetrievalSet(["d1", "d 2", "文3"], ["Title", "", "标题"], ["first text", "second\ttext", "第三"],
                        ["q1", "q2"], ["what is first?", "问题"], {"q1": {"d1": 1, "d 2": 0}, "q2": {"文3": 2}})


# --- BEIR layout -----------------------------------------------------------------------------------------

def test_beir_round_trip_keeps_everything(tmp_path):
    original = small_set()
    write_beir(original, tmp_path / "beir")
    assert (tmp_path / "beir" / "qrels" / "test.tsv").read_text(encoding="utf-8").splitlines()[0] == \
        "query-id\tcorpus-id\tscore"
    back = read_beir(tmp_path / "beir")
    assert back == original
    assert back.documents() == ["Title first text", "second\ttext", "标题 第三"]
    assert back.evaluated_queries() == ["q1", "q2"]


def test_beir_read_accepts_a_bom_crlf_and_no_qrels_header(tmp_path):
    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_bytes(b'\xef\xbb\xbf{"_id": 7, "text": "t", "metadata": {}}\r\n\r\n')
    (tmp_path / "queries.jsonl").write_text('{"_id": "a", "text": "q"}\n', encoding="utf-8")
    (tmp_path / "qrels" / "dev.tsv").write_text("a\t7\t1\n", encoding="utf-8")
    beir = read_beir(tmp_path, "dev")
    assert (beir.corpus_ids, beir.corpus_titles, beir.qrels, beir.split) == (["7"], [""], {"a": {"7": 1}}, "dev")


def write_folder(root, corpus: str, queries: str, qrels: str) -> None:
    (root / "qrels").mkdir(parents=True)
    (root / "corpus.jsonl").write_text(corpus, encoding="utf-8")
    (root / "queries.jsonl").write_text(queries, encoding="utf-8")
    (root / "qrels" / "test.tsv").write_text(qrels, encoding="utf-8")


GOOD_CORPUS = '{"_id": "d1", "title": "", "text": "one"}\n{"_id": "d2", "text": "two"}\n'
GOOD_QUERIES = '{"_id": "q1", "text": "which?"}\n'
GOOD_QRELS = "query-id\tcorpus-id\tscore\nq1\td1\t1\n"


@pytest.mark.parametrize(("corpus", "qrels", "where", "message"), [
    ('{"_id": "d1", "text": "one"}\n{"_id": "d2", "text": \n', GOOD_QRELS, "corpus.jsonl:2", "not a JSON object"),
    ('{"_id": "d1", "text": "one"}\n\n{"text": "two"}\n', GOOD_QRELS, "corpus.jsonl:3", '"_id"'),
    ('{"_id": "d1", "text": "one"}\n{"_id": "d1", "text": "two"}\n', GOOD_QRELS, "corpus.jsonl:2", "earlier line"),
    ('{"_id": "d1", "title": 3, "text": "one"}\n', GOOD_QRELS, "corpus.jsonl:1", '"title"'),
    (GOOD_CORPUS, "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td9\t1\n", "test.tsv:3", "'d9' is not in corpus"),
    (GOOD_CORPUS, "query-id\tcorpus-id\tscore\nq7\td1\t1\n", "test.tsv:2", "'q7' is not in queries"),
    (GOOD_CORPUS, "query-id\tcorpus-id\tscore\nq1\td1\thigh\n", "test.tsv:2", "not an integer"),
    (GOOD_CORPUS, "query-id\tcorpus-id\tscore\nq1\td1\n", "test.tsv:2", "2 columns"),
    (GOOD_CORPUS, "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td1\t2\n", "test.tsv:3", "earlier line"),
])
def test_beir_bad_lines_name_file_and_line(tmp_path, corpus, qrels, where, message):
    write_folder(tmp_path, corpus, GOOD_QUERIES, qrels)
    with pytest.raises(DataError) as error:
        read_beir(tmp_path)
    assert where in str(error.value) and message in str(error.value)


def test_beir_skip_drops_bad_lines_and_counts_them(tmp_path):
    write_folder(tmp_path, GOOD_CORPUS + "not json\n", GOOD_QUERIES, GOOD_QRELS + "q1\td9\t1\n")
    report = DataReport()
    beir = read_beir(tmp_path, on_invalid="skip", report=report)
    assert beir.corpus_ids == ["d1", "d2"] and beir.qrels == {"q1": {"d1": 1}}
    assert report["skipped_not_json"] == 1 and report["skipped_unknown_document"] == 1
    assert report.samples["skipped_unknown_document"] == [f"{tmp_path / 'qrels' / 'test.tsv'}:3"]


def test_beir_missing_files_and_empty_qrels(tmp_path):
    with pytest.raises(DataError, match="corpus.jsonl.*not found"):
        read_beir(tmp_path)
    write_folder(tmp_path, GOOD_CORPUS, GOOD_QUERIES, GOOD_QRELS)
    with pytest.raises(DataError, match=r"splits \['test'\]"):
        read_beir(tmp_path, "dev")
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n", encoding="utf-8")
    with pytest.raises(DataError, match="test.tsv:1: holds only the header"):
        read_beir(tmp_path)


def test_retrieval_set_rejects_repeated_and_unwritable_ids():
    with pytest.raises(DataError, match="document ids must be distinct"):
        RetrievalSet(["d", "d"], ["", ""], ["a", "b"], [], [])
    with pytest.raises(DataError, match="query id .* without tabs or line breaks"):
        RetrievalSet(["d"], [""], ["a"], ["q\t1"], ["text"])
    with pytest.raises(DataError, match="one title and text per document"):
        RetrievalSet(["d"], [], ["a"], [], [])


# --- SQuAD-format files ----------------------------------------------------------------------------------

def squad_file(path, articles) -> str:
    data = [{"title": title, "paragraphs": [{"context": context, "qas": [
        {"id": qid, "question": question, "answers": [{"text": context[:3], "answer_start": 0}], **extra}
        for qid, question, *more in qas for extra in [more[0] if more else {}]]} for context, qas in paragraphs]}
        for title, paragraphs in articles]
    path.write_text(json.dumps({"version": "1.1", "data": data}, ensure_ascii=False, indent=1), encoding="utf-8")
    return str(path)


ARTICLES = [
    ("Alpha", [("Alpha one.", [("a1", "alpha q1?"), ("a2", "alpha q2?")]), ("Alpha two.", [("a3", "alpha q3?")])]),
    ("Beta", [("Beta one.", [("b1", "beta q1?"), ("b2", "no answer?", {"is_impossible": True})])]),
    ("Gamma", [("Gamma one.", [("g1", "gamma q1?")]), ("Gamma two.", [])]),
    ("Delta", [("Delta one.", [("d1", "delta q1?"), ("d2", "delta q2?")])]),
    # Epsilon repeats Alpha's first paragraph: the two articles must land on the same side.
    ("Epsilon", [("Alpha one.", [("e1", "epsilon q1?")]), ("Epsilon two.", [("a1", "same id again?")])]),
]


def test_build_from_squad_every_question_is_a_query(tmp_path):
    report = DataReport()
    eval_set, pairs = build_from_squad(squad_file(tmp_path / "s.json", ARTICLES), report=report)
    assert pairs == [] and report["skipped_unanswerable"] == 1 and report["questions"] == 9
    assert len(eval_set.corpus_ids) == 7  # "Alpha one." twice is one document
    assert eval_set.corpus_titles[:3] == ["Alpha", "Alpha", "Beta"] and "Gamma two." in eval_set.corpus_texts
    assert eval_set.query_ids == ["a1", "a2", "e1", "a3", "b1", "g1", "d1", "d2", "a1#2"]
    text_of = dict(zip(eval_set.corpus_ids, eval_set.corpus_texts))
    question_of = dict(zip(eval_set.query_ids, eval_set.query_texts))
    assert [text_of[doc] for doc in eval_set.qrels["e1"]] == ["Alpha one."]
    assert [text_of[doc] for doc in eval_set.qrels["a1#2"]] == ["Epsilon two."]
    assert question_of["a1#2"] == "same id again?" and all(len(d) == 1 for d in eval_set.qrels.values())


def test_build_from_squad_split_keeps_eval_paragraphs_out_of_training(tmp_path):
    path = squad_file(tmp_path / "s.json", ARTICLES)
    for seed in range(12):
        eval_set, pairs = build_from_squad(path, eval_fraction=0.4, seed=seed)
        relevant = {eval_set.corpus_texts[eval_set.corpus_ids.index(doc)]
                    for docs in eval_set.qrels.values() for doc in docs}
        assert pairs and eval_set.query_ids
        assert not relevant & {paragraph for _, paragraph in pairs}
        assert len(eval_set.query_ids) + len(pairs) == 9
        # Alpha and Epsilon share a paragraph: their questions are all on one side.
        alpha = {"a1", "a2", "a3", "e1", "a1#2"}
        assert alpha <= set(eval_set.query_ids) or not alpha & set(eval_set.query_ids)
        assert len(eval_set.corpus_ids) == 7  # "all": training paragraphs stay as distractors
        assert build_from_squad(path, eval_fraction=0.4, seed=seed) == (eval_set, pairs)  # deterministic


def test_build_from_squad_eval_corpus_holds_only_eval_articles(tmp_path):
    path = squad_file(tmp_path / "s.json", ARTICLES)
    eval_set, pairs = build_from_squad(path, eval_fraction=0.3, seed=3, eval_corpus="eval")
    relevant = {doc for docs in eval_set.qrels.values() for doc in docs}
    assert relevant <= set(eval_set.corpus_ids)
    assert not set(eval_set.corpus_texts) & {paragraph for _, paragraph in pairs}


def test_build_from_squad_document_ids_are_stable_across_files_and_splits(tmp_path):
    first = squad_file(tmp_path / "a.json", ARTICLES[:2])
    second = squad_file(tmp_path / "b.json", ARTICLES[2:])
    whole, _ = build_from_squad(squad_file(tmp_path / "all.json", ARTICLES))
    joined, _ = build_from_squad([first, second])
    assert joined.corpus_ids == whole.corpus_ids and joined.query_ids == whole.query_ids


def test_build_from_squad_rejects_bad_files_and_settings(tmp_path):
    path = squad_file(tmp_path / "s.json", ARTICLES)
    for fraction in (0, 1.5, -0.1):
        with pytest.raises(ConfigError, match="eval_fraction"):
            build_from_squad(path, eval_fraction=fraction)
    with pytest.raises(ConfigError, match="every article"):
        build_from_squad(squad_file(tmp_path / "one.json", ARTICLES[:1]), eval_fraction=0.5)
    broken = tmp_path / "broken.json"
    broken.write_text('{"data": [\n{"title": "x",\n "paragraphs": [}\n', encoding="utf-8")
    with pytest.raises(DataError, match="broken.json:3: not valid JSON"):
        build_from_squad(broken)
    broken.write_text('{"data": [{"title": "x"}]}', encoding="utf-8")
    with pytest.raises(DataError, match="'paragraphs'"):
        build_from_squad(broken)
    broken.write_text('{"data": [{"title": "x", "paragraphs": [{"context": "c", "qas": []}]}]}', encoding="utf-8")
    with pytest.raises(DataError, match="no questions"):
        build_from_squad(broken)


def test_train_pairs_round_trip_with_tabs_and_line_breaks(tmp_path):
    path = tmp_path / "pairs" / "train.tsv"
    assert write_train_pairs(path, [("a question?", "a para\tgraph\nwith lines"), ("问题", "段落")]) == 2
    assert path.read_text(encoding="utf-8").splitlines()[0] == "anchor\tpositive"
    assert read_train_pairs(path) == [("a question?", "a para graph with lines"), ("问题", "段落")]


# --- sentence pairs --------------------------------------------------------------------------------------

def test_read_sentence_pairs_sts_b_layout_with_bom_and_crlf(tmp_path):
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    rows = ["0\tmain-captions\tMSRvid\t2012test\t0000\tnone\tnone\tA man dances.\tA man is dancing.\t5.000",
            "1\tmain-captions\tMSRvid\t2012test\t0002\tnone\tnone\tA child rides.\tA horse.\t1.250"]
    path = tmp_path / "dev.tsv"
    path.write_bytes(("\ufeff" + "\r\n".join([header, *rows]) + "\r\n").encode("utf-8"))
    pairs = read_sentence_pairs(path, binary=False)
    assert pairs.sentences_a == ["A man dances.", "A child rides."] and pairs.labels == [5.0, 1.25]
    assert pairs.sources == [f"{path}:2", f"{path}:3"]


def test_read_sentence_pairs_headerless_jsonl_and_named_columns(tmp_path):
    lcqmc = tmp_path / "dev.txt"
    lcqmc.write_text("开初婚未育证明怎么弄？\t初婚未育情况证明怎么开？\t1\n谁知道她是网络美女吗？\t爱情是什么歌\t0\n",
                     encoding="utf-8")
    assert read_sentence_pairs(lcqmc, binary=True).labels == [1.0, 0.0]
    rows = tmp_path / "pairs.jsonl"
    rows.write_text('{"sentence1": "a", "sentence2": "b", "label": "entailment"}\n'
                    '{"sentence1": "c", "sentence2": "d", "label": "not_entailment"}\n', encoding="utf-8")
    assert read_sentence_pairs(rows, binary=True).labels == [1.0, 0.0]
    custom = tmp_path / "custom.csv"
    custom.write_text('left,right,sim\n"x, y",z,0.5\n', encoding="utf-8")
    with pytest.raises(DataError, match="custom.csv:1: cannot tell which columns"):
        read_sentence_pairs(custom, binary=False)
    pairs = read_sentence_pairs(custom, binary=False, text_a="left", text_b="right", label="sim")
    assert (pairs.sentences_a, pairs.labels) == (["x, y"], [0.5])


def test_read_sentence_pairs_bad_rows_name_file_and_line(tmp_path):
    path = tmp_path / "pairs.tsv"
    path.write_text("sentence1\tsentence2\tlabel\na\tb\t1\nc\td\tmaybe\n", encoding="utf-8")
    with pytest.raises(DataError, match="pairs.tsv:3: label 'maybe' is not a 0/1"):
        read_sentence_pairs(path, binary=True)
    with pytest.raises(DataError, match="pairs.tsv:3: label 'maybe' is not a number"):
        read_sentence_pairs(path, binary=False)


# --- the real files --------------------------------------------------------------------------------------

def shared(relative: str):
    path = shared_data_root() / relative
    if not path.exists():
        pytest.skip(f"{path} is not present (../shared/data holds the real data; a clone has none)")
    return path


def test_build_from_squad_real_squad_dev_holds_articles_apart():
    path = shared("squad_v1.1/dev-v1.1.json")
    eval_set, pairs = build_from_squad(path, eval_fraction=0.2, seed=0)
    assert len(eval_set.corpus_ids) == 2067  # every paragraph of the 48 articles is distinct
    assert len(eval_set.query_ids) + len(pairs) == 10_570
    assert 0.18 * 10_570 <= len(eval_set.query_ids) <= 0.35 * 10_570
    relevant = {doc for docs in eval_set.qrels.values() for doc in docs}
    paragraphs = dict(zip(eval_set.corpus_ids, eval_set.corpus_texts))
    assert not {paragraphs[doc] for doc in relevant} & {paragraph for _, paragraph in pairs}
    assert eval_set.query_ids[:1] == ["56be4db0acb8001400a502ec"] or eval_set.query_ids[0] != pairs[0][0]
    assert build_from_squad(path, eval_fraction=0.2, seed=0) == (eval_set, pairs)


@pytest.mark.parametrize(("relative", "paragraphs", "questions"), [
    ("cmrc2018/cmrc2018_dev.json", 848, 3219), ("drcd/DRCD_dev.json", 1000, 3524)])
def test_build_from_squad_real_chinese_files(relative, paragraphs, questions, tmp_path):
    eval_set, _ = build_from_squad(shared(relative))
    assert (len(eval_set.corpus_ids), len(eval_set.query_ids)) == (paragraphs, questions)
    write_beir(eval_set, tmp_path)
    assert read_beir(tmp_path) == eval_set


def test_read_sentence_pairs_real_glue_files():
    sts = read_sentence_pairs(shared("glue/STS-B/dev.tsv"), binary=False)
    assert len(sts.labels) == 1500 and sts.labels[0] == 5.0 and min(sts.labels) >= 0 and max(sts.labels) <= 5
    rte = read_sentence_pairs(shared("glue/RTE/dev.tsv"), binary=True)
    assert (len(rte.labels), sum(rte.labels)) == (277, 146)
