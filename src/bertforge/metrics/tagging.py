"""Entity-level metrics for sequence labelling (NER), and the BIO / IOBES tag schemes.

Owns reading entities out of tag sequences (`get_entities`), converting between schemes (`bio_to_iobes`,
`iobes_to_bio`), checking that a sequence is well formed (`check_tags`, `check_bio`), counting the predicted
entity spans that are ill formed (`invalid_spans`, `count_invalid_spans`), and entity-level
precision/recall/F1, micro-averaged and per entity type (`entity_scores`).

Tags are "O" or "<prefix>-<TYPE>" with prefix B/I (BIO, also called IOB2) or B/I/E/S (IOBES); the type may
itself contain "-". Two ways of reading entities:

- default (lenient), the conlleval.pl rules that seqeval applies by default: an entity starts at B-, S-,
  and also at an I-/E- that follows O or a different type or a closed entity; it ends before O, B-, S-, a
  type change, or after E-/S-. So "O I-PER I-PER" holds one PER entity.
- strict: only well-formed entities count; BIO: B-X followed by I-X*; IOBES: S-X, or B-X I-X* E-X.
  Stray I-/E- tags and unterminated B- tags give no entity (seqeval's `mode="strict"`).

`entity_scores` equals seqeval's `classification_report` / `precision_score` / `recall_score` /
`f1_score` (default, or strict with scheme IOB2/IOBES) on the same sentences: entities are matched by
(sentence, type, start, end); a zero denominator gives 0.0. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from bertforge.errors import InputError

OUTSIDE = "O"
SCHEMES = {"BIO": frozenset("BI"), "IOBES": frozenset("BIES")}


class Entity(NamedTuple):
    """One entity span; `end` is inclusive (the index of its last token), as in seqeval."""

    type: str
    start: int
    end: int


class TagProblem(NamedTuple):
    """One ill-formed position found by `check_tags`."""

    index: int
    tag: str
    message: str


def _check_scheme(scheme: str) -> frozenset[str]:
    if scheme not in SCHEMES:
        raise InputError(f"scheme={scheme!r} is not supported; use 'BIO' or 'IOBES'")
    return SCHEMES[scheme]


def _split_tag(tag: str, prefixes: frozenset[str], scheme: str, index: int) -> tuple[str, str]:
    """("O", "") for the outside tag, else (prefix, type).

    Raises:
        InputError: for a tag that is not "O" or "<prefix>-<TYPE>" with a prefix of `scheme`.
    """
    if tag == OUTSIDE:
        return OUTSIDE, ""
    if not isinstance(tag, str) or len(tag) < 3 or tag[1] != "-" or tag[0] not in prefixes:
        raise InputError(
            f"tag {tag!r} at position {index} is not a {scheme} tag; expected 'O' or one of "
            f"{sorted(p + '-TYPE' for p in prefixes)} (check the label list and the scheme argument)"
        )
    return tag[0], tag[2:]


def _parse(tags: Sequence[str], scheme: str) -> list[tuple[str, str]]:
    prefixes = _check_scheme(scheme)
    return [_split_tag(tag, prefixes, scheme, i) for i, tag in enumerate(tags)]


def _lenient_entities(parsed: list[tuple[str, str]]) -> list[Entity]:
    """conlleval's chunk rules; they read B/I/E/S alike, so one pass serves both schemes."""
    entities: list[Entity] = []
    previous_prefix, previous_type = OUTSIDE, ""
    start = 0
    # A trailing "O" closes an entity that runs to the end of the sentence.
    for i, (prefix, type_) in enumerate([*parsed, (OUTSIDE, "")]):
        inside = previous_prefix != OUTSIDE
        ends = inside and (
            previous_prefix in "ES"
            or prefix in (OUTSIDE, "B", "S")
            or type_ != previous_type
        )
        if ends:
            entities.append(Entity(previous_type, start, i - 1))
        starts = prefix != OUTSIDE and (
            prefix in "BS"
            or previous_prefix in (OUTSIDE, "E", "S")
            or type_ != previous_type
        )
        if starts:
            start = i
        previous_prefix, previous_type = prefix, type_
    return entities


