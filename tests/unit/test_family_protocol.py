"""The `Family` protocol holds the one path from input to answer, and training's hooks live beside it.

Pinned here: the protocol's method names (a new method is a decision, made by changing `PROTOCOL`), that no
training hook (`FamilyTraining`'s public names) is on a family and no protocol method on a companion, that
only training reaches the hooks (checked from source, as tests/unit/test_layering.py does), and that a new
family writing only `parse`, `features` and `decode` runs through predict's pipeline and `predict_stream`.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import string
from pathlib import Path

import pytest
import torch

from bertforge.errors import ConfigError
from bertforge.families import registry
from bertforge.families.base import Family, FamilyTraining, text_of
from bertforge.families.classification import BertForSequenceClassification
from bertforge.inference import family_pipelines
from bertforge.inference import pipelines as P
from bertforge.inference.predict_lines import predict_stream
from bertforge.model.config import BertConfig
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab import Vocab

SOURCE = Path(__file__).resolve().parents[2] / "src" / "bertforge"
# The one path, in the order a consumer asks (families/base.py's docstring): what a model needs and offers,
# the call's options, a data file and its metrics (evaluate), the inputs, the run, the outputs.
PROTOCOL = {
    "check_model", "serves_by_default", "check_options", "validate_options", "directory_options",
    "options_for_data", "read", "metric_defaults", "metric_names", "requested_metrics", "check_labels",
    "parse", "windowed_texts", "features", "forward", "decode", "score", "calibrate", "record", "labelled",
}
# Modules that train, and so may ask a family's `training` (the demo pretrains and fine-tunes).
TRAINING_MODULES = ("training/", "demo.py")


def public_names(cls: type) -> set[str]:
    """The public methods and properties `cls` defines or inherits below `object`."""
    return {name for klass in cls.__mro__[:-1] for name, value in vars(klass).items()
            if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property))}


HOOKS = public_names(FamilyTraining)


def test_family_protocol_is_the_one_path_and_nothing_more():
    assert public_names(Family) == PROTOCOL
    assert len(PROTOCOL) == 20
    assert HOOKS >= {"objective_for", "label_names", "head_config", "label_counts", "run_settings", "format_reader",
                     "trained_class", "prepare_model"}
    assert not HOOKS & set(dir(Family))


def test_family_protocol_every_family_keeps_training_hooks_in_its_companion():
    for family in registry.FAMILIES:
        assert isinstance(family.training, family.training_hooks) and family.training.family is family
        on_family = set(dir(type(family))) & HOOKS
        assert not on_family, f"{family.name} defines training hooks on the family: {sorted(on_family)}"
        on_companion = public_names(type(family.training)) & PROTOCOL
        assert not on_companion, f"{family.name}'s training defines protocol methods: {sorted(on_companion)}"
    trains = {f.name for f in registry.FAMILIES if type(f.training) is not FamilyTraining}
    assert trains == {f.name for f in registry.FINETUNING_FAMILIES} | {"pretraining"}


def training_hook_calls(tree: ast.AST) -> list[int]:
    """Lines reaching a training hook through a `training` attribute (`family.training.objective_for`)."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in HOOKS | {"evaluate", "model_class_for"}
            and isinstance(node.value, ast.Attribute) and node.value.attr == "training"]


def test_family_protocol_only_training_reaches_the_hooks():
    reached = {}
    for path in sorted(SOURCE.rglob("*.py")):
        relative = path.relative_to(SOURCE).as_posix()
        lines = training_hook_calls(ast.parse(path.read_text(encoding="utf-8")))
        if lines:
            reached[relative] = lines
    outside = {module: lines for module, lines in reached.items() if not module.startswith(TRAINING_MODULES)}
    assert not outside, f"only training asks a family's training hooks: {outside}"
    assert "training/finetune.py" in reached  # the checker finds what it looks for
    assert training_hook_calls(ast.parse("x = task.family.training.objective_for(config)")) == [1]


# --- a new family: the three methods it needs, through predict ---------------------------------------------

class BestLabel(Family):
    """A family written from the protocol alone: a text in, its most likely label out (the default `forward`
    gives each row's logits). No training hook, no reader, no metric."""

    name = "best_label"
    model_class = BertForSequenceClassification
    task = "best-label"

    def parse(self, item):
        return text_of(item)

    def features(self, examples, tokenizer, settings, *, config, report=None, training=False):
        from bertforge.data.finetuning import Feature

        encoded = [tokenizer.encode(text, truncation="longest_first", max_length=settings.max_seq_length)
                   for text in examples]
        return [Feature(index, e.ids, e.type_ids) for index, e in enumerate(encoded)]

    def decode(self, examples, features, outputs, options, config, tokenizer=None):
        return [{"label": config.label_names[int(logits.argmax())]} for logits in outputs]


@pytest.fixture
def best_label(monkeypatch) -> BestLabel:
    family = BestLabel()
    monkeypatch.setitem(registry._BY_TASK, family.task, family)
    monkeypatch.setattr(family_pipelines, "TASKS", (*family_pipelines.TASKS, family.task))  # what check_task reads
    return family


def test_family_protocol_new_family_runs_through_predict(best_label):
    words = "the cat sat on mat a dog ran".split()
    letters = [c for c in string.ascii_lowercase if c not in words]
    tokenizer = Tokenizer(Vocab(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words, *letters]),
                          TokenizerConfig(model_max_length=32))
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=32,
                        id2label={0: "calm", 1: "busy", 2: "odd"})
    torch.manual_seed(0)
    model = BertForSequenceClassification(config).eval()
    texts = ["the cat sat on the mat", "a dog ran", "the dog sat", "a cat ran on a mat"]
    with torch.no_grad():
        expected = [config.label_names[int(model(**model_inputs(tokenizer, text)).logits.argmax())] for text in texts]

    assert public_names(BestLabel) - public_names(Family) == set()  # nothing beyond the protocol
    assert {n for n, v in vars(BestLabel).items() if inspect.isfunction(v)} == {"parse", "features", "decode"}
    pipeline = P.Pipeline(best_label.task, model, tokenizer, device="cpu", precision="fp32", batch_size=3)
    assert pipeline.run(texts) == [{"label": label} for label in expected]
    out = io.StringIO()
    lines = [json.dumps({"text": texts[0], "id": "a"}), texts[1], "", texts[2]]
    assert predict_stream(pipeline, lines, out, chunk_size=2) == 3
    written = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["label"] for r in written] == expected[:3] and written[0]["id"] == "a"
    with pytest.raises(ConfigError, match="best_label family has no training objective"):
        best_label.training.objective_for(config)


def model_inputs(tokenizer: Tokenizer, text: str) -> dict[str, torch.Tensor]:
    encoding = tokenizer.encode(text)
    ids = torch.tensor([encoding.ids])
    return {"input_ids": ids, "token_type_ids": torch.tensor([encoding.type_ids]), "attention_mask": torch.ones_like(ids)}
