"""Extractive QA metrics: SQuAD v1.1 / v2.0 exact match and F1, and the CMRC 2018 Chinese variant.

Reproduces the official evaluation scripts, so that numbers reported here can be compared with published ones:

- English, SQuAD v1.1 (`evaluate-v1.1.py`): lower-case, drop ASCII punctuation (`string.punctuation`), drop
  the articles a/an/the, collapse whitespace; exact match compares the normalised strings, F1 is the
  bag-of-tokens overlap F1 of the whitespace tokens; each question takes the best score over its gold
  answers; a question with no prediction scores 0 and still counts in the total.
- English, SQuAD v2.0 (`evaluate-v2.0.py`): as v1.1, plus unanswerable questions (no gold answers) whose
  only correct prediction is the empty string; gold answers that normalise to nothing are dropped; F1 is
  1 when both sides normalise to nothing; HasAns_/NoAns_ breakdowns. (The official v2.0 script leaves
  questions without a prediction out of the total; here they score 0 and count, as in v1.1.)
- Chinese (`cmrc2018_evaluate.py`, also used for DRCD): lower-case and strip; remove the script's
  punctuation list (Chinese full-width marks plus - : _ * ^ / \\ ~ ` + =); each CJK character (U+4E00 to
  U+9FA5) is a token, the text between them is word-tokenised; F1 comes from the longest common
  *contiguous* run of tokens; exact match compares the punctuation-stripped strings.

The official Chinese script word-tokenises the non-Chinese runs with `nltk.word_tokenize`; this module
uses its own small tokenizer following the same Penn Treebank conventions (punctuation split off, numbers
such as "1,000.5" kept whole, a final period split off, clitics such as "'s" split), so nltk is not needed.
It agrees with nltk's `NLTKWordTokenizer` on every answer run of the CMRC 2018, DRCD and SQuAD dev sets
(a test checks this when nltk is installed); nltk's sentence splitting before that step is not reproduced.

Every score here is a fraction in [0, 1], as every other bertforge metric (accuracy, entity F1, Pearson):
`evaluate_squad` reports exact match 0.8 where the official scripts print 80.0 (multiply by 100 to compare
with published tables). Nothing here imports torch.
"""

from __future__ import annotations

import json
import os
import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

from bertforge.errors import DataError, InputError

_ENGLISH_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)

# cmrc2018_evaluate.py's `sp_char`, character by character. The script also lists "……", a two-character
# string that a character-by-character test can never match, so it is left out here to the same effect.
_CHINESE_SCRIPT_PUNCTUATION = frozenset("-:_*^/\\~`+=，。：？！“”；’《》·、「」（）－～『』")
_CJK = re.compile("[\u4e00-\u9fa5]")

# Treebank-style splitting of the non-Chinese runs (see the module docstring).
_ALWAYS_SPLIT = re.compile("([;@#$%&?!*\\[\\](){}<>«»“”‘’„\u2012-\u2015]|\\.{2,}|--)")
_COMMA_OR_COLON = re.compile(r"([:,])(?!\d)")
_FINAL_PERIOD = re.compile(r"(?<=[^.])(\.)([\]\)}>\"'»”’\s]*)$")
_CLITIC = re.compile(r"(?i)(?<=[^' ])('s|'m|'d|'ll|'re|'ve|n't|')$")
_OPENING_QUOTE = re.compile(r"(^|(?<=[\s(\[{<]))\"")
# A single quote opening a word ('bends') is split off unless it starts a clitic ('s, 're, ...).
_OPENING_APOSTROPHE = re.compile(r"(?i)(?<!\w)'(?!(?:re|ve|ll|m|t|s|d|n)\b)(?=\w)")
# Words the Treebank conventions split in two ("cannot" -> "can" "not").
_SPLIT_WORDS = re.compile(r"(?i)\b(can)(not)\b|\b(gon|wan)(na)\b|\b(got)(ta)\b|\b(gim|lem)(me)\b")

LANGUAGES = ("en", "zh")
VERSIONS = ("1.1", "2.0")


