"""sentence-transformers directories with a ModernBERT module, both ways, on tiny random models (no remote code):
a bertforge ModernBERT embedding model (cls or mean pooling, normalized or not) saved here loads in
`SentenceTransformer` with our vectors, and a directory `SentenceTransformer.save()` writes around a transformers
`ModernBertModel` (a byte-level BPE tokenizer.json, no vocab.txt) loads here (`load_pipeline`, `bertforge embed`,
`bertforge serve`'s OpenAI route) with its vectors; max |Δ| ≤ 1e-5 fp32.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from bertforge.families.embedding import ModernBertForSentenceEmbedding
from bertforge.inference.pipelines import load_pipeline
from bertforge.interop.sentence_transformers import SentenceSettings
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.tokenization.tokenizer_json import train_bpe

st = pytest.importorskip("sentence_transformers")
st_models = pytest.importorskip("sentence_transformers.models")
transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

BOUND = 1e-5
CORPUS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France, said the guide.",
          "Naive cafe owners serve creme brulee daily!"] * 20
# Short and long texts (past the local window of 8), an unknown byte sequence, a [MASK] inside text.
TEXTS = ["the quick fox", "Paris is the capital of France. " * 6, "cafe ñandú 北京", "the [MASK] dog",
         "x" * 40]


def tiny_config(tokenizer, **fields) -> ModernBertConfig:
    return ModernBertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                            num_attention_heads=2, pad_token_id=tokenizer.pad_token_id,
                            cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
                            bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                            local_attention=8, max_position_embeddings=512, **fields)


def ours(folder, texts=TEXTS) -> np.ndarray:
    return np.asarray([answer["embedding"] for answer in load_pipeline(folder, "embed", device="cpu")(texts)])


@pytest.mark.parametrize("pooling,normalize", [("cls", False), ("mean", True)])
def test_modernbert_embedding_model_saved_here_loads_in_sentence_transformers(tmp_path, pooling, normalize):
    tokenizer = train_bpe(CORPUS, vocab_size=300)
    torch.manual_seed(0)
    model = ModernBertForSentenceEmbedding(tiny_config(tokenizer))
    model.sentence = SentenceSettings(pooling=pooling, normalize=normalize, max_seq_length=64)
    model.save_pretrained(tmp_path, tokenizer=tokenizer)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["ModernBertModel"]
    theirs = st.SentenceTransformer(str(tmp_path), device="cpu")
    assert type(theirs[0].auto_model).__name__ == "ModernBertModel"
    # transformers' tokenizer on the saved tokenizer.json gives our ids, [CLS] and [SEP] included.
    assert theirs.tokenizer(TEXTS[0])["input_ids"] == tokenizer.encode(TEXTS[0]).ids
    vectors = theirs.encode(TEXTS, convert_to_numpy=True)
    assert np.abs(vectors - ours(tmp_path)).max() <= BOUND
    if normalize:
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


@pytest.fixture
def st_modernbert(tmp_path):
    """A directory SentenceTransformer.save() wrote: a random transformers ModernBertModel, its tokenizer.json
    (byte-level BPE) and tokenizer_config.json, [CLS] pooling, Normalize."""
    tokenizer = train_bpe(CORPUS, vocab_size=300)
    hf_dir = tmp_path / "hf"
    tokenizer.save_pretrained(hf_dir)
    config = transformers.ModernBertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=2, local_attention=8, max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
        cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id, bos_token_id=tokenizer.cls_token_id,
        eos_token_id=tokenizer.sep_token_id)
    torch.manual_seed(1)
    transformers.ModernBertModel(config).save_pretrained(hf_dir)
    encoder = st_models.Transformer(str(hf_dir), max_seq_length=128)
    model = st.SentenceTransformer(modules=[encoder, st_models.Pooling(32, pooling_mode="cls"), st_models.Normalize()],
                                   device="cpu")
    saved = tmp_path / "st"
    model.save(str(saved))
    assert not (saved / "vocab.txt").exists() and (saved / "tokenizer.json").is_file()
    return saved, model.encode(TEXTS, convert_to_numpy=True)


def test_sentence_transformers_modernbert_directory_embeds_here(st_modernbert, tmp_path):
    saved, theirs = st_modernbert
    assert np.abs(ours(saved) - theirs).max() <= BOUND
    from bertforge.cli import main

    (tmp_path / "in.txt").write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    assert main(["predict", "--model", str(saved), "--task", "embed", "--input", str(tmp_path / "in.txt"),
                 "--output", str(tmp_path / "out.jsonl"), "--device", "cpu"]) == 0
    lines = (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()
    assert np.abs(np.asarray([json.loads(line)["embedding"] for line in lines]) - theirs).max() <= BOUND


def test_sentence_transformers_modernbert_directory_serves_openai_embeddings(st_modernbert):
    import httpx

    saved, theirs = st_modernbert
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "bertforge", "serve", "--model", str(saved), "--port", str(port),
                               "--device", "cpu"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if server.poll() is not None:
                pytest.fail(f"serve exited: {server.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(url + "/ready").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        answer = httpx.post(url + "/v1/embeddings", json={"input": TEXTS, "model": "m"}, timeout=60)
        assert answer.status_code == 200, answer.text
        vectors = np.asarray([row["embedding"] for row in answer.json()["data"]])
        assert np.abs(vectors - theirs).max() <= BOUND
    finally:
        server.terminate()
        server.wait(timeout=30)
