"""End to end on real weights: all-MiniLM-L6-v2 fine-tuned on a few hundred SST-2 sentences beats chance clearly.

About 25 s on an idle two-core CPU (60 training steps, 200 dev sentences), so not marked slow. Skips when the
checkpoint package or the shared data directory is missing.
"""

from __future__ import annotations

import json

import pytest

from bertforge.configuration import shared_data_root
from bertforge.evaluation.saved_model import evaluate
from bertforge.training.finetune import run_finetuning
from bertforge.training.finetune_config import DataConfig, FinetuneConfig, FinetuneTrainingConfig

DATA = shared_data_root()


@pytest.mark.skipif(not (DATA / "glue/SST-2/train.tsv").exists(), reason="shared SST-2 data not present")
def test_finetune_minilm_sst2_beats_chance(minilm_path, tmp_path):
    config = FinetuneConfig(model=str(minilm_path),
                            data=DataConfig(task="sst2", data_root=str(DATA), train_limit=480, dev_limit=200),
                            training=FinetuneTrainingConfig(epochs=2, batch_size=16, lr=1e-4, device="cpu",
                                                            precision="fp32", out_dir=str(tmp_path / "run"),
                                                            progress=False, log_every=100))
    result = run_finetuning(config)
    assert len(result.history) == 2
    # 200 dev sentences (101 negative, 99 positive): chance is 0.5 with a standard error of 0.035, so 0.65
    # is more than four standard errors above it; 60 steps on 480 sentences usually reach 0.75 to 0.8.
    assert result.best_metrics["accuracy"] > 0.65, result.history
    stored = json.loads((result.model_dir / "config.json").read_text())
    assert stored["architectures"] == ["BertForSequenceClassification"]
    assert stored["id2label"] == {"0": "0", "1": "1"}
    assert (result.model_dir / "finetuning.json").exists()
    scored = evaluate(result.model_dir, DATA / "glue/SST-2/dev.tsv", out_dir=tmp_path / "eval",
                      limit=200, device="cpu")
    assert scored.metrics["accuracy"] == pytest.approx(result.best_metrics["accuracy"])
