"""Late interaction (ColBERT): a small unit vector per token, scored by MaxSim.

Owns: MaxSim (`maxsim`, the one home of it: for each query token its best dot product over a document's
tokens, summed over the query's tokens), the models (`LateInteraction`: the encoder, a projection without bias
to `dimension` features and per-token L2 normalisation; saved in PyLate's layout, which sentence-transformers'
`MultiVectorEncoder` loads, or Stanford ColBERT's; `BertForColBERT` on BERT's encoder, `ModernBertForColBERT`
on ModernBERT's, as GTE-ModernColBERT), how texts become ColBERT rows (`colbert_rows`: the marker
after [CLS], queries filled with [MASK] to their fixed length, documents cut to theirs) and which of a row's
vectors count (every query position; a document's real tokens but the skiplist's), and the family
(`ColBERT`: the `embed-multi-vector` route, whose `role` option says whether the texts are queries or
documents, its features, forward and decoding into ``{"embeddings": [[...], ...]}``, dev retrieval scoring) and
its training (`ColBERTTraining`: `colbert-pairs` / `colbert-triplets`, in-batch negatives by MaxSim, and
`colbert-distill`, KL distillation of a teacher's scores as PyLate's `Distillation` loss (`distillation_loss`);
`ColbertObjective` picks by the batch).

The rows are built in `forward`, from the plain [CLS] text [SEP] windows every family gets and the model's own
settings (`LateInteraction.colbert`), so that every path (predict, the server, evaluation, the embed job) runs
a model as its directory says. Token ids (markers, [MASK], the skiplist) come from the tokenizer the model was
loaded with (`use_tokenizer`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertforge import checkpoint_format
from bertforge.data.embedding import TextGroup
from bertforge.data.finetuning import FinetuneBatch
from bertforge.data.reranking import read_rerank_lists
from bertforge.errors import CheckpointError, ConfigError, InputError
from bertforge.families.base import Family, LossSettings, Objective
from bertforge.families.embedding import Embedding, EmbeddingTraining
from bertforge.interop import colbert as colbert_files
from bertforge.interop.colbert import ColbertSettings
from bertforge.metrics.embedding import rank_documents, retrieval_scores
from bertforge.model.bert import BertModel, BertPretrainedModel
from bertforge.model.config import BertConfig
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.modernbert import ModernBertModel, ModernBertPretrainedModel

ROLES = ("query", "document")
FORMAT_COLUMNS: dict[str, dict[str, Any]] = {
    "colbert-pairs": {"text_a_column": "anchor", "text_b_column": "positive"},
    "colbert-triplets": {"text_a_column": "anchor", "text_b_column": "positive", "negative_column": "negative"},
    # JSON Lines of {"query": ..., "documents": [...], "scores": [...]}: a teacher's score of each document
    # (KL distillation; `bertforge score-margins --output-format lists` writes them with a cross-encoder).
    "colbert-distill": {"text_a_column": "query", "text_b_column": "documents", "label_column": "scores"},
}
RANKING_METRICS = ("ndcg@10", "mrr@10", "accuracy@1", "recall@10")
DEFAULT_DIMENSION = 128
LAYOUTS = ("pylate", "stanford")


def maxsim(queries: torch.Tensor, query_mask: torch.Tensor | None, tokens: torch.Tensor,
           token_documents: torch.Tensor, documents: int) -> torch.Tensor:
    """MaxSim scores [B, N] of B queries against N documents whose token vectors lie flat.

    Args:
        queries: [B, q, D] query token vectors (rows of one length; `query_mask` says which count).
        query_mask: [B, q] bool, True where a query position counts (None: all).
        tokens: [M, D] every document's token vectors, one document after another.
        token_documents: long [M], the document (0..N-1) each token belongs to.
        documents: N.

    A query token's best match in a document is the largest dot product with its tokens (with unit vectors,
    the cosine); a document without tokens scores 0. Computed in the dtype of the vectors (float32 sums).
    """
    batch, length, width = queries.shape
    similarity = queries.reshape(batch * length, width) @ tokens.T  # [B*q, M]
    best = similarity.new_full((batch * length, documents), float("-inf"))
    best = best.scatter_reduce(1, token_documents[None, :].expand_as(similarity), similarity, "amax")  # [B*q, N]
    best = best.masked_fill(best == float("-inf"), 0.0).float().view(batch, length, documents)
    if query_mask is not None:
        best = best * query_mask[:, :, None].to(best.dtype)
    return best.sum(1)  # [B, N]


def maxsim_pairs(query: torch.Tensor, documents: Sequence[torch.Tensor]) -> torch.Tensor:
    """MaxSim [N] of one query [q, D] against documents given as [t_i, D] each."""
    if not documents:
        return torch.zeros(0)
    tokens = torch.cat(list(documents))
    owner = torch.repeat_interleave(torch.arange(len(documents)), torch.tensor([len(d) for d in documents]))
    return maxsim(query[None], None, tokens.to(query.dtype), owner, len(documents))[0]


@dataclass(frozen=True)
class ColbertTokens:
    """The token ids a ColBERT model's rows need, from its tokenizer: markers, [MASK], the skiplist's."""

    query_marker: int
    document_marker: int
    mask: int
    skiplist: tuple[int, ...]

    @classmethod
    def resolve(cls, settings: ColbertSettings, tokenizer: Any) -> ColbertTokens:
        vocab = tokenizer.vocab

        def required(token: str, what: str) -> int:
            # As written first (PyLate's "[Q] " is an added token of its tokenizer.json, space and all), then
            # without its spaces (a WordPiece vocabulary's "[unused0]").
            for spelling in (token, token.strip()):
                if spelling in vocab:
                    return vocab[spelling]
            raise CheckpointError(f"the ColBERT {what} {token!r} is not in the vocabulary; choose a token it "
                                  "holds (BERT vocabularies have [unused0], [unused1] ...)")

        skip = tuple(sorted({vocab[w] for w in settings.skiplist if w in vocab}))
        return cls(required(settings.query_marker, "query marker"), required(settings.document_marker,
                   "document marker"), required(tokenizer.config.mask_token, "mask token"), skip)


def colbert_rows(windows: Sequence[Sequence[int]], role: str, settings: ColbertSettings,
                 tokens: ColbertTokens) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input_ids [N, T], encoder mask [N, T], scored [N, T] bool) of windows "[CLS] text [SEP]".

    Each row is [CLS] marker text [SEP], cut to the role's length; a query is then filled with [MASK] to
    `query_length` when the model expands queries (attended to as `attend_to_expansion` says). Every query
    position is scored; a document's tokens are, but padding and the skiplist's."""
    length = settings.query_length if role == "query" else settings.document_length
    marker = tokens.query_marker if role == "query" else tokens.document_marker
    rows = [[w[0], marker, *w[1:-1][:length - 3], w[-1]] for w in windows]
    expand = role == "query" and settings.expand_query
    width = length if expand else max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokens.mask if expand else 0, dtype=torch.long)
    real = torch.zeros((len(rows), width), dtype=torch.bool)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.tensor(row)
        real[i, :len(row)] = True
    if expand:
        attend = torch.ones_like(real) if settings.attend_to_expansion else real
        return ids, attend.long(), torch.ones_like(real)
    scored = real.clone()
    if role == "document" and tokens.skiplist:
        scored &= ~torch.isin(ids, torch.tensor(tokens.skiplist))
    return ids, real.long(), scored


