"""Reading and writing the sentence-transformers files: what the packaged all-MiniLM-L6-v2 says, round trips of
every setting, and one clear error for each module layout or config bertforge does not run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertforge.errors import CheckpointError
from bertforge.interop.sentence_transformers import SentenceSettings, read_settings, settings_files


def write(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def test_read_settings_of_the_packaged_minilm(minilm_path):
    settings = read_settings(minilm_path)
    assert (settings.pooling, settings.normalize, settings.max_seq_length, settings.similarity) == \
        ("mean", True, 256, "cosine")


def test_read_settings_none_without_modules_json(tmp_path):
    assert read_settings(tmp_path) is None


@pytest.mark.parametrize("settings", [
    SentenceSettings(), SentenceSettings(pooling="cls+mean", normalize=True, max_seq_length=64, do_lower_case=True),
    SentenceSettings(pooling="lasttoken", prompts={"query": "q: "}, default_prompt_name="query", similarity="dot"),
])
def test_settings_files_round_trip(tmp_path, settings):
    assert read_settings(write(tmp_path, settings_files(settings, 32))) == settings


def test_read_settings_accepts_the_newer_pooling_mode_key(tmp_path):
    files = settings_files(SentenceSettings(), 32)
    files["1_Pooling/config.json"] = json.dumps({"embedding_dimension": 32, "pooling_mode": ["cls", "max"]})
    assert read_settings(write(tmp_path, files)).pooling == "cls+max"


@pytest.mark.parametrize("change, message", [
    (lambda f: f.update({"modules.json": json.dumps(json.loads(f["modules.json"]) + [
        {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}])}), "Dense"),
    (lambda f: f.pop("1_Pooling/config.json"), "1_Pooling/config.json: missing"),
    (lambda f: f.update({"1_Pooling/config.json": json.dumps({"pooling_mode_mean_tokens": False})}),
     "no pooling mode is true"),
    (lambda f: f.update({"1_Pooling/config.json": json.dumps({"pooling_mode": "mean", "include_prompt": False})}),
     "include_prompt"),
    (lambda f: f.update({"config_sentence_transformers.json": json.dumps({"similarity_fn_name": "jaccard"})}),
     "similarity_fn_name"),
    (lambda f: f.update({"modules.json": "[not json"}), "unreadable"),
    (lambda f: f.update({"sentence_bert_config.json": json.dumps({"max_seq_length": 2})}), "max_seq_length"),
])
def test_read_settings_refuses_what_bertforge_does_not_run(tmp_path, change, message):
    files = settings_files(SentenceSettings(), 32)
    change(files)
    with pytest.raises(CheckpointError, match=message):
        read_settings(write(tmp_path, files))
