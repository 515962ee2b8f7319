"""Token tagging (NER and the like): one label per word, entities with character offsets.

Owns: the models (`BertForTokenClassification`: each token's hidden state -> dropout -> classifier;
`ModernBertForTokenClassification`: ModernBERT's prediction head before them; each with `config.use_crf` a
linear-chain CRF over the words, `families.crf`, through `CrfTagger`), their objective (cross-entropy over
labelled tokens, optionally class-weighted or focal; or the CRF's negative log-likelihood per row), features
(word labels aligned to sub-tokens, long sentences windowed), decoding (word tags -> entities with character
offsets and a score), entity-level metrics (conlleval rules, and the share of ill-formed predicted spans)
and the pipeline's JSON. Sentences and their file readers are in `data.tagging`.

Alignment (the WordPiece problem): words are joined with single spaces and tokenised once; each token maps
to the word holding its first character. The word's label goes on its first sub-token; the other pieces
get IGNORE_INDEX (`label_policy="first"`), or with "all" the word's label (B- turned into I- after the first
piece). A sentence longer than the window is split into windows (`tokenization.windows`); each word is
predicted once, by its first sub-token in the window where that token has the most context.

CRF (`config.use_crf`, `head.crf` in a run file): a row's CRF sequence is its labelled positions, i.e. the
first sub-token of each of its words ("first" policy only: with "all" the sequence would mix words and
pieces). Training labels of a CRF tagger are the tags as they are scored (an ill-formed "O I-PER" becomes
"O B-PER", conlleval's reading), and a window that starts (or, IOBES, ends) inside an entity leaves that
entity's words unlabelled in that window, since the scheme forbids a sequence to start on I- (end on B-/I-);
the neighbouring window, which overlaps, labels them. The loss is summed over rows and counted per row.

Decoding: a word's scores are the logits of the token that predicts it. Without a CRF its tag is the
arg-max label and its confidence that label's probability; with one, the tags of all the example's words
come from constrained Viterbi over the whole sentence (windows joined) and each word's confidence is its
CRF marginal. IOBES tags are read as BIO (the model's own tags are kept as "iobes_tags"); labels without a
prefix ("PER") are the IO scheme and read as I- tags. An entity's score is the mean confidence of its words.
Raw text (predict, the server) is split into words by the tokenizer's own pre-tokenizer
(whitespace, punctuation, CJK characters); `{"words": [...]}` gives the words explicitly, as a CoNLL file
does, and then predict sees exactly what evaluate sees.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

from bertforge.constants import IGNORE_INDEX
from bertforge.data.finetuning import DataReport, Feature
from bertforge.data.tagging import (
    LABEL_POLICIES,
    TaggingExample,
    check_tag_labels,
    read_tagged,
    scheme_tags,
    tag_list,
)
from bertforge.errors import CheckpointError, ConfigError, InputError
from bertforge.families.base import (
    Family,
    FamilyTraining,
    FineTuningModel,
    InputSettings,
    LossSettings,
    Objective,
    check_text,
    label_loss,
    mean_loss,
    softmax,
    symmetric_kl,
)
from bertforge.families.crf import (
    DISALLOWED,
    CrfScores,
    LinearChainCRF,
    as_numpy,
    labelled_sequences,
    log_likelihood,
    marginals,
    split_label,
    trim_cut_entities,
    viterbi,
)
from bertforge.metrics.tagging import (
    bio_to_iobes,
    count_invalid_spans,
    entity_scores,
    get_entities,
    iobes_to_bio,
)
from bertforge.model.config import BertConfig
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.heads import TaskOutput, build_classifier, feature_size, token_features
from bertforge.model.modernbert import ModernBertClassifier
from bertforge.tokenization.tokenizer import Tokenizer
from bertforge.tokenization.windows import max_context_windows, window_spans

# Every DEV_EVERY-th sentence of a tagging train file forms the carved dev split (5%) of tasks without one.
DEV_EVERY = 20


def objective(logits: torch.Tensor, labels: torch.Tensor, crf: CrfScores | None = None,
              loss: LossSettings | None = None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The tagging objective as {term: (sum, count)}: logits [B, T, C], labels [B, T].

    Without `crf`: cross-entropy summed over labelled tokens (class-weighted / focal with `loss`), counted
    in labelled tokens, so the mean is the per-token loss whatever the batch split. With `crf` (the model's
    constrained scores): the negative log-likelihood of each row's labelled sequence, summed over rows and
    counted in rows that have a label, so the mean is the per-sentence (per-window) loss. The labels must
    form sequences the scheme allows (those of `build_features(..., crf=True)` do); a disallowed one scores
    `crf.DISALLOWED` and its loss is about 1e4.
    """
    if crf is None:
        return {"cross_entropy": label_loss(logits.flatten(0, 1), labels.flatten(), loss, IGNORE_INDEX)}
    emissions, tags, mask = labelled_sequences(logits, labels)
    if mask.shape[1] == 0:
        # No labelled token: a zero that still reaches every head parameter (DDP expects their gradients).
        zero = logits.float().sum() * 0.0 + sum(s.float().sum() for s in crf) * 0.0
        return {"crf_nll": (zero, zero.new_zeros(()))}
    nll = -log_likelihood(emissions, tags, mask, crf).sum()
    return {"crf_nll": (nll, mask[:, 0].sum().float())}