class LateInteraction:
    """A ColBERT model: an encoder (`bert`), a projection without bias to `dimension` features, unit vectors per
    token. `BertForColBERT` and `ModernBertForColBERT` are this with their encoder.

    `token_vectors` gives every position's vector [N, T, dimension]; `colbert` holds the settings (markers,
    lengths, expansion, skiplist) and `tokens` their ids (`use_tokenizer`). It saves in PyLate's layout (the
    encoder's weights, the projection under `1_Dense`, the settings in config_sentence_transformers.json),
    or with `layout = "stanford"` (a BERT encoder's only) in Stanford ColBERT's (architecture HF_ColBERT,
    `artifact.metadata`).
    """

    encoder_prefix = "bert."
    head_prefixes = ("projection.",)
    stanford_layout = True  # Stanford ColBERT's `HF_ColBERT` holds a BERT encoder

    def start_colbert(self, dimension: int) -> None:
        """The projection and the default settings (the subclass has built its encoder `bert`)."""
        self.projection = nn.Linear(self.config.hidden_size, dimension, bias=False)
        self.colbert = ColbertSettings()
        self.tokens: ColbertTokens | None = None
        self.layout = "pylate"

    @property
    def dimension(self) -> int:
        return self.projection.out_features

    def use_tokenizer(self, tokenizer: Any) -> LateInteraction:
        """Resolve the settings' tokens with `tokenizer` (the one the model's texts are tokenized with)."""
        self.tokens = ColbertTokens.resolve(self.colbert, tokenizer)
        return self

    def adopt_directory(self, folder: Path, stored: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Before its weights load: the directory's settings and tokens, the projection's width from the stored
        one (PyLate and sentence-transformers keep it in their Dense module: added to `stored`)."""
        if colbert_files.is_colbert_directory(folder):
            self.colbert = colbert_files.read_colbert_settings(folder)
            name = colbert_files.DENSE_WEIGHT
            if name not in stored:
                projection = colbert_files.read_projection(folder)
                stored = stored if projection is None else {**stored, name: projection}
            if name in stored and stored[name].shape[0] != self.dimension:
                self.projection = nn.Linear(self.config.hidden_size, stored[name].shape[0], bias=False)
        tokenizer = checkpoint_format.read_tokenizer(folder, None, self.config.vocab_size)
        if tokenizer is not None:
            self.use_tokenizer(tokenizer)
        return stored

    def directory_files(self) -> dict[str, str | bytes]:
        if self.layout == "stanford":
            if not self.stanford_layout:
                raise CheckpointError(f"Stanford ColBERT's layout holds a BERT encoder; save this "
                                      f"{type(self).__name__} in PyLate's layout")
            return {colbert_files.STANFORD_METADATA: colbert_files.stanford_metadata(self.colbert, self.dimension)}
        return colbert_files.colbert_files(self.colbert, self.projection.weight)

    def config_fields(self) -> dict[str, Any]:
        """What config.json says beyond the encoder's config: Stanford's architecture in its layout."""
        return {"architectures": [colbert_files.STANFORD_ARCHITECTURE]} if self.layout == "stanford" else {}

    def token_vectors(self, input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                      attention_mask: torch.Tensor, compute_masked: bool = False) -> torch.Tensor:
        """Unit vectors [N, T, dimension] of rows [N, T]; with `compute_masked` also of the positions the mask
        hides from attention (ColBERT's non-attended query expansion), else those are padding."""
        extra = {"compute_masked": True} if compute_masked else {}
        hidden = self.bert(input_ids, token_type_ids, attention_mask, **extra).last_hidden_state
        return F.normalize(self.projection(hidden).float(), dim=-1)

    def encode_windows(self, windows: Sequence[Sequence[int]], role: str) -> tuple[torch.Tensor, torch.Tensor]:
        """(unit vectors [N, T, dimension], scored [N, T] bool) of windows "[CLS] text [SEP]" as `role` texts
        (`colbert_rows`), on the model's device."""
        if self.tokens is None:
            raise InputError("this ColBERT model has no tokenizer to resolve its marker tokens: load it from its "
                             "directory, or call model.use_tokenizer(tokenizer)")
        ids, attend, scored = colbert_rows(windows, role, self.colbert, self.tokens)
        device = self.projection.weight.device
        hidden_scored = bool((scored & ~attend.bool()).any())  # non-attended query expansion
        return self.token_vectors(ids.to(device), None, attend.to(device), hidden_scored), scored.to(device)

    def forward(self, input_ids, token_type_ids=None, attention_mask=None, **kwargs: Any):
        """Rows [N, T]: their unit vectors [N, T, dimension]. Texts grouped per example [B, C, T] (training:
        "[CLS] text [SEP]" windows, the query first, then its documents): `GroupVectors`."""
        mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
        if input_ids.dim() == 2:
            return self.token_vectors(input_ids, token_type_ids, mask)
        count, tokens = input_ids.shape[1:]
        windows = [row[:n].tolist() for row, n in zip(input_ids.reshape(-1, tokens), mask.reshape(-1, tokens).sum(1))]
        queries = self.encode_windows(windows[::count], "query")
        documents = self.encode_windows([w for i, w in enumerate(windows) if i % count], "document")
        return GroupVectors(*queries, *documents)


class BertForColBERT(LateInteraction, BertPretrainedModel):
    """BERT's encoder (no pooler) as a ColBERT model (`LateInteraction`)."""

    def __init__(self, config: BertConfig, dimension: int = DEFAULT_DIMENSION):
        super().__init__(config)
        self.bert = BertModel(config, add_pooling_layer=False)
        self.start_colbert(dimension)
        self.init_weights()


class ModernBertForColBERT(LateInteraction, ModernBertPretrainedModel):
    """ModernBERT's encoder as a ColBERT model (`LateInteraction`): what GTE-ModernColBERT and PyLate's other
    ModernBERT models are; saved in PyLate's layout around a Hugging Face `ModernBertModel` directory. The
    projection starts as PyLate's Dense does (torch's default for a linear layer)."""

    stanford_layout = False

    def __init__(self, config: ModernBertConfig, dimension: int = DEFAULT_DIMENSION):
        super().__init__(config)
        self.bert = ModernBertModel(config)
        self.start_colbert(dimension)
        self.init_weights()


@dataclass(frozen=True)
class GroupVectors:
    """A training batch's vectors: queries [B, q, D] (`query_scored` [B, q]) and their documents, example-major
    ([B x (C - 1), t, D], `document_scored`: example b's are rows b(C-1) ... b(C-1) + C-2, its positive first)."""

    queries: torch.Tensor
    query_scored: torch.Tensor
    documents: torch.Tensor
    document_scored: torch.Tensor

    def scores(self) -> torch.Tensor:
        """MaxSim [B, B x (C - 1)] of every query with every document of the batch."""
        tokens = self.documents[self.document_scored]  # [M, D], the scored vectors in document order
        owner = torch.nonzero(self.document_scored)[:, 0]  # [M]
        return maxsim(self.queries, self.query_scored, tokens, owner, self.documents.shape[0])

    def own_scores(self) -> torch.Tensor:
        """MaxSim [B, C - 1] of each query with its own documents only (distillation's lists)."""
        batch, length = self.queries.shape[:2]
        documents = self.documents.view(batch, -1, *self.documents.shape[1:])  # [B, C-1, t, D]
        similarity = torch.einsum("bqd,bctd->bcqt", self.queries, documents)  # [B, C-1, q, t]
        scored = self.document_scored.view(batch, -1, 1, self.documents.shape[1])  # [B, C-1, 1, t]
        best = similarity.masked_fill(~scored, float("-inf")).amax(-1)  # [B, C-1, q]
        best = best.masked_fill(best == float("-inf"), 0.0).float()  # a document without scored tokens: 0
        return (best * self.query_scored[:, None, :].to(best.dtype)).sum(-1)


def distillation_loss(student: torch.Tensor, teacher: torch.Tensor, normalize: bool = True
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed KL divergence, correct count) of a teacher's scores over each query's documents, as PyLate's
    `Distillation` loss defines it: KL(softmax(teacher) || softmax(student)) per query, where the student's
    scores are its MaxSim scores, min-max normalised per query to [0, 1] (`normalize`, PyLate's default
    `normalize_scores=True`: (s - min) / (max - min + 1e-8)), and the teacher's are taken as they are (logits;
    no temperature on either side). Summed over queries, so the loop's mean is PyLate's "batchmean".

    student, teacher: [B, N] (a query's documents; NaN teacher scores mark a shorter list's padding, left out
    of both softmaxes). Correct: the student's best document is the teacher's.
    """
    valid = ~torch.isnan(teacher)
    student = student.float()
    if normalize:
        low = student.masked_fill(~valid, float("inf")).amin(-1, keepdim=True)
        high = student.masked_fill(~valid, float("-inf")).amax(-1, keepdim=True)
        student = (student - low) / (high - low + 1e-8)
    student = student.masked_fill(~valid, float("-inf"))
    teacher = teacher.to(student.dtype).masked_fill(~valid, float("-inf"))
    log_student, log_teacher = torch.log_softmax(student, -1), torch.log_softmax(teacher, -1)
    terms = torch.where(valid, log_teacher.exp() * (log_teacher - log_student), torch.zeros_like(student))
    return terms.sum(), (student.argmax(-1) == teacher.argmax(-1)).float().sum()


class ColbertObjective(Objective):
    """ColBERT's two losses, chosen by the batch. Without teacher scores, in-batch negatives: each query's
    positive among every document of the batch (every example's positive and hard negatives), by cross-entropy
    over the MaxSim scores (as PyLate's contrastive loss: scores at temperature 1); `accuracy`: the queries whose
    positive scored highest. Under DDP each rank's queries rank its own batch's documents. With a teacher's score
    per document (labels [B, C - 1], `colbert-distill`): KL distillation over each query's own documents
    (`distillation_loss`, PyLate's `Distillation`); `accuracy`: the queries whose best document by MaxSim is
    the teacher's."""

    def counts(self, batch) -> dict[str, torch.Tensor]:
        return {"contrastive": torch.tensor(float(batch.input_ids.shape[0]))}

    @staticmethod
    def distilled(batch) -> bool:
        labels = getattr(batch, "labels", None)
        return labels is not None and labels.dim() == 2

    def ranked(self, output: GroupVectors, batch) -> tuple[torch.Tensor, torch.Tensor]:
        scores = output.scores()  # [B, B(C-1)]
        candidates = batch.input_ids.shape[1] - 1
        return scores, torch.arange(scores.shape[0], device=scores.device) * candidates

    def loss_terms(self, output, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        count = self.counts(batch)["contrastive"]
        if self.distilled(batch):
            loss, _ = distillation_loss(output.own_scores(), batch.labels)
            return {"contrastive": (loss, count.to(loss.device))}
        scores, targets = self.ranked(output, batch)
        loss = F.cross_entropy(scores.float(), targets, reduction="sum")
        return {"contrastive": (loss, count.to(scores.device))}

    def metrics(self, output, batch) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        if self.distilled(batch):
            with torch.no_grad():
                _, correct = distillation_loss(output.own_scores(), batch.labels)
            return {"accuracy": (correct, torch.tensor(float(batch.labels.shape[0]), device=correct.device))}
        scores, targets = self.ranked(output, batch)
        correct = (scores.argmax(-1) == targets).sum().float()
        return {"accuracy": (correct, torch.tensor(float(scores.shape[0]), device=scores.device))}


class ColBERTTraining(EmbeddingTraining):
    """What fine-tuning asks of ColBERT: pairs or triplets (`colbert-pairs`, `colbert-triplets`) or lists with
    a teacher's scores (`colbert-distill`), the model (`BertForColBERT`, its settings and tokenizer from the
    directory it starts from) and in-batch negatives by MaxSim or KL distillation (`ColbertObjective`)."""

    settings = frozenset({"data.negative_column"})

    def format_reader(self, format_name: str) -> dict[str, Any]:
        return dict(FORMAT_COLUMNS[format_name])

    @property
    def trained_class(self) -> type[BertForColBERT]:
        return BertForColBERT

    def objective_for(self, config: BertConfig, loss: LossSettings | None = None) -> ColbertObjective:
        if loss is not None and (loss.class_weights is not None or loss.focal_gamma or loss.contrastive is not None):
            raise ConfigError("ColBERT trains with in-batch negatives by MaxSim; remove head.loss, head.class_weights "
                              "and head.focal_gamma")
        return ColbertObjective()

    def prepare_model(self, model: torch.nn.Module, task: Any, loss: LossSettings | None) -> None:
        if model.tokens is None:
            raise ConfigError("the ColBERT model to train has no tokenizer beside it to resolve its marker tokens; "
                              "start from a model directory with its vocabulary")
        if task.reader.label_column is not None and task.reader.negative_column is not None:
            raise ConfigError(f"{task.name}: ColBERT trains on pairs or triplets (in-batch negatives) or on lists "
                              "with a teacher's scores (--format colbert-distill), not on scored triplets; remove "
                              "--label (data.label_column) or use --format colbert-distill")


@dataclass(frozen=True)
class TokenVectors:
    """One text's ColBERT vectors [t, D] (float32) and the position in its row of each."""

    vectors: torch.Tensor
    positions: list[int]


def relevant_position(example: TextGroup) -> int:
    """Which text of a group is the query's relevant one: the positive (texts[1]), or in a distillation list
    (a teacher score per document) the document the teacher scored highest."""
    if isinstance(example.score, tuple):
        return 1 + max(range(len(example.score)), key=lambda i: example.score[i])
    return 1


class ColBERT(Embedding):
    """Late interaction: a unit vector per token (ColBERT), scored by MaxSim.

    Option `role`: "document" (the default: [D] marker, cut to the model's document length, punctuation's
    vectors dropped) or "query" ([Q] marker, filled with [MASK] to the model's query length, every position
    kept). The embedding family's reading of pairs and triplets and its windows ([CLS] text [SEP], one per
    text) are shared; `forward` makes them ColBERT rows with the model's settings.
    """

    name = "colbert"
    aliases = ("late_interaction", "multi_vector", "embed-multi-vector")
    model_class = BertForColBERT
    task = "embed-multi-vector"
    default_max_seq_length = 512
    long_inputs = True
    options = {"role": "document"}
    training_hooks = ColBERTTraining
    formats = dict.fromkeys(FORMAT_COLUMNS)
    export_outputs = {"token_vectors": {0: "batch", 1: "sequence"}}
    runs_as_graph = False  # rows are rebuilt from the model's settings in `forward`
    example_inputs = ["What is the capital of France?", "Paris is the capital and largest city of France."]

    def validate_options(self, options: dict[str, Any]) -> None:
        if options["role"] not in ROLES:
            raise InputError(f"role must be one of {ROLES}, got {options['role']!r}")

    def read(self, path, *, part, task, report, labelled=True) -> list[TextGroup]:
        """Pairs and triplets as the embedding family reads them; with a score column (`colbert-distill`), JSON
        Lines of a query, its documents and a teacher's score per document (`data.reranking`'s reader of
        lists, any finite scores), each list one group (query, documents...) scored per document."""
        reader = task.reader
        if reader.label_column is None or reader.negative_column is not None:
            return super().read(path, part=part, task=task, report=report, labelled=labelled)
        lists = read_rerank_lists(path, query_column=reader.text_a_column, docs_column=reader.text_b_column,
                                  labels_column=reader.label_column, file_format=reader.file_format,
                                  on_invalid=reader.on_invalid, report=report, relevant_required=False)
        return [TextGroup((item.query, *item.texts), item.labels if labelled else None, item.source, item.id)
                for item in lists]

    def check_options(self, options: Mapping[str, Any], config: BertConfig | None = None) -> dict[str, Any]:
        return Family.check_options(self, options, config)

    def directory_options(self, sentence: Any) -> dict[str, Any]:
        return {}

    def metric_defaults(self, kind: str | None, reader: Any = None) -> tuple[str, ...]:
        return RANKING_METRICS

    def metric_names(self, task, dev_examples=None) -> tuple[str, ...]:
        return RANKING_METRICS

    def forward(self, model: torch.nn.Module, batch: FinetuneBatch,
                options: Mapping[str, Any] | None = None) -> list[Any]:
        """One `TokenVectors` per row (a list of them per group of texts: query first, then documents)."""
        options = self.options if options is None else options
        if not callable(getattr(model, "encode_windows", None)):  # a BertForColBERT, or an engine running one
            raise InputError(f"ColBERT vectors need a ColBERT model; this is a {type(model).__name__}")
        ids, mask = batch.input_ids, batch.attention_mask
        grouped = ids.dim() == 3
        if grouped:  # [B, C, T] -> [B*C, T]; the first text of a group is the query
            ids, mask = ids.reshape(-1, ids.shape[-1]), mask.reshape(-1, mask.shape[-1])
        windows = [row[:n].tolist() for row, n in zip(ids, mask.sum(1).tolist())]
        count = batch.input_ids.shape[1] if grouped else 1
        roles = [("query" if i % count == 0 else "document") if grouped else options["role"]
                 for i in range(len(windows))]
        outputs: list[TokenVectors | None] = [None] * len(windows)
        for role in ROLES:
            chosen = [i for i, r in enumerate(roles) if r == role]
            if not chosen:
                continue
            vectors, scored = model.encode_windows([windows[i] for i in chosen], role)
            for i, row, keep in zip(chosen, vectors.float().cpu(), scored.cpu()):
                positions = torch.nonzero(keep).flatten()
                outputs[i] = TokenVectors(row[positions], positions.tolist())
        if grouped:
            return [outputs[i:i + count] for i in range(0, len(outputs), count)]
        return outputs

    def decode(self, examples, features, outputs, options, config, tokenizer=None) -> list[dict[str, Any]]:
        """``{"embeddings": [[...], ...]}`` per text (one unit vector per scored token); a group's result holds
        its texts' vectors (`vectors`) and the query's MaxSim with each other text (`maxsim`)."""
        results = []
        for example, output in zip(examples, outputs):
            if isinstance(example, TextGroup):
                query, *documents = [o.vectors for o in output]
                results.append({"maxsim": maxsim_pairs(query, documents).tolist(), "vectors": output})
            else:
                results.append({"embeddings": output.vectors.tolist()})
        return results

    def record(self, example: TextGroup, result: dict[str, Any]) -> dict[str, Any]:
        return {"id": example.id, "texts": list(example.texts), "maxsim": result["maxsim"]}

    def score(self, examples, results, config, **settings):
        """Every dev anchor retrieves among all dev positives by MaxSim (its own is the one relevant text: the
        positive, or in a distillation list the document its teacher scored highest; equal texts are one
        document): nDCG@10, MRR@10, accuracy@1, recall@10."""
        positives = [relevant_position(e) for e in examples]  # each example's relevant text
        documents: dict[str, int] = {}
        for index, (example, position) in enumerate(zip(examples, positives)):
            documents.setdefault(example.texts[position], index)
        corpus = [results[i]["vectors"][positives[i]].vectors for i in documents.values()]
        scores = np.stack([maxsim_pairs(r["vectors"][0].vectors, corpus).numpy() for r in results])
        query_ids = [f"q{i}" for i in range(len(examples))]
        qrels = {q: {f"d{documents[e.texts[p]]}": 1.0} for q, e, p in zip(query_ids, examples, positives)}
        ranked = rank_documents(scores, query_ids, [f"d{i}" for i in documents.values()], 10)
        figures = retrieval_scores(ranked, qrels, k_values=(1, 10), mrr_at=(10,), ndcg_at=(10,), map_at=(10,))
        return {name: figures[name] for name in RANKING_METRICS}, {}, []


FAMILY = ColBERT()
