"""Token tagging (NER and the like): one label per word, entities with character offsets.

Owns: the model (`BertForTokenClassification`: each token's hidden state -> dropout -> classifier), its
objective (cross-entropy over labelled tokens only), features (word labels aligned to sub-tokens, long
sentences windowed), decoding (word tags -> entities with character offsets and a score), entity-level
metrics (conlleval rules) and the pipeline's JSON. Sentences and their file readers are in `data.conll`.

Alignment (the WordPiece problem): words are joined with single spaces and tokenised once; each token maps
to the word holding its first character. The word's label goes on its first sub-token; the other pieces
get IGNORE_INDEX (`label_policy="first"`), or with "all" the word's label (B- turned into I- after the first
piece). A sentence longer than the window is split into windows (`tokenization.windows`); each word is
predicted once, by its first sub-token in the window where that token has the most context.

Decoding: a word's tag is the arg-max label of that token; IOBES tags are read as BIO; labels without a
prefix ("PER") are the IO scheme and read as I- tags. An entity's score is the mean probability of its
words' labels. Raw text (predict, the server) is split into words by the tokenizer's own pre-tokenizer
(whitespace, punctuation, CJK characters); `{"words": [...]}` gives the words explicitly, as a CoNLL file
does, and then predict sees exactly what evaluate sees.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge.constants import IGNORE_INDEX
from bertforge.data.conll import LABEL_POLICIES, TaggingExample, check_tag_labels, read_tagged, tag_list
from bertforge.data.finetuning import DataReport, Feature
from bertforge.errors import CheckpointError, ConfigError, InputError
from bertforge.families.base import Family, FineTuningModel, InputSettings, check_text, mean_loss, softmax
from bertforge.metrics.sequence_labeling import bio_to_iobes, entity_scores, get_entities, iobes_to_bio
from bertforge.model.config import BertConfig
from bertforge.model.heads import TaskOutput, build_classifier, feature_size, token_features
from bertforge.tokenization.tokenizer import Tokenizer
from bertforge.tokenization.windows import max_context_windows, window_spans

# Every DEV_EVERY-th sentence of a tagging train file forms the carved dev split (5%) of tasks without one.
DEV_EVERY = 20


def objective(logits: torch.Tensor, labels: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Cross-entropy summed over labelled tokens, with their count: logits [B, T, C], labels [B, T].

    Counts are labelled tokens (not sentences), so the mean is the per-token loss whatever the batch split.
    """
    flat = labels.flatten().long()  # [B*T]
    loss = F.cross_entropy(logits.flatten(0, 1).float(), flat, ignore_index=IGNORE_INDEX, reduction="sum")
    return {"cross_entropy": (loss, (flat != IGNORE_INDEX).sum().float())}


class BertForTokenClassification(FineTuningModel):
    """Each token's hidden state -> dropout -> classifier.  Labels [B, T] use IGNORE_INDEX on tokens that
    carry no label (continuation pieces, special tokens, padding)."""

    head_prefixes = ("classifier.",)

    def __init__(self, config: BertConfig):
        super().__init__(config, add_pooling_layer=False)
        self.dropout = nn.Dropout(config.head_dropout)
        self.classifier = build_classifier(config, feature_size(config), config.num_labels)
        self.init_weights()

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, labels=None,
                output_attentions: bool = False, output_hidden_states: bool = False) -> TaskOutput:
        out = self.encode(input_ids, token_type_ids, attention_mask, output_attentions, output_hidden_states)
        logits = self.classifier(self.dropout(token_features(self.config, out)))  # [B, T, C]
        loss = None if labels is None else mean_loss(objective(logits, labels))
        return TaskOutput(logits, loss, out.hidden_states, out.attentions)


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
                   label2id: Mapping[str, int] | None = None, report: DataReport | None = None) -> list[Feature]:
    """Tokenise sentences, align word labels to sub-tokens and window long sentences.

    Args:
        examples: the sentences.
        tokenizer: the model's tokenizer.
        settings: window length, doc stride, `tag_scheme` of the labels and `label_policy`.
        label2id: tag -> id (in the tag scheme); None for unlabeled prediction.
        report: gets `features`, `windowed_inputs`, `words_without_tokens` (e.g. a word that is only a
            control character: predicted "O").

    Returns:
        Features with `token_labels` (when labelled) and `word_index` (which word each token predicts).
    """
    if settings.label_policy not in LABEL_POLICIES:
        raise ConfigError(f"label_policy={settings.label_policy!r}; use one of {LABEL_POLICIES}")
    report = report if report is not None else DataReport()
    post = tokenizer.post_processor
    room = settings.max_seq_length - post.added(False)
    features: list[Feature] = []
    for index, example in enumerate(examples):
        ids, owners = token_words(example, tokenizer)
        first_piece = [i == 0 or owners[i] != owners[i - 1] for i in range(len(ids))]
        covered = len(set(owners))
        if covered < len(example.words):
            report.note("words_without_tokens", example.source, amount=len(example.words) - covered)
        token_labels = None
        if label2id is not None and example.tags is not None:
            tags = bio_to_iobes(example.tags) if settings.tag_scheme == "IOBES" else example.tags
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
            labels = None if token_labels is None else [IGNORE_INDEX, *token_labels[start:end], IGNORE_INDEX]
            features.append(Feature(index, input_ids, types, token_labels=labels, word_index=word_index,
                                    window=window))
    report.note("features", amount=len(features))
    return features