def normalize_answer(text: str) -> str:
    """The official SQuAD normalisation: lower-case, drop punctuation, drop articles, collapse whitespace.

    Example: "The  Denver Broncos!" -> "denver broncos".
    """
    text = "".join(ch for ch in text.lower() if ch not in _ENGLISH_PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def normalize_answer_zh(text: str) -> str:
    """The CMRC 2018 exact-match normalisation: lower-case, strip, remove the script's punctuation.

    Inner whitespace is kept, as in the official script.
    """
    return "".join(ch for ch in text.lower().strip() if ch not in _CHINESE_SCRIPT_PUNCTUATION)


def _word_tokenize(run: str) -> list[str]:
    """Split a non-Chinese run the way Penn Treebank tokenizers do (see the module docstring)."""
    run = _OPENING_QUOTE.sub(" `` ", run)
    run = _OPENING_APOSTROPHE.sub("' ", run)
    run = _FINAL_PERIOD.sub(r" \1 \2 ", run)
    run = _ALWAYS_SPLIT.sub(r" \1 ", run)
    run = _COMMA_OR_COLON.sub(r" \1 ", run)
    run = run.replace('"', " '' ")
    run = _SPLIT_WORDS.sub(lambda m: " ".join(part for part in m.groups() if part), run)
    tokens: list[str] = []
    for word in run.split():
        clitic = _CLITIC.search(word)
        if clitic and clitic.start() > 0:
            tokens.extend((word[: clitic.start()], clitic.group(1)))
        else:
            tokens.append(word)
    return tokens


def _mixed_segmentation(text: str) -> list[str]:
    """CMRC 2018 tokens: punctuation removed, one token per CJK character, word tokens in between."""
    tokens: list[str] = []
    pending: list[str] = []
    for ch in text.lower().strip():
        if ch in _CHINESE_SCRIPT_PUNCTUATION:
            continue
        if _CJK.match(ch):
            if pending:
                tokens.extend(_word_tokenize("".join(pending)))
                pending = []
            tokens.append(ch)
        else:
            pending.append(ch)
    if pending:
        tokens.extend(_word_tokenize("".join(pending)))
    return tokens


def answer_tokens(text: str, language: str = "en") -> list[str]:
    """The tokens F1 is computed over.

    Args:
        text: an answer string.
        language: "en" (normalised whitespace tokens) or "zh" (CMRC 2018 mixed segmentation).

    Returns:
        The token list; empty when the text normalises to nothing.
    """
    _check_language(language)
    if language == "zh":
        return _mixed_segmentation(text)
    return normalize_answer(text).split()


def _longest_common_run(a: list[str], b: list[str]) -> int:
    """Length of the longest contiguous token run that `a` and `b` share (dynamic programming, O(|a||b|))."""
    best = 0
    previous = [0] * (len(b) + 1)
    for token_a in a:
        current = [0] * (len(b) + 1)
        for j, token_b in enumerate(b):
            if token_a == token_b:
                current[j + 1] = previous[j] + 1
                best = max(best, current[j + 1])
        previous = current
    return best


def _f1(overlap: int, prediction_length: int, gold_length: int) -> float:
    if overlap == 0:
        return 0.0
    precision = overlap / prediction_length
    recall = overlap / gold_length
    return 2 * precision * recall / (precision + recall)


def _score_one(prediction: str, gold: str, language: str, version: str) -> tuple[float, float]:
    """(exact match, F1) of a prediction against one gold answer."""
    if language == "zh":
        exact = float(normalize_answer_zh(prediction) == normalize_answer_zh(gold))
        prediction_tokens = _mixed_segmentation(prediction)
        gold_tokens = _mixed_segmentation(gold)
        overlap = _longest_common_run(gold_tokens, prediction_tokens)
    else:
        exact = float(normalize_answer(prediction) == normalize_answer(gold))
        prediction_tokens = normalize_answer(prediction).split()
        gold_tokens = normalize_answer(gold).split()
        overlap = sum((Counter(prediction_tokens) & Counter(gold_tokens)).values())
    if version == "2.0" and (not prediction_tokens or not gold_tokens):
        # v2.0: an empty side means "no answer"; F1 is 1 exactly when both sides say so.
        return exact, float(prediction_tokens == gold_tokens)
    return exact, _f1(overlap, len(prediction_tokens), len(gold_tokens))


def score_answer(
    prediction: str, gold_answers: Sequence[str], language: str = "en", version: str = "1.1"
) -> tuple[float, float]:
    """Exact match and F1 of one prediction: the best score over the gold answers.

    Args:
        prediction: the predicted answer text ("" for "no answer" in v2.0).
        gold_answers: the gold answer texts; empty for an unanswerable (v2.0) question.
        language: "en" or "zh".
        version: "1.1" or "2.0" (the two official scripts differ on answers that normalise to nothing).

    Returns:
        (exact_match, f1), each in [0, 1].

    Raises:
        InputError: for v1.1 with no gold answers, or an unknown language/version.
    """
    _check_language(language)
    _check_version(version)
    if version == "2.0":
        # evaluate-v2.0.py drops gold answers that normalise to nothing; none left means unanswerable.
        gold_answers = [g for g in gold_answers if answer_tokens(g, language)] or [""]
    elif not gold_answers:
        raise InputError("a SQuAD v1.1 question needs at least one gold answer; use version='2.0' for "
                         "unanswerable questions")
    scores = [_score_one(prediction, gold, language, version) for gold in gold_answers]
    return max(s[0] for s in scores), max(s[1] for s in scores)


def _check_language(language: str) -> None:
    if language not in LANGUAGES:
        raise InputError(f"language={language!r} is not supported; use 'en', 'zh' or (evaluate_squad) 'auto'")


def _check_version(version: str) -> None:
    if version not in VERSIONS:
        raise InputError(f"version={version!r} is not a SQuAD version; use '1.1' or '2.0'")


def _load_json(path: str | os.PathLike) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise DataError("file not found; pass the SQuAD-format JSON (with a 'data' list)", path) from None
    except json.JSONDecodeError as error:
        raise DataError(f"not valid JSON ({error.msg}); pass the SQuAD-format JSON file", path,
                        error.lineno) from None


def squad_gold_answers(dataset: Mapping | Sequence) -> dict[str, list[str]]:
    """Gold answer texts per question id from a SQuAD-format dataset.

    Args:
        dataset: the parsed JSON (a dict with a "data" list) or its "data" list of articles.

    Returns:
        {question id: [answer text, ...]}, in file order; an empty list marks an unanswerable question.

    Raises:
        DataError: if the structure is not SQuAD's (naming the missing key).
    """
    gold: dict[str, list[str]] = {}
    try:
        articles = dataset["data"] if isinstance(dataset, Mapping) else dataset
        for article in articles:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    gold[qa["id"]] = [answer["text"] for answer in qa["answers"]]
    except (KeyError, TypeError) as error:
        raise DataError(
            f"not SQuAD format: missing or malformed {error}; expected "
            "data[].paragraphs[].qas[] with 'id' and 'answers'[].text"
        ) from None
    return gold


def detect_language(texts: Sequence[str]) -> str:
    """"zh" when at least half of the non-space characters of `texts` are CJK (U+4E00 to U+9FA5), else "en"."""
    cjk = 0
    total = 0
    for text in texts:
        for ch in text:
            if not ch.isspace():
                total += 1
                cjk += bool(_CJK.match(ch))
    return "zh" if total and cjk * 2 >= total else "en"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def evaluate_squad(
    predictions: Mapping[str, str],
    dataset_or_answers: Mapping | Sequence | str | os.PathLike,
    language: str = "en",
    version: str | None = None,
) -> dict[str, float | int]:
    """Score predictions against a SQuAD-format dataset, as the official scripts do.

    Args:
        predictions: {question id: predicted answer text}; "" means "no answer" (v2.0). Ids that are not in
            the dataset are ignored; questions without a prediction score 0 and count in the total.
        dataset_or_answers: the SQuAD-format dataset (parsed dict with "data", its "data" list, or a path
            to the JSON file), or {question id: [gold answer text, ...]}.
        language: "en", "zh" or "auto" (`detect_language` over the gold answers).
        version: "1.1", "2.0", or None to infer: "2.0" when the dataset's "version" field starts with
            "v2"/"2" or any question has no gold answer, else "1.1".

    Returns:
        {"exact_match": fraction in [0, 1], "f1": fraction in [0, 1], "total": questions, "missing": questions without a prediction}, plus
        for v2.0 "HasAns_exact", "HasAns_f1", "HasAns_total" and "NoAns_exact", "NoAns_f1", "NoAns_total"
        for whichever of the two groups is non-empty (as evaluate-v2.0.py reports them).

    Raises:
        DataError: if the dataset is not SQuAD format or the file cannot be read.
        InputError: for a non-string prediction, an empty dataset, or an unknown language/version.
    """
    path = None
    if isinstance(dataset_or_answers, str | os.PathLike):
        path = dataset_or_answers
        dataset_or_answers = _load_json(path)
    gold, declared_version = _gold_and_version(dataset_or_answers, path)
    if not gold:
        raise InputError("the dataset holds no questions; nothing to evaluate")

    if version is None:
        declared_v2 = declared_version is not None and declared_version.lstrip("vV").startswith("2")
        version = "2.0" if declared_v2 or any(not answers for answers in gold.values()) else "1.1"
    _check_version(version)
    if language == "auto":
        language = detect_language([text for answers in gold.values() for text in answers])
    _check_language(language)

    exact_scores, f1_scores, missing = _question_scores(predictions, gold, language, version)
    results: dict[str, float | int] = {
        "exact_match": _mean(list(exact_scores.values())),
        "f1": _mean(list(f1_scores.values())),
        "total": len(gold),
        "missing": missing,
    }
    if version == "2.0":
        # evaluate-v2.0.py splits on the raw answer list: a question is answerable if it lists any answer.
        groups = {"HasAns": [q for q, a in gold.items() if a], "NoAns": [q for q, a in gold.items() if not a]}
        for name, qids in groups.items():
            if qids:
                results[f"{name}_exact"] = _mean([exact_scores[q] for q in qids])
                results[f"{name}_f1"] = _mean([f1_scores[q] for q in qids])
                results[f"{name}_total"] = len(qids)
    return results


def _gold_and_version(dataset_or_answers: Mapping | Sequence,
                      path: str | os.PathLike | None) -> tuple[dict[str, list[str]], str | None]:
    """(gold answer texts per question id, the dataset's declared "version" or None) from a SQuAD-format
    dataset or a {question id: [answer, ...]} mapping; `path` names the file in errors."""
    if isinstance(dataset_or_answers, Mapping) and "data" not in dataset_or_answers:
        gold = {}
        for qid, answers in dataset_or_answers.items():
            if isinstance(answers, str) or not isinstance(answers, Sequence):
                raise DataError(f"gold answers for question {qid!r} are {type(answers).__name__}; expected a "
                                "list of answer texts (or a SQuAD-format dataset with a 'data' list)", path)
            gold[qid] = [a["text"] if isinstance(a, Mapping) else a for a in answers]
        return gold, None
    declared_version = None
    if isinstance(dataset_or_answers, Mapping):
        declared_version = str(dataset_or_answers.get("version", ""))
    try:
        return squad_gold_answers(dataset_or_answers), declared_version
    except DataError as error:
        raise DataError(str(error), path) from None


def _question_scores(predictions: Mapping[str, str], gold: Mapping[str, list[str]], language: str,
                     version: str) -> tuple[dict[str, float], dict[str, float], int]:
    """(exact match per question, F1 per question, questions without a prediction, which score 0)."""
    exact_scores: dict[str, float] = {}
    f1_scores: dict[str, float] = {}
    missing = 0
    for qid, answers in gold.items():
        if qid not in predictions:
            missing += 1
            exact_scores[qid] = f1_scores[qid] = 0.0
            continue
        prediction = predictions[qid]
        if not isinstance(prediction, str):
            raise InputError(
                f"prediction for question {qid!r} is {type(prediction).__name__}, not the answer text (str)"
            )
        if version == "1.1" and not answers:
            raise DataError(f"question {qid!r} has no gold answer; SQuAD v1.1 needs one (use version='2.0')")
        exact_scores[qid], f1_scores[qid] = score_answer(prediction, answers, language, version)
    return exact_scores, f1_scores, missing