@dataclass
class TaggingOutput(TaskOutput):
    """A tagger's output; `crf`: the CRF's constrained scores (part of the graph) when the model has one."""

    crf: CrfScores | None = None


class CrfTagger:
    """What every tagger (BERT's, ModernBERT's) does after its classifier: with `config.use_crf` a linear-chain
    CRF over the labelled positions (`crf.*`, made by `add_crf`), whose scores every output carries (constant:
    an engine running an exported graph takes them from here), and the loss of `objective`."""

    crf: LinearChainCRF | None

    def add_crf(self, config) -> None:
        """The CRF over `config.label_names` when `config.use_crf` (ConfigError naming head.crf for labels that
        are not BIO/IOBES)."""
        self.crf = LinearChainCRF(config.label_names) if config.use_crf else None

    def constant_outputs(self) -> dict[str, Any]:
        return {"crf": self.crf.scores()} if self.crf is not None else {}

    def tagged(self, logits: torch.Tensor, labels: torch.Tensor | None, out) -> TaggingOutput:
        """The output of logits [B, T, C] on the encoder's output `out`: the CRF's scores, the loss with labels."""
        crf = self.crf.scores() if self.crf is not None else None
        loss = None if labels is None else mean_loss(objective(logits, labels, crf))
        return TaggingOutput(logits, loss, out.hidden_states, out.attentions, crf=crf)


class BertForTokenClassification(CrfTagger, FineTuningModel):
    """Each token's hidden state -> dropout -> classifier, and with `config.use_crf` a linear-chain CRF over
    the labelled positions (`crf.*`). Labels [B, T] use IGNORE_INDEX on tokens that carry no label
    (continuation pieces, special tokens, padding).

    Raises:
        ConfigError: `use_crf` with labels that are not BIO/IOBES (naming head.crf).
    """

    head_prefixes = ("classifier.", "crf.")

    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = build_classifier(config, feature_size(config), config.num_labels)
        self.add_crf(config)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False, output_hidden_states: bool = False) -> TaggingOutput:
        out = self.encode(input_ids, token_type_ids, attention_mask, output_attentions, output_hidden_states)
        return self.tagged(self.classifier(self.dropout(token_features(self.config, out))), labels, out)  # [B, T, C]


