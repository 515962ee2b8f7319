"""`bertforge convert`: Google TF directories (written by TensorFlow) and Hugging Face ones become our model
directories, which transformers loads with no missing or unexpected keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from bertforge.cli import main
from bertforge.families.pretraining import BertForPretraining
from bertforge.tokenization import Tokenizer

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "google_tf"
RELEASE = FIXTURES / "uncased_L-2_H-32_A-4"
PRETRAINING = FIXTURES / "pretraining_output"


def test_convert_google_release_loads_in_transformers(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "converted"
    assert main(["convert", str(RELEASE), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "BertForPretraining" in printed and "lower-cased" in printed and "parameters" in printed
    assert json.loads((out / "tokenizer_config.json").read_text())["do_lower_case"] is True
    theirs, info = transformers.AutoModelForPreTraining.from_pretrained(out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    ours = BertForPretraining.from_pretrained(RELEASE)
    ids = torch.tensor([[2, 7, 8, 9, 3, 0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    with torch.no_grad():
        a = ours(ids, attention_mask=mask)
        b = theirs.eval()(input_ids=ids, attention_mask=mask)
    assert torch.allclose(a.nsp_logits, b.seq_relationship_logits, atol=1e-5)
    assert torch.allclose(a.mlm_logits[0, :5], b.prediction_logits[0, :5], atol=1e-5)


def test_convert_pretraining_output_skips_optimizer_state_and_picks_step(tmp_path, capsys):
    latest, earlier = tmp_path / "latest", tmp_path / "step10"
    assert main(["convert", str(PRETRAINING), "--out", str(latest)]) == 0
    summary = capsys.readouterr().out
    assert " 0 skipped" not in summary  # Adam slots and global_step were read past, and counted
    assert main(["convert", str(PRETRAINING), "--out", str(earlier), "--step", "10", "--casing", "cased",
                 "--tokenizer", str(RELEASE)]) == 0
    a, b = BertForPretraining.from_pretrained(latest), BertForPretraining.from_pretrained(earlier)
    assert not torch.equal(a.bert.embeddings.word.weight, b.bert.embeddings.word.weight)
    assert Tokenizer.from_pretrained(earlier).config.do_lower_case is False


def test_convert_hugging_face_directory_round_trips(tmp_path, minilm_path):
    out = tmp_path / "minilm"
    assert main(["convert", str(minilm_path), "--out", str(out)]) == 0
    from bertforge.model.bert import BertModel

    a, b = BertModel.from_pretrained(minilm_path), BertModel.from_pretrained(out)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_convert_missing_source_is_one_clear_error(tmp_path, capsys):
    assert main(["convert", str(tmp_path / "nothing"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "nothing" in err and "Traceback" not in err
