"""Tests for bertforge.metrics.question_answering: official SQuAD v1.1/v2.0 and CMRC 2018 scoring on hand-made examples."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bertforge.configuration import shared_data_root
from bertforge.errors import DataError, InputError
from bertforge.metrics.question_answering import (
    _CHINESE_SCRIPT_PUNCTUATION,
    _word_tokenize,
    answer_tokens,
    detect_language,
    evaluate_squad,
    normalize_answer,
    normalize_answer_zh,
    score_answer,
    squad_gold_answers,
)

DATA = shared_data_root()
SQUAD_DEV = DATA / "squad_v1.1" / "dev-v1.1.json"
CHINESE_DEVS = [DATA / "cmrc2018" / "cmrc2018_dev.json", DATA / "cmrc2018" / "cmrc2018_trial.json",
                DATA / "drcd" / "DRCD_dev.json"]


def _dataset(questions: list[tuple[str, list[str]]], version: str = "1.1") -> dict:
    qas = [{"id": qid, "question": "?", "answers": [{"text": t, "answer_start": 0} for t in answers]}
           for qid, answers in questions]
    return {"version": version, "data": [{"title": "t", "paragraphs": [{"context": "c", "qas": qas}]}]}


def test_normalize_answer_lowercases_strips_punctuation_articles_and_spaces():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert normalize_answer("An apple, a day") == "apple day"
    # Articles are whole words only; punctuation goes before articles, so "the-end" -> "theend".
    assert normalize_answer("the theatre") == "theatre"
    assert normalize_answer("the-end") == "theend"
    assert normalize_answer("  ") == ""


def test_score_answer_exact_and_f1_hand_computed():
    assert score_answer("the Denver Broncos", ["Denver Broncos"]) == (1.0, 1.0)
    # 2 shared tokens: precision 2/3, recall 1 -> F1 0.8.
    exact, f1 = score_answer("Denver Broncos team", ["Denver Broncos"])
    assert exact == 0.0
    assert f1 == pytest.approx(0.8)
    # Repeated tokens count with multiplicity: x y y vs y y z share 2 -> F1 2/3.
    assert score_answer("x y y", ["y y z"])[1] == pytest.approx(2 / 3)
    assert score_answer("cats", ["dogs"]) == (0.0, 0.0)


def test_score_answer_takes_best_over_gold_answers():
    exact, f1 = score_answer("Broncos", ["Denver Broncos", "the Broncos."])
    assert (exact, f1) == (1.0, 1.0)
    exact, f1 = score_answer("in Denver", ["Denver Colorado", "Denver"])
    assert exact == 0.0
    assert f1 == pytest.approx(2 / 3)


def test_score_answer_empty_normalisation_differs_between_v1_and_v2():
    # A gold answer "." (three exist in SQuAD v1.1 dev) normalises to nothing.
    assert score_answer(".", ["."], version="1.1") == (1.0, 0.0)
    # v2.0 drops such gold answers: the question becomes "no answer", so an empty prediction scores 1.
    assert score_answer(".", ["."], version="2.0") == (1.0, 1.0)
    assert score_answer("", [], version="2.0") == (1.0, 1.0)
    assert score_answer("Denver", [], version="2.0") == (0.0, 0.0)
    assert score_answer("", ["Denver"], version="2.0") == (0.0, 0.0)
    with pytest.raises(InputError, match="version='2.0'"):
        score_answer("", [], version="1.1")


def test_evaluate_squad_v1_fractions_and_missing_predictions():
    dataset = _dataset([("q1", ["Denver Broncos", "Broncos"]), ("q2", ["Santa Clara"]), ("q3", ["1"])])
    predictions = {"q1": "the broncos", "q2": "Santa Clara, California", "extra": "ignored"}
    results = evaluate_squad(predictions, dataset)
    # q1: EM 1, F1 1; q2: EM 0, F1 2*(2/3*1)/(2/3+1) = 0.8; q3 missing: 0 and counted.
    assert results == {"exact_match": pytest.approx(1 / 3), "f1": pytest.approx(1.8 / 3), "total": 3,
                       "missing": 1}


def test_evaluate_squad_accepts_answer_mapping_data_list_and_path(tmp_path):
    dataset = _dataset([("q1", ["Denver Broncos"]), ("q2", ["Santa Clara"])])
    predictions = {"q1": "Denver Broncos", "q2": "Clara"}
    expected = evaluate_squad(predictions, dataset)
    assert expected["f1"] == pytest.approx((1 + 2 / 3) / 2)
    assert evaluate_squad(predictions, dataset["data"]) == expected
    assert evaluate_squad(predictions, {"q1": ["Denver Broncos"], "q2": ["Santa Clara"]}) == expected
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(dataset), encoding="utf-8")
    assert evaluate_squad(predictions, path) == expected
    assert evaluate_squad(predictions, str(path)) == expected


def test_evaluate_squad_v2_breakdown():
    dataset = _dataset([("a1", ["Denver"]), ("a2", ["Santa Clara"]), ("n1", []), ("n2", [])], version="v2.0")
    predictions = {"a1": "Denver", "a2": "", "n1": "", "n2": "Clara"}
    results = evaluate_squad(predictions, dataset)
    assert results["total"] == 4
    assert results["exact_match"] == pytest.approx(0.5)
    assert results["HasAns_exact"] == pytest.approx(0.5)
    assert results["HasAns_total"] == 2
    assert results["NoAns_exact"] == pytest.approx(0.5)
    assert results["NoAns_f1"] == pytest.approx(0.5)
    assert results["NoAns_total"] == 2


def test_evaluate_squad_infers_version():
    answerable_only = _dataset([("a1", ["Denver"])], version="v2.0")
    assert "HasAns_exact" in evaluate_squad({"a1": "Denver"}, answerable_only)
    assert "NoAns_total" not in evaluate_squad({"a1": "Denver"}, answerable_only)
    assert "HasAns_exact" not in evaluate_squad({"a1": "Denver"}, _dataset([("a1", ["Denver"])]))
    # An unanswerable question implies v2.0 even without a declared version.
    assert evaluate_squad({"n1": ""}, {"n1": []})["NoAns_exact"] == 1.0


def test_evaluate_squad_reports_user_mistakes():
    with pytest.raises(InputError, match="'q1'"):
        evaluate_squad({"q1": ["Denver"]}, {"q1": ["Denver"]})
    with pytest.raises(DataError, match="no gold answer"):
        evaluate_squad({"q1": "x"}, {"q1": []}, version="1.1")
    with pytest.raises(DataError, match="paragraphs"):
        squad_gold_answers({"data": [{"title": "no paragraphs"}]})
    with pytest.raises(DataError, match="expected a list of answer texts"):
        evaluate_squad({"q1": "x"}, {"q1": "x"})
    with pytest.raises(DataError, match="not found"):
        evaluate_squad({}, "/nonexistent/dev.json")
    with pytest.raises(InputError, match="language"):
        evaluate_squad({"q1": "x"}, {"q1": ["x"]}, language="fr")


def test_chinese_f1_uses_characters_and_longest_common_substring():
    # tokens 北 京 大 学 vs 北 京: common run 2 -> precision 2/4, recall 2/2 -> F1 2/3.
    exact, f1 = score_answer("北京大学", ["北京"], language="zh")
    assert exact == 0.0
    assert f1 == pytest.approx(2 / 3)
    # Contiguous runs, not a bag of tokens: 甲乙丙 vs 乙甲丙 share runs of length 1 only -> 1/3.
    assert score_answer("甲乙丙", ["乙甲丙"], language="zh")[1] == pytest.approx(1 / 3)
    # Numbers stay one token: [1998, 年] vs [1998, 年, 5, 月] -> precision 1, recall 1/2 -> 2/3.
    assert answer_tokens("1998年5月", "zh") == ["1998", "年", "5", "月"]
    assert score_answer("1998年", ["1998年5月"], language="zh")[1] == pytest.approx(2 / 3)


def test_chinese_punctuation_follows_the_official_list():
    assert score_answer("《红楼梦》", ["红楼梦"], language="zh") == (1.0, 1.0)
    assert normalize_answer_zh(" A-B：“C” ") == "abc"
    # "." is not on cmrc2018_evaluate.py's list: no exact match; F1 over [北, 京, .] vs [北, 京] = 0.8.
    exact, f1 = score_answer("北京.", ["北京"], language="zh")
    assert exact == 0.0
    assert f1 == pytest.approx(0.8)
    # Inner whitespace: kept for exact match (as the script does), ignored by the tokens.
    assert score_answer("北 京", ["北京"], language="zh") == (0.0, 1.0)
    # English words between Chinese characters are whole tokens, lower-cased.
    assert answer_tokens("iPhone 6s发布", "zh") == ["iphone", "6s", "发", "布"]


def test_evaluate_squad_chinese_mode_and_auto_detection():
    gold = {"q1": ["北京大学"], "q2": ["红楼梦"]}
    predictions = {"q1": "北京", "q2": "《红楼梦》"}
    results = evaluate_squad(predictions, gold, language="zh")
    assert results["exact_match"] == pytest.approx(0.5)
    assert results["f1"] == pytest.approx((2 / 3 + 1) / 2)
    assert evaluate_squad(predictions, gold, language="auto") == results
    assert detect_language(["Denver Broncos", "1998"]) == "en"
    assert detect_language(["北京大学", "1998年"]) == "zh"


def _load_or_skip(path: Path) -> dict:
    if not path.exists():
        pytest.skip(f"{path} is not available")
    return json.loads(path.read_text(encoding="utf-8"))


def test_evaluate_squad_dev_v11_gold_as_predictions():
    dataset = _load_or_skip(SQUAD_DEV)
    gold = squad_gold_answers(dataset)
    assert len(gold) == 10570
    # Predict a gold answer, choosing "." where it is one (three questions): "." matches exactly, yet under
    # the official v1.1 rules a prediction that normalises to nothing has F1 0, even against itself.
    predictions = {qid: "." if "." in answers else answers[0] for qid, answers in gold.items()}
    dots = sum(p == "." for p in predictions.values())
    assert dots == 3
    results = evaluate_squad(predictions, dataset, language="auto")
    assert results == {"exact_match": 1.0, "f1": pytest.approx((10570 - dots) / 10570),
                       "total": 10570, "missing": 0}
    assert detect_language([a for answers in gold.values() for a in answers]) == "en"


def test_chinese_dev_sets_detected_as_chinese():
    for path in CHINESE_DEVS:
        gold = squad_gold_answers(_load_or_skip(path))
        assert detect_language([a for answers in gold.values() for a in answers]) == "zh", path


def test_word_tokenizer_matches_nltk_treebank_on_real_answers():
    nltk_tokenize = pytest.importorskip("nltk.tokenize")
    reference = nltk_tokenize.NLTKWordTokenizer()
    runs = set()
    for path in [SQUAD_DEV, *CHINESE_DEVS]:
        gold = squad_gold_answers(_load_or_skip(path))
        for answers in gold.values():
            for answer in answers:
                text = "".join(ch for ch in answer.lower().strip() if ch not in _CHINESE_SCRIPT_PUNCTUATION)
                runs.update(run for run in re.split("[\u4e00-\u9fa5]", text) if run.strip())
    runs.update(["u.s. $100, 50% china's", "1,000.5 a,b \"hi\" (x) don't e.g. end.", "...abc--d",
                 "'bends' cannot", "gonna gotta"])
    mismatches = [run for run in sorted(runs) if _word_tokenize(run) != reference.tokenize(run)]
    assert mismatches == []


def test_evaluate_squad_scale_is_a_fraction_like_every_other_metric():
    # One scale everywhere: QA exact match and F1 are in [0, 1], as accuracy and entity F1 are.
    dataset = _dataset([("a1", ["Denver"]), ("a2", ["Santa Clara"]), ("n1", [])], version="v2.0")
    results = evaluate_squad({"a1": "Denver", "a2": "Santa Clara", "n1": ""}, dataset)
    scores = {k: v for k, v in results.items() if not k.endswith("total") and k != "missing"}
    assert scores and all(v == 1.0 for v in scores.values())
    zh = evaluate_squad({"q1": "北京大学"}, {"q1": ["北京大学"]}, language="zh")
    assert (zh["exact_match"], zh["f1"]) == (1.0, 1.0)