class ModernBertForTokenClassification(CrfTagger, ModernBertClassifier):
    """ModernBERT's tagger, as transformers' (so the directory loads there): prediction head, dropout, classifier
    on every token: logits [B, T, C]; with `config.use_crf` the CRF over them, as BERT's (`crf.*`, which
    transformers' class leaves aside)."""

    head_prefixes = ("head.", "classifier.", "crf.")

    def __init__(self, config: ModernBertConfig):
        super().__init__(config)
        self.add_crf(config)  # zero scores, which init_weights leaves alone

    def forward(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None = None,
                attention_mask: torch.Tensor | None = None, labels: torch.Tensor | None = None, *,
                position_ids: torch.Tensor | None = None, output_hidden_states: bool = False,
                output_attentions: bool = False) -> TaggingOutput:
        """Arguments in `BertForTokenClassification.forward`'s order; token_type_ids are unused (no segments)."""
        out, features = self.encode_features(input_ids, attention_mask, position_ids, output_hidden_states,
                                             output_attentions)
        logits = self.classifier(self.dropout(self.head(features)))  # [B, T, H*k] -> [B, T, H] -> [B, T, C]
        return self.tagged(logits, labels, out)


class TagEmissions(NamedTuple):
    """One window's output of a CRF tagger (`Tagging.forward`): its logits [T, C] (the CRF's emission
    scores) and the model's CRF scores as float64 numpy arrays, one object shared by every row of a batch."""

    logits: torch.Tensor
    crf: CrfScores