def _strict_entities(parsed: list[tuple[str, str]], scheme: str) -> list[Entity]:
    entities: list[Entity] = []
    closing = "I" if scheme == "BIO" else "E"
    i = 0
    while i < len(parsed):
        prefix, type_ = parsed[i]
        if scheme == "IOBES" and prefix == "S":
            entities.append(Entity(type_, i, i))
        elif prefix == "B":
            end = i
            while end + 1 < len(parsed) and parsed[end + 1] == ("I", type_):
                end += 1
            if scheme == "BIO":
                entities.append(Entity(type_, i, end))
            elif end + 1 < len(parsed) and parsed[end + 1] == (closing, type_):
                entities.append(Entity(type_, i, end + 1))
                end += 1
            i = end + 1
            continue
        i += 1
    return entities


def get_entities(tags: Sequence[str], scheme: str = "BIO", strict: bool = False) -> list[Entity]:
    """The entities of one tagged sentence.

    Args:
        tags: [T] tag strings of one sentence.
        scheme: "BIO" (B/I prefixes) or "IOBES" (B/I/E/S).
        strict: count only well-formed entities (see the module docstring); default: conlleval rules.

    Returns:
        Entities (type, start, end) with `end` inclusive, in order of their start.

    Raises:
        InputError: for a tag that does not belong to `scheme`.

    Example:
        get_entities(["B-PER", "I-PER", "O", "I-LOC"]) -> [("PER", 0, 1), ("LOC", 3, 3)]
    """
    parsed = _parse(tags, scheme)
    return _strict_entities(parsed, scheme) if strict else _lenient_entities(parsed)


def _encode(entities: list[Entity], length: int, scheme: str) -> list[str]:
    tags = [OUTSIDE] * length
    for type_, start, end in entities:
        if scheme == "IOBES" and start == end:
            tags[start] = f"S-{type_}"
            continue
        tags[start] = f"B-{type_}"
        for i in range(start + 1, end + 1):
            tags[i] = f"I-{type_}"
        if scheme == "IOBES":
            tags[end] = f"E-{type_}"
    return tags


def bio_to_iobes(tags: Sequence[str]) -> list[str]:
    """Rewrite a BIO sentence in IOBES: single-token entities become S-, last tokens E-.

    The entities are read with the default (conlleval) rules, so an ill-formed input such as
    "O I-PER" is converted as the entity it is scored as: ["O", "S-PER"].

    Raises:
        InputError: for a tag that is not BIO.
    """
    return _encode(get_entities(tags, "BIO"), len(tags), "IOBES")


def iobes_to_bio(tags: Sequence[str]) -> list[str]:
    """Rewrite an IOBES sentence in BIO (S- and B- become B-, E- becomes I-), entity by entity.

    Raises:
        InputError: for a tag that is not IOBES.
    """
    return _encode(get_entities(tags, "IOBES"), len(tags), "BIO")


def check_tags(tags: Sequence[str], scheme: str = "BIO") -> list[TagProblem]:
    """List the positions where a sentence breaks its tag scheme; never raises for bad tags.

    BIO: an I-X must follow B-X or I-X. IOBES: additionally, B-X and I-X must be followed by I-X or E-X,
    and E-X must follow B-X or I-X. Tags outside the scheme are reported too.

    Args:
        tags: [T] tag strings of one sentence.
        scheme: "BIO" or "IOBES".

    Returns:
        One `TagProblem(index, tag, message)` per offending position; empty when well formed.
    """
    prefixes = _check_scheme(scheme)
    problems: list[TagProblem] = []
    parsed: list[tuple[str, str] | None] = []
    for i, tag in enumerate(tags):
        try:
            parsed.append(_split_tag(tag, prefixes, scheme, i))
        except InputError:
            parsed.append(None)
            problems.append(TagProblem(i, tag, f"not a {scheme} tag (expected 'O' or "
                                               f"{'/'.join(sorted(prefixes))}-TYPE)"))
    for i, current in enumerate(parsed):
        if current is None or current[0] not in "IE":
            continue
        prefix, type_ = current
        previous = parsed[i - 1] if i > 0 else (OUTSIDE, "")
        if previous is None:
            continue
        if previous[0] in ("B", "I") and previous[1] == type_:
            continue
        if previous[0] in ("B", "I"):
            reason = f"follows {tags[i - 1]!r} of another type"
        elif i == 0:
            reason = "starts the sentence"
        else:
            reason = f"follows {tags[i - 1]!r}"
        problems.append(TagProblem(i, tags[i], f"{prefix}-{type_} {reason}; an entity must begin with "
                                               f"{'B' if scheme == 'BIO' else 'B or S'}-{type_}"))
    if scheme == "IOBES":
        for i, current in enumerate(parsed):
            if current is None or current[0] not in ("B", "I"):
                continue
            following = parsed[i + 1] if i + 1 < len(parsed) else (OUTSIDE, "")
            if following is not None and following[0] in ("I", "E") and following[1] == current[1]:
                continue
            problems.append(TagProblem(i, tags[i], f"{tags[i]} is not continued by I-/E-{current[1]}; "
                                                   f"an entity must end with E-{current[1]} (or be S-)"))
    # Stable sort: one report in sentence order, whichever check found the problem.
    problems.sort(key=lambda problem: problem.index)
    return problems