def readable_tags(names: Sequence[str]) -> tuple[list[str], bool]:
    """(tags to decode with, whether they are IOBES): prefix-less labels ("PER") are the IO scheme, read as
    I- tags, which start an entity after O or a type change."""
    tags = [n if n == "O" or (len(n) > 2 and n[1] == "-" and n[0] in "BIES") else f"I-{n}" for n in names]
    return tags, any(t[:2] in ("E-", "S-") for t in tags)


class Tagging(Family):
    """Named entities (or any word labels) with character offsets."""

    name = "tagging"
    aliases = ("ner", "tag", "token_classification", "conll", "sequence_labeling")
    model_class = BertForTokenClassification
    task = "tag"
    options: dict[str, Any] = {}
    export_outputs = {"logits": {0: "batch", 1: "sequence"}}
    probe_inputs = ["George Washington went to Washington in 1789.", "Angela works for Siemens in Munich.",
                    "The Nile flows through Egypt and Sudan."]

    default_metrics = ("f1", "precision", "recall")

    def check_model(self, config: BertConfig) -> None:
        if not config.id2label:
            raise CheckpointError("the model's config.json has no id2label (tag names such as \"B-PER\"); add them")

    def read(self, path, *, part, options, report, labelled=True):
        examples = read_tagged(path, token_column=options["token_column"],
                               tag_column=options["tag_column"] if labelled else None, separator=options["separator"],
                               bio_errors=options["bio_errors"], on_invalid=options["on_invalid"], report=report)
        if part is not None:
            # A task without a dev file: every DEV_EVERY-th sentence is held out, deterministically.
            held = part == "eval"
            examples = [e for i, e in enumerate(examples) if (i % DEV_EVERY == DEV_EVERY - 1) == held]
        return examples

    def label_names(self, examples, given, settings, regression=False):
        return list(given or tag_list(examples, settings.tag_scheme))

    def check_labels(self, examples, label_names, settings):
        check_tag_labels(examples, {name: i for i, name in enumerate(label_names)}, settings.tag_scheme)

    def head_config(self, label_names, regression=False):
        return {"id2label": dict(enumerate(label_names)), "label2id": None, "problem_type": None}

    def labelled(self, examples):
        return all(e.tags is not None for e in examples)

    def counts(self, batch) -> dict[str, torch.Tensor]:
        """Labelled tokens in the batch."""
        return {"cross_entropy": (batch.labels != IGNORE_INDEX).sum().float()}

    def loss_terms(self, output: TaskOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return objective(output.logits, batch.labels)

    def metrics(self, output: TaskOutput, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        real = batch.labels != IGNORE_INDEX
        correct = ((output.logits.detach().argmax(-1) == batch.labels) & real).sum().float()
        return {"token_accuracy": (correct, real.sum().float())}

    def objective_for(self, config: BertConfig) -> Tagging:
        return self

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

    def features(self, examples, tokenizer, settings, *, config, report=None, training=False):
        for example in examples:
            if example.original is not None and not example.words:
                # Raw text: the tokenizer's own word split, with spans into the text the user sent.
                pieces = tokenizer.pre_tokenize(example.original)
                example.words = [example.original[start:end] for _, start, end in pieces]
                example.spans = [(start, end) for _, start, end in pieces]
        label2id = config.label2id if any(e.tags is not None for e in examples) else None
        return build_features(examples, tokenizer, settings, label2id=label2id, report=report)

    def forward(self, model, batch):
        logits = model(**batch.model_inputs()).logits.float().cpu()  # [B, T, C]
        lengths = batch.attention_mask.sum(-1).tolist()
        return [logits[row, :int(n)] for row, n in enumerate(lengths)]

    def decode(self, examples, features, outputs, options, config, tokenizer=None):
        tags_of, iobes = readable_tags(config.label_names)
        # Per word: the label probabilities of the token that predicts it (one token per word overall).
        words: list[dict[int, np.ndarray]] = [{} for _ in examples]
        for feature, logits in zip(features, outputs):
            probs = softmax(np.asarray(logits, dtype=np.float64))  # [T, C]
            for position, word in enumerate(feature.word_index):
                if word is not None:
                    words[feature.example_index][word] = probs[position]
        results = []
        for example, predicted in zip(examples, words):
            best = [int(predicted[w].argmax()) if w in predicted else None for w in range(len(example.words))]
            confidence = [float(predicted[w].max()) if w in predicted else 1.0 for w in range(len(example.words))]
            tags = [tags_of[b] if b is not None else "O" for b in best]
            if iobes:
                tags = iobes_to_bio(tags)
            spans = example.word_spans()
            text = example.text
            entities = []
            for entity in get_entities(tags, "BIO"):
                begin, end = spans[entity.start][0], spans[entity.end][1]
                score = float(np.mean(confidence[entity.start:entity.end + 1]))
                entities.append({"type": entity.type, "start": begin, "end": end, "text": text[begin:end],
                                 "score": score})
            results.append({"entities": entities, "tags": tags})
        return results

    def record(self, example, result):
        record = {"text": example.text, "words": example.words, **result}
        if example.tags is not None:
            record["gold"] = example.tags
        return record

    def score(self, examples, results, config, *, metric_names=None, **_):
        scores = entity_scores([e.tags for e in examples], [r["tags"] for r in results], "BIO")
        metrics = {"f1": scores["f1"], "precision": scores["precision"], "recall": scores["recall"]}
        details = {"per_type": scores["per_type"], "support": scores["support"], "predicted": scores["predicted"]}
        warnings = []
        if scores["predicted"] == 0:
            warnings.append(f"no entity predicted in {len(examples)} sentences: the model tags everything "
                            "'O' (too few steps, or a learning rate too high or too low)")
        return metrics, details, warnings


FAMILY = Tagging()