class TaggingObjective(Objective):
    """The training loop's view of a tagger: `objective` with the model's CRF or the loss settings, the
    labelled tokens' accuracy, and R-Drop's consistency term.

    Counts: labelled tokens for the cross-entropy, rows with a label for the CRF ("crf_nll").
    """

    def __init__(self, crf: bool = False, loss: LossSettings | None = None):
        self.crf = crf
        self.loss = None if loss is None or loss.plain else loss
        self.term = "crf_nll" if crf else "cross_entropy"

    def counts(self, batch) -> dict[str, torch.Tensor]:
        """Labelled tokens (cross-entropy) or labelled rows (CRF) in the batch, known before the forward pass."""
        labelled = batch.labels != IGNORE_INDEX  # [B, T]
        return {self.term: (labelled.any(-1) if self.crf else labelled).sum().float()}

    def loss_terms(self, output: TaggingOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        crf = getattr(output, "crf", None) if self.crf else None
        if self.crf and crf is None:
            raise ValueError("the tagging objective has a CRF term but the model's output carries no CRF scores; "
                             "build the objective with objective_for(model.config)")
        return objective(output.logits, batch.labels, crf, self.loss)

    def metrics(self, output: TaggingOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        """Token accuracy of the arg-max of the (emission) scores over labelled tokens."""
        real = batch.labels != IGNORE_INDEX
        correct = ((output.logits.detach().argmax(-1) == batch.labels) & real).sum().float()
        return {"token_accuracy": (correct, real.sum().float())}

    def consistency(self, output_a: TaggingOutput, output_b: TaggingOutput, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """R-Drop between two dropout passes: the symmetric KL of the labelled tokens' label distributions,
        summed over those tokens, with the count of the first loss term (labelled tokens; for the CRF, rows,
        so the term is the per-row sum of its tokens' KL, on the scale of the per-row likelihood)."""
        keep = (batch.labels != IGNORE_INDEX).flatten()  # [B*T]
        total = symmetric_kl(output_a.logits.flatten(0, 1)[keep], output_b.logits.flatten(0, 1)[keep])
        return total, self.counts(batch)[self.term]


def token_words(example: TaggingExample, tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """Token ids of the sentence and, per token, the index of the word it belongs to.

    Words are joined with single spaces (so every word starts a token, also for character-per-line data
    where "1998" must stay four labelled characters) and tokenised once; a token belongs to the word that
    holds its first character.
    """
    starts = []
    position = 0
    for word in example.words:
        starts.append(position)
        position += len(word) + 1
    encoding = tokenizer.encode(" ".join(example.words), add_special_tokens=False)
    owners = [bisect.bisect_right(starts, start) - 1 for start, _ in encoding.offsets]
    return encoding.ids, owners


def build_features(examples: Sequence[TaggingExample], tokenizer: Tokenizer, settings: InputSettings, *,
                   label2id: Mapping[str, int] | None = None, report: DataReport | None = None,
                   crf: bool = False) -> list[Feature]:
    """Tokenise sentences, align word labels to sub-tokens and window long sentences.

    Args:
        examples: the sentences.
        tokenizer: the model's tokenizer.
        settings: window length, doc stride, `tag_scheme` of the labels and `label_policy`.
        label2id: tag -> id (in the tag scheme); None for unlabeled prediction.
        report: gets `features`, `windowed_inputs`, `words_without_tokens` (e.g. a word that is only a
            control character: predicted "O").
        crf: the labels are for a CRF tagger (see the module docstring): tags as scored, and an entity cut
            by a window's edge unlabelled in that window.

    Returns:
        Features with `token_labels` (when labelled) and `word_index` (which word each token predicts).

    Raises:
        ConfigError: an unknown label policy, or policy "all" for a CRF tagger's labels.
    """
    if settings.label_policy not in LABEL_POLICIES:
        raise ConfigError(f"label_policy={settings.label_policy!r}; use one of {LABEL_POLICIES}")
    labelled = label2id is not None and any(e.tags is not None for e in examples)
    if crf and labelled and settings.label_policy == "all":
        raise ConfigError("features.label_policy = \"all\" labels every sub-token, but head.crf scores one tag per "
                          "word (its first sub-token); use label_policy = \"first\" with head.crf")
    report = report if report is not None else DataReport()
    post = tokenizer.post_processor
    room = settings.max_seq_length - post.added(False)
    prefixes = {i: name[0] for name, i in (label2id or {}).items()}
    features: list[Feature] = []
    for index, example in enumerate(examples):
        ids, owners = token_words(example, tokenizer)
        first_piece = [i == 0 or owners[i] != owners[i - 1] for i in range(len(ids))]
        covered = len(set(owners))
        if covered < len(example.words):
            report.note("words_without_tokens", example.source, amount=len(example.words) - covered)
        token_labels = None
        if label2id is not None and example.tags is not None:
            tags = example.tags
            if settings.tag_scheme == "IOBES":
                tags = bio_to_iobes(tags)
            elif crf:
                # The tags as the scorer reads them: a CRF cannot learn a transition its scheme forbids.
                tags = iobes_to_bio(bio_to_iobes(tags))
            token_labels = []
            for i, owner in enumerate(owners):
                if first_piece[i]:
                    token_labels.append(label2id[tags[owner]])
                elif settings.label_policy == "all":
                    tag = tags[owner]
                    inner = "I-" + tag[2:] if tag[:2] in ("B-", "I-", "E-", "S-") else tag
                    token_labels.append(label2id.get(inner, label2id[tag]))
                else:
                    token_labels.append(IGNORE_INDEX)
        spans = window_spans(len(ids), room, settings.doc_stride)
        if len(spans) > 1:
            report.note("windowed_inputs", example.source)
        best = max_context_windows(spans, len(ids))
        for window, (start, size) in enumerate(spans):
            end = start + size
            input_ids, types = post.assemble(ids[start:end])
            word_index: list[int | None] = [None]
            word_index += [owners[i] if first_piece[i] and best[i] == window else None for i in range(start, end)]
            word_index.append(None)
            labels = None
            if token_labels is not None:
                labels = token_labels[start:end]
                if crf:
                    labels = trim_cut_entities(labels, prefixes, cut_before=start > 0, cut_after=end < len(ids))
                labels = [IGNORE_INDEX, *labels, IGNORE_INDEX]
            features.append(Feature(index, input_ids, types, token_labels=labels, word_index=word_index,
                                    window=window))
    report.note("features", amount=len(features))
    return features


def readable_tags(names: Sequence[str]) -> tuple[list[str], bool]:
    """(tags to decode with, whether they are IOBES): prefix-less labels ("PER") are the IO scheme, read as
    I- tags, which start an entity after O or a type change."""
    tags = [n if n == "O" or (len(n) > 2 and n[1] == "-" and n[0] in "BIES") else f"I-{n}" for n in names]
    return tags, any(t[:2] in ("E-", "S-") for t in tags)


class TaggingTraining(FamilyTraining):
    """What fine-tuning asks of tagging: the run's tag set in its scheme, tags per word for class weights,
    the head and its objective (the CRF's likelihood or the weighed cross-entropy)."""

    settings = frozenset({"head.crf", "features.tag_scheme", "features.label_policy", "head.class_weights",
                          "head.balanced_class_weights", "head.focal_gamma", "data.token_column", "data.tag_column",
                          "data.separator", "data.bio_errors"})

    def label_names(self, examples, given, settings, kind=None):
        # A named task's (or --labels') tag set is complete even when a small --train-limit misses some tags.
        return scheme_tags(given, settings.tag_scheme) if given else tag_list(examples, settings.tag_scheme)

    def label_counts(self, examples, label_names, settings):
        """Training words per tag, in the model's scheme (what the loss counts with label_policy "first")."""
        index = {name: i for i, name in enumerate(label_names)}
        counts = [0] * len(label_names)
        for example in examples:
            if example.tags is not None:
                for tag in bio_to_iobes(example.tags) if settings.tag_scheme == "IOBES" else example.tags:
                    counts[index[tag]] += 1
        return counts

    def head_config(self, label_names, kind=None):
        return {"id2label": dict(enumerate(label_names)), "label2id": None, "problem_type": None}

    def objective_for(self, config: BertConfig, loss: LossSettings | None = None) -> TaggingObjective:
        """The CRF likelihood when `config.use_crf`, else the cross-entropy weighed by `loss`.

        Raises:
            ConfigError: class weights / focal loss together with the CRF (whose loss is per sentence, not per
                token), or class weights that do not give one number per label.
        """
        self.refuse_contrastive(loss)
        if loss is not None and not loss.plain:
            if config.use_crf:
                raise ConfigError("head.class_weights and head.focal_gamma weigh each token's cross-entropy, which "
                                  "head.crf replaces by the sentence's likelihood; remove head.class_weights / "
                                  "head.focal_gamma or turn head.crf off")
            loss.check_labels(config.num_labels)
        return TaggingObjective(config.use_crf, loss)


class Tagging(Family):
    """Named entities (or any word labels) with character offsets."""

    name = "tagging"
    aliases = ("ner", "tag", "token_classification", "conll", "sequence_labeling")
    model_class = BertForTokenClassification
    task = "tag"
    options: dict[str, Any] = {}
    export_outputs = {"logits": {0: "batch", 1: "sequence"}}
    example_inputs = ["George Washington went to Washington in 1789.", "Angela works for Siemens in Munich.",
                    "The Nile flows through Egypt and Sudan."]

    default_metrics = ("f1", "precision", "recall")
    formats = {"ner": None}
    training_hooks = TaggingTraining

    def check_model(self, config: BertConfig) -> None:
        if not config.id2label:
            raise CheckpointError("the model's config.json has no id2label (tag names such as \"B-PER\"); add them")

    def read(self, path, *, part, task, report, labelled=True):
        reader = task.reader
        examples = read_tagged(path, token_column=reader.token_column,
                               tag_column=reader.tag_column if labelled else None, separator=reader.separator,
                               bio_errors=reader.bio_errors, on_invalid=reader.on_invalid, report=report)
        if part is not None:
            # A task without a dev file: every DEV_EVERY-th sentence is held out, deterministically.
            held = part == "eval"
            examples = [e for i, e in enumerate(examples) if (i % DEV_EVERY == DEV_EVERY - 1) == held]
        return examples

    def metric_names(self, task, dev_examples=None):
        return ("f1", "precision", "recall", "invalid_span_share")

    def check_labels(self, examples, label_names, settings, origin="training"):
        check_tag_labels(examples, {name: i for i, name in enumerate(label_names)}, settings.tag_scheme, origin)

    def labelled(self, examples):
        return all(e.tags is not None for e in examples)

    def parse(self, item: Any) -> TaggingExample:
        if isinstance(item, Mapping) and "words" in item:
            words = item["words"]
            if not isinstance(words, list) or not words or not all(isinstance(w, str) and w.strip() for w in words):
                raise InputError("words must be a non-empty list of non-blank strings")
            return TaggingExample(list(words), None, " ", "input")
        if isinstance(item, Mapping):
            if "text" not in item:
                raise InputError(f"missing field 'text' (got fields {sorted(item)}); send a string, "
                                 "{\"text\": ...} or {\"words\": [...]}")
            item = item["text"]
        if not isinstance(item, str):
            raise InputError(f"expected a string, {{\"text\": ...}} or {{\"words\": [...]}}, got {type(item).__name__}")
        return TaggingExample([], None, " ", "input", original=check_text(item, "text"))

    def windowed_texts(self, example):
        return [example.text]

    def features(self, examples, tokenizer, settings, *, config, report=None, training=False):
        for example in examples:
            if example.original is not None and not example.words:
                # Raw text: the tokenizer's own word split, with spans into the text the user sent.
                pieces = tokenizer.pre_tokenize(example.original)
                example.words = [example.original[start:end] for _, start, end in pieces]
                example.spans = [(start, end) for _, start, end in pieces]
        label2id = config.label2id if any(e.tags is not None for e in examples) else None
        return build_features(examples, tokenizer, settings, label2id=label2id, report=report, crf=config.use_crf)

    def forward(self, model, batch, options=None):
        """Per row its logits [T, C]; for a CRF tagger a `TagEmissions` that also carries the CRF's scores."""
        out = model(**batch.model_inputs())
        logits = out.logits.float().cpu()  # [B, T, C]
        lengths = batch.attention_mask.sum(-1).tolist()
        rows = [logits[row, :int(n)] for row, n in enumerate(lengths)]
        crf = getattr(out, "crf", None)
        if crf is None:
            return rows
        shared = as_numpy(crf)  # one copy per batch, for every row
        return [TagEmissions(row, shared) for row in rows]

    def decode(self, examples, features, outputs, options, config, tokenizer=None):
        tags_of, iobes = readable_tags(config.label_names)
        crf = crf_of(outputs, config)
        # Per word: the scores of the token that predicts it (one token per word overall).
        words: list[dict[int, np.ndarray]] = [{} for _ in examples]
        for feature, output in zip(features, outputs):
            logits = np.asarray(output.logits if isinstance(output, TagEmissions) else output, dtype=np.float64)
            for position, word in enumerate(feature.word_index):
                if word is not None:
                    words[feature.example_index][word] = logits[position]  # [C]
        outside = config.label_names.index("O") if "O" in config.label_names else None
        results = []
        for example, predicted in zip(examples, words):
            if crf is None:
                best, confidence = arg_max_tags(predicted, len(example.words))
            else:
                best, confidence = viterbi_tags(predicted, len(example.words), crf, outside)
            own = [tags_of[b] if b is not None else "O" for b in best]
            tags = iobes_to_bio(own) if iobes else own
            spans = example.word_spans()
            text = example.text
            entities = []
            for entity in get_entities(tags, "BIO"):
                begin, end = spans[entity.start][0], spans[entity.end][1]
                score = float(np.mean(confidence[entity.start:entity.end + 1]))
                entities.append({"type": entity.type, "start": begin, "end": end, "text": text[begin:end],
                                 "score": score})
            result = {"entities": entities, "tags": tags}
            if iobes:
                result["iobes_tags"] = own
            results.append(result)
        return results

    def record(self, example, result):
        record = {"text": example.text, "words": example.words, **result}
        if example.tags is not None:
            record["gold"] = example.tags
        return record

    def score(self, examples, results, config, *, metric_names=None, **_):
        """Entity f1/precision/recall (conlleval rules) and `invalid_span_share`: the share of predicted
        entity spans that the model's own tags form ill (an I- that starts an entity, an IOBES entity not
        closed by E-), read from its tags before they are read as BIO; 0 for IO labels, which cannot be
        ill-formed, and for a CRF tagger, which cannot predict them."""
        scores = entity_scores([e.tags for e in examples], [r["tags"] for r in results], "BIO")
        metrics = {"f1": scores["f1"], "precision": scores["precision"], "recall": scores["recall"]}
        details = {"per_type": scores["per_type"], "support": scores["support"], "predicted": scores["predicted"]}
        scheme = label_scheme(config.label_names)
        invalid = spans = 0
        if scheme == "IOBES":
            invalid, spans = count_invalid_spans([r.get("iobes_tags", r["tags"]) for r in results], "IOBES")
        elif scheme == "BIO":
            invalid, spans = count_invalid_spans([r["tags"] for r in results], "BIO")
        metrics["invalid_span_share"] = invalid / spans if spans else 0.0
        details["invalid_spans"] = invalid
        warnings = []
        if scores["predicted"] == 0:
            warnings.append(f"no entity predicted in {len(examples)} sentences: the model tags everything "
                            "'O' (too few steps, or a learning rate too high or too low)")
        return metrics, details, warnings


def label_scheme(names: Sequence[str]) -> str:
    """"IOBES", "BIO", or "IO" when a label has no prefix ("PER")."""
    parsed = [split_label(name) for name in names]
    if any(p is None for p in parsed):
        return "IO"
    return "IOBES" if any(p[0] in "ES" for p in parsed) else "BIO"


def crf_of(outputs: Sequence[Any], config: BertConfig) -> CrfScores | None:
    """The CRF scores a CRF tagger's outputs carry (None without a CRF)."""
    if not config.use_crf or not outputs:
        return None
    if not isinstance(outputs[0], TagEmissions):
        raise ValueError("the model config has use_crf but the outputs carry no CRF scores; run the model "
                         "through Tagging.forward")
    return outputs[0].crf


def arg_max_tags(predicted: Mapping[int, np.ndarray], count: int) -> tuple[list[int | None], list[float]]:
    """Per word the arg-max label and its probability; None (read "O", confidence 1) for a word no token
    predicts."""
    probs = {w: softmax(logits) for w, logits in predicted.items()}
    best = [int(probs[w].argmax()) if w in probs else None for w in range(count)]
    confidence = [float(probs[w].max()) if w in probs else 1.0 for w in range(count)]
    return best, confidence


def viterbi_tags(predicted: Mapping[int, np.ndarray], count: int, crf: CrfScores,
                 outside: int | None) -> tuple[list[int], list[float]]:
    """Per word the label of the best constrained sequence over the whole sentence and its CRF marginal.

    A word that no token predicts is "O", as without a CRF: its emissions allow only O (when the labels
    have one), and the path around it stays valid.
    """
    if count == 0:
        return [], []
    emissions = np.zeros((count, len(crf.start)))  # [L, C]
    for w in range(count):
        if w in predicted:
            emissions[w] = predicted[w]
        elif outside is not None:
            emissions[w] = DISALLOWED
            emissions[w, outside] = 0.0
    path, _ = viterbi(emissions, crf)
    probs = marginals(emissions, crf)  # [L, C]
    return path, [float(probs[t, label]) for t, label in enumerate(path)]


FAMILY = Tagging()
