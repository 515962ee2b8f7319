"""A ModernBERT directory (config.json with model_type modernbert, model.safetensors, a byte-level BPE
tokenizer.json trained here) served end to end: the embed pipeline loads it through the family registry,
tokenizes it with the tokenizers library and runs it on the torch fp32 engine (`build_engine`)."""

from __future__ import annotations

import numpy as np
import torch

from bertforge.checkpoint_format import load_tokenizer
from bertforge.engine.engine import TorchEngine
from bertforge.inference.pipelines import load_pipeline
from bertforge.model.config.modernbert import ModernBertConfig
from bertforge.model.modernbert import ModernBertModel
from bertforge.tokenization.tokenizer_json import train_bpe

CORPUS = ["The quick brown fox jumps over the lazy dog.", "Naive cafe owners serve creme brulee daily!"] * 30


def test_modernbert_directory_embeds_through_the_pipeline_and_engine(tmp_path):
    tokenizer = train_bpe(CORPUS, vocab_size=300)
    config = ModernBertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, intermediate_size=48,
                              num_hidden_layers=3, num_attention_heads=2, pad_token_id=tokenizer.pad_token_id,
                              local_attention=8, max_position_embeddings=512)
    torch.manual_seed(0)
    ModernBertModel(config).save_pretrained(tmp_path, tokenizer=tokenizer)
    pipeline = load_pipeline(tmp_path, "embed")
    assert isinstance(pipeline.engine, TorchEngine) and pipeline.engine.precision == "fp32"
    texts = ["The quick brown fox", "daily creme brulee " * 20]  # the second is longer than the local window
    vectors = np.asarray([answer["embedding"] for answer in pipeline(texts)])
    # The reference: the plain padded model, mean over the real tokens.
    model = ModernBertModel.from_pretrained(tmp_path, fast_path=False)
    inputs = load_tokenizer(tmp_path)(texts, padding=True, return_tensors="pt")
    assert inputs["input_ids"].shape[1] > config.local_attention
    with torch.no_grad():
        hidden = model(inputs["input_ids"], attention_mask=inputs["attention_mask"]).last_hidden_state
    mask = inputs["attention_mask"][..., None].float()
    expected = ((hidden * mask).sum(1) / mask.sum(1)).numpy()
    np.testing.assert_allclose(vectors, expected, atol=1e-5)