def check_bio(tags: Sequence[str]) -> list[TagProblem]:
    """`check_tags(tags, "BIO")`: the I- tags that follow O or another type, and non-BIO tags."""
    return check_tags(tags, "BIO")


def invalid_spans(tags: Sequence[str], scheme: str = "BIO") -> list[Entity]:
    """The entity spans of a sentence (read by the default, conlleval rules, as they are scored) that its
    tags form ill: in BIO one that starts with I- (after O, at the start, or after another type); in IOBES
    also one that starts with E-, or a B- entity not closed by E-. Exactly the spans that strict reading
    does not find.

    Raises:
        InputError: for a tag that does not belong to `scheme`.
    """
    well_formed = set(get_entities(tags, scheme, strict=True))
    return [entity for entity in get_entities(tags, scheme) if entity not in well_formed]


def count_invalid_spans(pred_seqs: Sequence[Sequence[str]], scheme: str = "BIO") -> tuple[int, int]:
    """(ill-formed spans, all spans) over predicted sentences [S][T_s]: see `invalid_spans`; their ratio is
    the share of predicted entities that a decoder without scheme constraints made up from stray tags."""
    invalid = total = 0
    for tags in pred_seqs:
        invalid += len(invalid_spans(tags, scheme))
        total += len(get_entities(tags, scheme))
    return invalid, total


def _prf(correct: int, predicted: int, gold: int) -> dict[str, float | int]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": f1, "support": gold}


def entity_scores(
    true_seqs: Sequence[Sequence[str]],
    pred_seqs: Sequence[Sequence[str]],
    scheme: str = "BIO",
    strict: bool = False,
) -> dict:
    """Entity-level precision, recall and F1, micro-averaged and per entity type.

    An entity counts as correct only if a gold entity has the same sentence, type, start and end.

    Args:
        true_seqs: [S][T_s] gold tags, one list per sentence.
        pred_seqs: [S][T_s] predicted tags, same shape.
        scheme: "BIO" or "IOBES".
        strict: read entities strictly (see the module docstring); default: conlleval rules.

    Returns:
        {"precision", "recall", "f1" (micro), "support" (gold entities), "predicted" (predicted entities),
        "per_type": {type: {"precision", "recall", "f1", "support"}}} with the types sorted and including
        types that only occur in predictions (support 0).

    Raises:
        InputError: if the sentence counts or any sentence's lengths differ, or a tag is not of `scheme`.
    """
    if len(true_seqs) != len(pred_seqs):
        raise InputError(f"got {len(pred_seqs)} predicted sentences for {len(true_seqs)} gold sentences")
    gold: set[tuple[int, Entity]] = set()
    predicted: set[tuple[int, Entity]] = set()
    for s, (true_tags, pred_tags) in enumerate(zip(true_seqs, pred_seqs)):
        if len(true_tags) != len(pred_tags):
            raise InputError(
                f"sentence {s} has {len(true_tags)} gold tags but {len(pred_tags)} predicted tags; "
                "predict one tag per token"
            )
        gold.update((s, entity) for entity in get_entities(true_tags, scheme, strict))
        predicted.update((s, entity) for entity in get_entities(pred_tags, scheme, strict))
    correct = gold & predicted

    types = sorted({entity.type for _, entity in gold | predicted})
    per_type = {}
    for type_ in types:
        per_type[type_] = _prf(
            sum(entity.type == type_ for _, entity in correct),
            sum(entity.type == type_ for _, entity in predicted),
            sum(entity.type == type_ for _, entity in gold),
        )
    return {**_prf(len(correct), len(predicted), len(gold)), "predicted": len(predicted), "per_type": per_type}
