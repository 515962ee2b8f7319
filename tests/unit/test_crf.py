"""The tagger's linear-chain CRF: scheme constraints, the forward algorithm, Viterbi and marginals against
brute force over every tag sequence, gradients, the tagging objective with a CRF or loss settings, CRF
decoding, and saving/loading a CRF tagger (here and in Hugging Face's class)."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch

from bertforge.constants import IGNORE_INDEX
from bertforge.data.finetuning import FinetuneBatch
from bertforge.data.tagging import TaggingExample
from bertforge.errors import ConfigError
from bertforge.families import registry, tagging
from bertforge.families.base import InputSettings, LossSettings, symmetric_kl
from bertforge.families.crf import (
    DISALLOWED,
    CrfScores,
    LinearChainCRF,
    as_numpy,
    constraints,
    labelled_sequences,
    log_likelihood,
    log_partition,
    marginals,
    trim_cut_entities,
    viterbi,
)
from bertforge.families.tagging import (
    FAMILY as TAGGING,
)
from bertforge.families.tagging import (
    BertForTokenClassification,
    TagEmissions,
)
from bertforge.metrics.tagging import check_tags
from bertforge.model.config import BertConfig
from bertforge.tokenization import Tokenizer, TokenizerConfig, Vocab

BIO = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
IOBES = ["O", "B-PER", "I-PER", "E-PER", "S-PER", "B-LOC", "I-LOC", "E-LOC", "S-LOC"]
WORDS = "the cat sat on a mat john lives in paris new york".split()


def tiny(labels=BIO, **overrides) -> BertConfig:
    fields = {"vocab_size": 50, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
              "intermediate_size": 20, "max_position_embeddings": 32, "hidden_dropout_prob": 0.0,
              "attention_probs_dropout_prob": 0.0, "id2label": dict(enumerate(labels))}
    return BertConfig(**{**fields, **overrides})


def random_crf(labels, seed: int) -> LinearChainCRF:
    crf = LinearChainCRF(labels)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in crf.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator))
    return crf


def brute_force(emissions: np.ndarray, scores: CrfScores) -> dict[tuple[int, ...], float]:
    """The score of every tag sequence of one sequence: emissions [L, C]."""
    transitions, start, end = scores
    length, classes = emissions.shape
    result = {}
    for path in itertools.product(range(classes), repeat=length):
        score = start[path[0]] + end[path[-1]] + sum(emissions[t, c] for t, c in enumerate(path))
        score += sum(transitions[a, b] for a, b in zip(path, path[1:]))
        result[path] = float(score)
    return result


def logsumexp(values) -> float:
    values = np.asarray(list(values))
    return float(values.max() + np.log(np.exp(values - values.max()).sum()))


@pytest.fixture(scope="module")
def tokenizer():
    return Tokenizer(Vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]), TokenizerConfig())


# --- constraints ----------------------------------------------------------------------------------------

def test_constraints_bio_inside_only_after_its_own_type():
    rules = constraints(BIO)
    index = {name: i for i, name in enumerate(BIO)}
    assert rules.scheme == "BIO"
    allowed = {(a, b) for a in BIO for b in BIO if rules.transitions[index[a], index[b]]}
    for before in BIO:
        assert (before, "O") in allowed and (before, "B-PER") in allowed
        assert ((before, "I-PER") in allowed) == (before in ("B-PER", "I-PER"))
    assert [name for name, ok in zip(BIO, rules.start) if not ok] == ["I-PER", "I-LOC"]
    assert rules.end.all()


def test_constraints_iobes_close_every_entity():
    rules = constraints(IOBES)
    index = {name: i for i, name in enumerate(IOBES)}

    def follows(before):
        return sorted(after for after in IOBES if rules.transitions[index[before], index[after]])

    assert rules.scheme == "IOBES"
    assert follows("B-PER") == follows("I-PER") == ["E-PER", "I-PER"]
    assert follows("O") == follows("E-PER") == follows("S-LOC") == ["B-LOC", "B-PER", "O", "S-LOC", "S-PER"]
    assert [name for name, ok in zip(IOBES, rules.start) if not ok] == ["I-PER", "E-PER", "I-LOC", "E-LOC"]
    assert [name for name, ok in zip(IOBES, rules.end) if not ok] == ["B-PER", "I-PER", "B-LOC", "I-LOC"]


def test_constraints_refuse_labels_without_a_scheme():
    with pytest.raises(ConfigError, match=r"head\.crf needs BIO or IOBES labels \(B-PER, I-PER, \.\.\.\); got "
                                          r"\['PER', 'LOC', 'O'\]; turn head\.crf off or convert the tags"):
        constraints(["PER", "LOC", "O"])
    with pytest.raises(ConfigError, match=r"head\.crf needs BIO or IOBES"):
        BertForTokenClassification(tiny(["O", "PER"], use_crf=True))


def test_constraints_refuse_an_entity_that_cannot_start():
    with pytest.raises(ConfigError, match=r"label I-MISC can never be predicted under BIO: its entity needs B-MISC"):
        constraints(["O", "B-PER", "I-PER", "I-MISC"])
    with pytest.raises(ConfigError, match=r"label B-PER can never be predicted under IOBES: its entity needs E-PER"):
        constraints(["O", "B-PER", "S-PER"])


# --- the CRF against brute force ------------------------------------------------------------------------

@pytest.mark.parametrize("labels", [["O", "B-X", "I-X"], BIO[:4], ["O", "B-X", "I-X", "E-X", "S-X"]],
                         ids=["bio3", "bio4", "iobes5"])
@pytest.mark.parametrize("length", [1, 2, 4])
def test_viterbi_equals_brute_force(labels, length):
    for seed in range(4):
        scores = as_numpy(random_crf(labels, seed).scores())
        emissions = np.random.default_rng(seed).normal(size=(length, len(labels))) * 2
        table = brute_force(emissions, scores)
        path, score = viterbi(emissions, scores)
        best = max(table, key=table.get)
        assert tuple(path) == best
        assert score == pytest.approx(table[best], abs=1e-9)


@pytest.mark.parametrize("labels", [BIO[:3], ["O", "B-X", "I-X", "E-X", "S-X"]], ids=["bio", "iobes"])
def test_log_partition_equals_brute_force_logsumexp(labels):
    """Batched with ragged lengths (torch, float32) and per sequence (numpy, float64)."""
    crf = random_crf(labels, 1)
    lengths = [3, 1, 4, 2]
    generator = torch.Generator().manual_seed(2)
    emissions = torch.randn(len(lengths), max(lengths), len(labels), generator=generator)  # [B, L, C]
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]  # [B, L]
    batched = log_partition(emissions, mask, crf.scores())
    scores = as_numpy(crf.scores())
    for row, length in enumerate(lengths):
        row_emissions = emissions[row, :length].double().numpy()
        # Disallowed paths score ~-1e4 and add nothing, so the sum over all paths is the sum over valid ones.
        expected = logsumexp(brute_force(row_emissions, scores).values())
        assert batched[row].item() == pytest.approx(expected, abs=1e-4)
        probs = marginals(row_emissions, scores)
        np.testing.assert_allclose(probs.sum(-1), 1.0, atol=1e-12)


def test_log_likelihood_and_marginals_equal_brute_force():
    labels = ["O", "B-X", "I-X", "B-Y", "I-Y"]
    crf = random_crf(labels, 3)
    scores = as_numpy(crf.scores())
    emissions = np.random.default_rng(4).normal(size=(3, len(labels)))
    table = brute_force(emissions, scores)
    log_z = logsumexp(table.values())
    gold = (1, 2, 0)
    value = log_likelihood(torch.tensor(emissions)[None], torch.tensor([gold]), torch.ones(1, 3, dtype=torch.bool),
                           crf.scores())
    assert value.item() == pytest.approx(table[gold] - log_z, abs=1e-4)
    expected = np.zeros((3, len(labels)))
    for path, score in table.items():
        for t, label in enumerate(path):
            expected[t, label] += np.exp(score - log_z)
    np.testing.assert_allclose(marginals(emissions, scores), expected, atol=1e-10)


def test_log_likelihood_ignores_masked_positions_and_empty_rows():
    crf = random_crf(BIO, 5)
    generator = torch.Generator().manual_seed(5)
    emissions = torch.randn(3, 4, len(BIO), generator=generator)
    tags = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0], [0, 0, 0, 0]])
    mask = torch.tensor([[True, True, True, False], [True, False, False, False], [False] * 4])
    values = log_likelihood(emissions, tags, mask, crf.scores())
    alone = log_likelihood(emissions[:1, :3], tags[:1, :3], mask[:1, :3], crf.scores())
    assert values[0].item() == pytest.approx(alone.item(), abs=1e-5)
    assert values[2].item() == 0.0
    assert (values[:2] < 0).all()


@pytest.mark.parametrize("labels", [BIO, IOBES], ids=["bio", "iobes"])
def test_constrained_viterbi_never_yields_an_invalid_sequence(labels):
    scheme = "IOBES" if "E-PER" in labels else "BIO"
    unconstrained_invalid = 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        emissions = rng.normal(size=(int(rng.integers(1, 9)), len(labels))) * 4
        path, _ = viterbi(emissions, as_numpy(random_crf(labels, seed).scores()))
        assert check_tags([labels[i] for i in path], scheme) == []
        unconstrained_invalid += bool(check_tags([labels[i] for i in emissions.argmax(-1)], scheme))
    assert unconstrained_invalid > 10  # the arg-max of the same scores is often ill-formed


def test_crf_gradients_flow_to_allowed_scores_and_emissions_only():
    crf = random_crf(BIO, 6)
    emissions = torch.randn(2, 3, len(BIO), requires_grad=True)
    tags = torch.tensor([[1, 2, 0], [0, 3, 4]])
    (-log_likelihood(emissions, tags, torch.ones(2, 3, dtype=torch.bool), crf.scores()).sum()).backward()
    assert emissions.grad.abs().sum() > 0
    allowed = crf.allowed_transitions
    assert crf.transitions.grad[allowed].abs().sum() > 0
    assert (crf.transitions.grad[~allowed] == 0).all() and (crf.start.grad[~crf.allowed_start] == 0).all()
    # Whatever the parameter under a disallowed entry holds, the entry stays impossible.
    with torch.no_grad():
        crf.transitions.fill_(100.0)
    assert (crf.scores().transitions[~allowed] == DISALLOWED).all()


# --- the model and its objective ------------------------------------------------------------------------

def batch(labels: torch.Tensor) -> FinetuneBatch:
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(5, 50, labels.shape, generator=generator)
    return FinetuneBatch(input_ids, torch.zeros_like(input_ids), torch.ones_like(input_ids),
                         torch.arange(labels.shape[0]), labels=labels)


LABELS = torch.tensor([[-100, 1, -100, 2, 0, -100], [-100, 3, 4, -100, -100, -100], [-100] * 6])


def test_crf_tagger_names_its_scores_as_head_parameters():
    model = BertForTokenClassification(tiny(use_crf=True))
    names = {name for name, _ in model.named_parameters() if not name.startswith("bert.")}
    assert names == {"classifier.weight", "classifier.bias", "crf.transitions", "crf.start", "crf.end"}
    assert all(name.startswith(BertForTokenClassification.head_prefixes) for name in names)
    assert set(model.state_dict()) - {n for n, _ in model.named_parameters()} == set()  # masks are not saved
    assert BertForTokenClassification(tiny()).crf is None


def test_labelled_sequences_moves_labelled_positions_to_the_front():
    logits = torch.arange(3 * 6, dtype=torch.float32).reshape(3, 6, 1)
    emissions, tags, mask = labelled_sequences(logits, LABELS)
    assert emissions[0].squeeze(-1).tolist() == [1.0, 3.0, 4.0] and emissions[1, :2].squeeze(-1).tolist() == [7.0, 8.0]
    assert (tags[0].tolist(), tags[1, :2].tolist()) == ([1, 2, 0], [3, 4])
    assert mask.tolist() == [[True] * 3, [True, True, False], [False] * 3]


def test_crf_objective_counts_rows_and_matches_the_model_loss():
    torch.manual_seed(0)
    model = BertForTokenClassification(tiny(use_crf=True)).eval()
    with torch.no_grad():
        for parameter in model.crf.parameters():
            parameter.normal_()
    task = TAGGING.training.objective_for(model.config)
    b = batch(LABELS)
    output = model(**b.model_inputs())
    terms, counts = task.loss_terms(output, b), task.counts(b)
    assert set(terms) == set(counts) == {"crf_nll"}
    assert counts["crf_nll"].item() == 2 == terms["crf_nll"][1].item()
    torch.testing.assert_close(terms["crf_nll"][0] / counts["crf_nll"], model(**b.model_inputs(), labels=LABELS).loss)
    # The sum is the rows' negative log-likelihoods of their labelled (compacted) sequences.
    emissions, tags, mask = labelled_sequences(output.logits, LABELS)
    expected = -log_likelihood(emissions[:2], tags[:2], mask[:2], model.crf.scores()).sum()
    torch.testing.assert_close(terms["crf_nll"][0], expected)


def test_crf_objective_of_a_batch_without_labels_is_zero_with_gradients():
    model = BertForTokenClassification(tiny(use_crf=True))
    b = batch(torch.full((2, 4), IGNORE_INDEX))
    total, count = TAGGING.training.objective_for(model.config).loss_terms(model(**b.model_inputs()), b)["crf_nll"]
    total.backward()
    assert total.item() == 0.0 and count.item() == 0.0
    assert model.crf.transitions.grad is not None


def test_tagging_objective_weighs_tokens_with_class_weights_and_focal_loss():
    torch.manual_seed(0)
    model = BertForTokenClassification(tiny()).eval()
    b = batch(LABELS)
    output = model(**b.model_inputs())
    weights = (1.0, 2.0, 3.0, 0.5, 1.0)
    weighted = TAGGING.training.objective_for(model.config, LossSettings(class_weights=weights))
    total, count = weighted.loss_terms(output, b)["cross_entropy"]
    keep = LABELS.flatten() != IGNORE_INDEX
    logits, gold = output.logits.flatten(0, 1)[keep], LABELS.flatten()[keep]
    per_token = torch.nn.functional.cross_entropy(logits, gold, reduction="none")
    torch.testing.assert_close(total, (per_token * torch.tensor(weights)[gold]).sum())
    assert count.item() == 5 == weighted.counts(b)["cross_entropy"].item()
    focal, _ = TAGGING.training.objective_for(model.config, LossSettings(focal_gamma=2.0)).loss_terms(output, b)["cross_entropy"]
    p_gold = torch.exp(-per_token)
    torch.testing.assert_close(focal, (per_token * (1 - p_gold) ** 2).sum())
    plain = TAGGING.training.objective_for(model.config, LossSettings())
    torch.testing.assert_close(plain.loss_terms(output, b)["cross_entropy"][0], per_token.sum())


def test_tagging_objective_refuses_loss_settings_with_the_crf():
    with pytest.raises(ConfigError, match=r"remove head\.class_weights / head\.focal_gamma or turn head\.crf off"):
        TAGGING.training.objective_for(tiny(use_crf=True), LossSettings(focal_gamma=2.0))
    with pytest.raises(ConfigError, match="class_weights has 2 values but the model has 5 labels"):
        TAGGING.training.objective_for(tiny(), LossSettings(class_weights=(1.0, 2.0)))


@pytest.mark.parametrize("use_crf", [False, True], ids=["softmax", "crf"])
def test_tagging_consistency_sums_kl_over_labelled_tokens_with_the_loss_count(use_crf):
    model = BertForTokenClassification(tiny(use_crf=use_crf, hidden_dropout_prob=0.3)).train()
    task = TAGGING.training.objective_for(model.config)
    b = batch(LABELS)
    torch.manual_seed(1)
    first = model(**b.model_inputs())
    second = model(**b.model_inputs())
    total, count = task.consistency(first, second, b)
    keep = LABELS.flatten() != IGNORE_INDEX
    expected = symmetric_kl(first.logits.flatten(0, 1)[keep], second.logits.flatten(0, 1)[keep])
    torch.testing.assert_close(total, expected)
    assert total.item() > 0
    assert count.item() == task.counts(b)[task.term].item() == (2 if use_crf else 5)


# --- features for a CRF tagger --------------------------------------------------------------------------

def test_crf_features_refuse_label_policy_all(tokenizer):
    example = TaggingExample(["john", "lives"], ["B-PER", "O"], " ", "f:1")
    with pytest.raises(ConfigError, match=r"features\.label_policy = \"all\".*use label_policy = \"first\" with "
                                          r"head\.crf"):
        TAGGING.features([example], tokenizer, InputSettings(label_policy="all"),
                         config=tiny(use_crf=True).with_labels(BIO))
    (feature,) = TAGGING.features([TaggingExample(["john"], None, " ", "f:1")], tokenizer,
                                  InputSettings(label_policy="all"), config=tiny(use_crf=True))
    assert feature.token_labels is None  # predicting needs no label policy


def test_crf_features_label_the_tags_as_scored(tokenizer):
    example = TaggingExample(["john", "lives", "in", "paris"], ["O", "I-PER", "O", "I-LOC"], " ", "f:1")
    label2id = {name: i for i, name in enumerate(BIO)}
    (plain,) = tagging.build_features([example], tokenizer, InputSettings(), label2id=label2id)
    (crf,) = tagging.build_features([example], tokenizer, InputSettings(), label2id=label2id, crf=True)
    assert [BIO[i] for i in plain.token_labels if i != IGNORE_INDEX] == ["O", "I-PER", "O", "I-LOC"]
    assert [BIO[i] for i in crf.token_labels if i != IGNORE_INDEX] == ["O", "B-PER", "O", "B-LOC"]


def test_trim_cut_entities_unlabels_an_entity_cut_by_the_window():
    prefixes = {i: name[0] for i, name in enumerate(IOBES)}
    ids = {name: i for i, name in enumerate(IOBES)}
    window = [ids[t] for t in ["I-PER", "E-PER", "O", "B-LOC", "I-LOC"]]
    trimmed = trim_cut_entities([IGNORE_INDEX, *window], prefixes, cut_before=True, cut_after=True)
    assert trimmed == [IGNORE_INDEX, IGNORE_INDEX, IGNORE_INDEX, ids["O"], IGNORE_INDEX, IGNORE_INDEX]
    assert trim_cut_entities(window, prefixes, cut_before=False, cut_after=False) == window
    bio = {i: name[0] for i, name in enumerate(BIO)}
    # BIO has no end tag: an entity may end a window.
    assert trim_cut_entities([2, 0, 1, 2], bio, cut_before=True, cut_after=True) == [IGNORE_INDEX, 0, 1, 2]


def test_crf_window_labels_start_and_end_where_the_scheme_allows(tokenizer):
    words = ["john", "lives", "in", "new", "york", "new", "york", "new", "york"]
    example = TaggingExample(words, ["O", "O", "O", "B-LOC", "I-LOC", "I-LOC", "I-LOC", "I-LOC", "O"], " ", "f:1")
    label2id = {name: i for i, name in enumerate(IOBES)}
    settings = InputSettings(max_seq_length=8, doc_stride=2, tag_scheme="IOBES")
    features = tagging.build_features([example], tokenizer, settings, label2id=label2id, crf=True)
    rules = constraints(IOBES)
    assert len(features) > 2
    for feature in features:
        kept = [i for i in feature.token_labels if i != IGNORE_INDEX]
        if kept:
            assert rules.start[kept[0]] and rules.end[kept[-1]]
            assert all(rules.transitions[a, b] for a, b in zip(kept, kept[1:]))


# --- decoding -------------------------------------------------------------------------------------------

def crf_outputs(features, logits_per_feature, scores: CrfScores) -> list[TagEmissions]:
    shared = as_numpy(scores)
    return [TagEmissions(torch.tensor(logits), shared) for logits in logits_per_feature]


def test_crf_decode_runs_viterbi_over_the_sentence_and_scores_by_marginals(tokenizer):
    config = tiny(use_crf=True)
    example = TaggingExample(["john", "lives", "in", "new", "york"], None, " ", "f:1")
    (feature,) = TAGGING.features([example], tokenizer, InputSettings(), config=config)
    logits = np.zeros((len(feature.input_ids), len(BIO)))
    # The arg-max would read "O I-PER O O I-LOC": stray inside tags.
    for position, word in enumerate(feature.word_index):
        if word is not None:
            logits[position, [0, 2, 0, 0, 4][word]] = 3.0
            logits[position, [0, 1, 0, 0, 3][word]] = 2.5
    scores = LinearChainCRF(BIO).scores()
    (plain,) = TAGGING.decode([example], [feature], [logits], {}, tiny())
    (result,) = TAGGING.decode([example], [feature], crf_outputs([feature], [logits], scores), {}, config)
    assert plain["tags"] == ["O", "I-PER", "O", "O", "I-LOC"]
    assert result["tags"] == ["O", "B-PER", "O", "O", "B-LOC"]
    emissions = np.stack([logits[feature.word_index.index(w)] for w in range(5)])
    probs = marginals(emissions, as_numpy(scores))
    assert [(e["text"], e["score"]) for e in result["entities"]] == [
        ("lives", pytest.approx(probs[1, 1])), ("york", pytest.approx(probs[4, 3]))]
    metrics, details, _ = TAGGING.score([TaggingExample(example.words, ["O"] * 5, " ", "f:1")] * 2,
                                        [plain, result], config)
    assert metrics["invalid_span_share"] == 0.5 and details["invalid_spans"] == 2


def test_crf_decode_iobes_keeps_the_model_tags_and_words_without_tokens_are_outside(tokenizer):
    config = tiny(IOBES, use_crf=True)
    example = TaggingExample(["new", "\u200b", "york"], None, " ", "f:1")
    (feature,) = TAGGING.features([example], tokenizer, InputSettings(), config=config)
    logits = np.zeros((len(feature.input_ids), len(IOBES)))
    # B-LOC scores best everywhere, but "\u200b" has no token (so it is O) and B-LOC must be closed by E-LOC.
    logits[:, IOBES.index("B-LOC")] = 2.0
    logits[:, IOBES.index("S-LOC")] = 1.5
    (result,) = TAGGING.decode([example], [feature], crf_outputs([feature], [logits], LinearChainCRF(IOBES).scores()),
                               {}, config)
    assert result["iobes_tags"] == ["S-LOC", "O", "S-LOC"]
    assert result["tags"] == ["B-LOC", "O", "B-LOC"]
    with pytest.raises(ValueError, match="carry no CRF scores"):
        TAGGING.decode([example], [feature], [logits], {}, config)


# --- saving and loading ---------------------------------------------------------------------------------

def test_crf_tagger_saves_and_reloads_with_identical_scores_and_tags(tmp_path, tokenizer):
    torch.manual_seed(0)
    model = BertForTokenClassification(tiny(use_crf=True)).eval()
    with torch.no_grad():
        for parameter in model.crf.parameters():
            parameter.normal_()
    model.save_pretrained(tmp_path / "crf")
    assert json.loads((tmp_path / "crf" / "config.json").read_text())["use_crf"] is True
    loaded, report = registry.load_model(tmp_path / "crf")
    assert type(loaded) is BertForTokenClassification and not report.fresh
    for name in ("transitions", "start", "end"):
        assert torch.equal(getattr(loaded.crf, name), getattr(model.crf, name))
    example = TaggingExample(WORDS, None, " ", "f:1")
    settings = InputSettings(max_seq_length=8, doc_stride=3)
    features = TAGGING.features([example], tokenizer, settings, config=model.config)

    @torch.no_grad()
    def decoded(m):
        outputs = []
        for feature in features:
            ids = torch.tensor([feature.input_ids])
            outputs += TAGGING.forward(m, FinetuneBatch(ids, torch.zeros_like(ids), torch.ones_like(ids),
                                                        torch.tensor([0])))
        return TAGGING.decode([example], features, outputs, {}, m.config)

    assert decoded(loaded) == decoded(model)


def test_plain_tagger_checkpoint_loads_as_a_plain_tagger_and_a_crf_starts_fresh(tmp_path):
    BertForTokenClassification(tiny()).save_pretrained(tmp_path / "plain")
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    config.pop("use_crf", None)  # a checkpoint written before the CRF existed
    (tmp_path / "plain" / "config.json").write_text(json.dumps(config))
    plain, report = registry.load_model(tmp_path / "plain")
    assert plain.crf is None and not report.fresh
    with_crf, report = registry.load_model(tmp_path / "plain", config_overrides={"use_crf": True})
    assert with_crf.crf is not None
    assert sorted(report.fresh_in(("crf.",))) == ["crf.end", "crf.start", "crf.transitions"]


def test_hugging_face_token_classifier_loads_a_crf_tagger_directory(tmp_path):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    ours = BertForTokenClassification(tiny(use_crf=True)).eval()
    ours.save_pretrained(tmp_path)
    theirs, info = transformers.BertForTokenClassification.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]
    assert sorted(info["unexpected_keys"]) == ["crf.end", "crf.start", "crf.transitions"]
    ids = torch.randint(5, 50, (2, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs.eval()(input_ids=ids).logits, ours(ids).logits, atol=1e-5, rtol=1e-4)
