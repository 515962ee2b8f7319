"""run_pretraining end to end on a few KB of a real book: prepare shards, train a tiny BERT, resume."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_training_loop import single_thread  # noqa: F401  (autouse fixture)

from bertforge.configuration import load_config, shared_data_root
from bertforge.data.datasets import PretrainingData
from bertforge.data.preparation import prepare_corpus
from bertforge.data.shards import ShardIndex, SplitReader
from bertforge.errors import ConfigError
from bertforge.families.pretraining import BertForPretraining
from bertforge.model.fast_paths import fast_paths_enabled
from bertforge.tokenization import Tokenizer, TokenizerConfig
from bertforge.tokenization.vocab_builder import build_vocab
from bertforge.training.checkpoint import list_checkpoints
from bertforge.training.logging import read_metrics
from bertforge.training.pretraining import RUN_CONFIG_NAME, PretrainConfig, run_pretraining

BOOK = shared_data_root() / "pretrain_en/books/pg43_jekyll_and_hyde.txt"
TINY_MODEL = ("hidden_size = 32\nnum_hidden_layers = 1\nnum_attention_heads = 2\nintermediate_size = 37\n"
              "max_position_embeddings = 64")
# A ModernBERT with both kinds of layer (global, then two local ones) and a window shorter than the sequences.
TINY_MODERNBERT = ("hidden_size = 32\nnum_hidden_layers = 3\nnum_attention_heads = 2\nintermediate_size = 48\n"
                   "local_attention = 8\nmax_position_embeddings = 64")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    if not BOOK.is_file():
        pytest.skip(f"{BOOK} is not available")
    root = tmp_path_factory.mktemp("pretrain")
    lines = BOOK.read_text(encoding="utf-8").splitlines()[:600]
    files = []
    for part in range(6):  # one document per file
        files.append(root / f"part{part}.txt")
        files[-1].write_text("\n".join(lines[part * 100:(part + 1) * 100]), encoding="utf-8")
    tokenizer = Tokenizer(build_vocab(files, 300), TokenizerConfig())
    tokenizer.save_pretrained(root / "data")
    prepare_corpus(files, tokenizer, root / "data", max_seq_length=32, heldout_documents=1, seed=1)
    return root / "data"


@pytest.fixture(scope="module")
def contiguous_dir(data_dir, tmp_path_factory):
    """The same documents and vocabulary as rows of consecutive text (`prepare --contiguous`)."""
    out = tmp_path_factory.mktemp("contiguous") / "data"
    files = sorted(data_dir.parent.glob("part*.txt"))
    tokenizer = Tokenizer.from_pretrained(data_dir)
    tokenizer.save_pretrained(out)
    prepare_corpus(files, tokenizer, out, max_seq_length=32, heldout_documents=1, seed=1, contiguous=True)
    return out


def run_file(tmp_path, data_dir, *overrides, arch="bert"):
    tmp_path.mkdir(parents=True, exist_ok=True)
    path = tmp_path / "run.toml"
    model = TINY_MODERNBERT if arch == "modernbert" else TINY_MODEL
    path.write_text(f'data_dir = "{data_dir}"\narch = "{arch}"\nmodel = "tiny"\n[model_overrides]\n{model}\n'
                    '[masking]\nmax_predictions_per_seq = 5\n'
                    f'[training]\nsteps = 6\nbatch_size = 4\nlr = 1e-3\nwarmup_steps = 2\nlog_every = 1\n'
                    f'eval_every = 3\nsave_every = 3\nprecision = "fp32"\ndevice = "cpu"\nprogress = false\n'
                    f'tensorboard = false\nout_dir = "{tmp_path / "out"}"\n', encoding="utf-8")
    return load_config(PretrainConfig, path, overrides)


def test_run_pretraining_trains_evaluates_and_checkpoints(tmp_path, data_dir):
    config = run_file(tmp_path, data_dir)
    result = run_pretraining(config)
    out = tmp_path / "out"
    assert result.step == 6
    assert [s for s, _ in list_checkpoints(out)] == [3, 6]
    assert set(result.eval) == {"mlm_loss", "mlm_acc", "mlm_majority_acc", "nsp_loss", "nsp_acc", "loss"}
    assert 0 < result.eval["mlm_majority_acc"] < 1
    events = read_metrics(out)
    assert [e["step"] for e in events if e["split"] == "eval"] == [3, 6]
    assert all(torch.isfinite(torch.tensor(e["values"]["loss"])) for e in events)
    model = BertForPretraining.from_pretrained(result.checkpoint)
    assert model.config.hidden_size == 32 and model.config.vocab_size == 300
    assert (result.checkpoint / "vocab.txt").is_file()
    assert load_config(PretrainConfig, out / RUN_CONFIG_NAME) == config


@pytest.mark.parametrize("arch,packed", [("bert", False), ("modernbert", False), ("modernbert", True)])
def test_run_pretraining_resume_matches_uninterrupted(tmp_path, data_dir, short_dir, monkeypatch, arch, packed):
    # The tiny preset keeps dropout 0.1, and masks are drawn per batch: RNG and stream position both matter.
    # Packed: the packed stream resumes at the same batch, packed as it was.
    data_dir, packing = (short_dir, ("--pack_sequences=true",)) if packed else (data_dir, ())
    full = run_pretraining(run_file(tmp_path / "a", data_dir, *packing, arch=arch))
    produce = PretrainingData.__next__
    served = []

    def interrupted(self):
        if self.split == "train":
            served.append(1)
            if len(served) > 5:  # during step 6; the last checkpoint is step 3
                raise KeyboardInterrupt("simulated preemption")
        return produce(self)

    monkeypatch.setattr(PretrainingData, "__next__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_pretraining(run_file(tmp_path / "b", data_dir, *packing, arch=arch))
    monkeypatch.undo()
    resumed = run_pretraining(run_file(tmp_path / "b", data_dir, *packing, "--training.resume=auto", arch=arch))

    def logged(events):
        return [(e["step"], e["split"], {k: v for k, v in e["values"].items() if k != "tokens_per_s"})
                for e in events]

    assert [e["step"] for e in resumed.history if e["split"] == "train"] == [4, 5, 6]
    assert logged(read_metrics(tmp_path / "b" / "out")) == logged(read_metrics(tmp_path / "a" / "out"))
    assert logged(resumed.history) == logged(full.history)[4:]


def test_run_pretraining_with_data_workers_matches_in_process(tmp_path, data_dir):
    """Batches made ahead in worker processes: the same run, loss for loss (dropout included)."""
    def logged(result):
        return [(e["step"], e["split"], {k: v for k, v in e["values"].items() if k != "tokens_per_s"})
                for e in result.history]

    plain = run_pretraining(run_file(tmp_path / "plain", data_dir, "--training.data_workers=0"))
    workers = run_pretraining(run_file(tmp_path / "workers", data_dir, "--training.data_workers=2"))
    assert logged(workers) == logged(plain)


def test_pretrain_config_rejects_unknown_preset(tmp_path, data_dir):
    with pytest.raises(ConfigError, match="neither a model directory nor a preset"):
        PretrainConfig(data_dir=str(data_dir), model="huge")


@pytest.fixture(scope="module")
def short_dir(data_dir, tmp_path_factory):
    """Short documents of short sentences (one per line, blank line between documents) in 64-token rows: their
    instances are well under the rows, so packing has something to pack."""
    root = tmp_path_factory.mktemp("short")
    tokenizer = Tokenizer.from_pretrained(data_dir)
    tokenizer.save_pretrained(root / "data")
    words = BOOK.read_text(encoding="utf-8").split()[:3000]
    lines = [" ".join(words[start:start + 4 + start % 5]) + "." for start in range(0, len(words), 9)]
    documents = ["\n".join(lines[start:start + 2 + start % 3]) for start in range(0, len(lines), 4)]
    (root / "short.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    prepare_corpus(root / "short.txt", tokenizer, root / "data", max_seq_length=64, heldout_fraction=0.1, seed=1,
                   format="sentences")
    return root / "data"


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_run_pretraining_packed_matches_one_instance_per_row(tmp_path, short_dir, arch):
    """pack_sequences changes the batch layout only: with dropout off, every logged loss agrees (ModernBERT: its
    local layers' window, 4 tokens each side, shorter than the packed sequences, stays inside each)."""
    data_dir = short_dir
    no_dropout = () if arch == "modernbert" else (  # (ModernBERT's presets have none)
        "--model_overrides.hidden_dropout_prob=0.0", "--model_overrides.attention_probs_dropout_prob=0.0")
    plain = run_pretraining(run_file(tmp_path / "plain", data_dir, *no_dropout, arch=arch))
    packed_config = run_file(tmp_path / "packed", data_dir, *no_dropout, "--pack_sequences=true", arch=arch)
    assert packed_config.pack_sequences
    packed = run_pretraining(packed_config)

    def losses(result):
        return [(e["step"], e["split"], e["values"]["loss"]) for e in result.history if "loss" in e["values"]]

    assert [key[:2] for key in losses(plain)] == [key[:2] for key in losses(packed)]
    for (_, _, a), (_, _, b) in zip(losses(plain), losses(packed)):
        assert a == pytest.approx(b, rel=1e-4)
    # The packed stream really packs: the same instances in fewer rows.
    data = PretrainingData(data_dir, batch_size=8, masking=packed_config.masking, seed=1, vocab_size=300,
                           special_ids=[0, 1, 2, 3, 4], mask_id=4, pack_sequences=True)
    batches = [next(data) for _ in range(4)]
    assert all(batch.sequence_ids is not None and len(batch.nsp_labels) == 8 for batch in batches)
    assert sum(len(batch) for batch in batches) < 32


def test_run_pretraining_activation_checkpointing_matches_plain(tmp_path, data_dir):
    plain = run_pretraining(run_file(tmp_path / "plain", data_dir))
    recomputed = run_pretraining(run_file(tmp_path / "ckpt", data_dir, "--training.activation_checkpointing=true"))
    model = BertForPretraining.from_pretrained(recomputed.checkpoint)
    assert not fast_paths_enabled(model)["activation_checkpointing"]  # a runtime switch, not stored with the model

    def losses(result):
        return [e["values"]["loss"] for e in result.history if "loss" in e["values"]]

    assert losses(plain) == pytest.approx(losses(recomputed), rel=1e-5)


def test_run_pretraining_mlm_objective_has_no_nsp_and_loads_everywhere(tmp_path, data_dir):
    from bertforge.families.classification import BertForSequenceClassification
    from bertforge.families.pretraining import BertForMaskedLM
    from bertforge.families.registry import load_model
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.storage import read_json

    result = run_pretraining(run_file(tmp_path, data_dir, "--objective=mlm"))
    assert set(result.eval) == {"mlm_loss", "mlm_acc", "mlm_majority_acc", "loss"}
    assert {k for k in result.train if k.startswith(("loss", "nsp", "mlm"))} == {"loss", "loss_mlm", "mlm_acc"}
    saved = read_json(result.checkpoint / "config.json")
    assert saved["architectures"] == ["BertForMaskedLM"]
    model, report = load_model(result.checkpoint)
    assert type(model) is BertForMaskedLM and report.fresh == []
    assert not any(k.startswith(("nsp.", "bert.pooler.")) for k in model.state_dict())
    classifier = BertForSequenceClassification.from_pretrained(result.checkpoint, config_overrides={
        "id2label": {0: "a", 1: "b"}})
    assert classifier.config.num_labels == 2
    filled = load_pipeline(result.checkpoint, "fill-mask")(["the [MASK] was dark."])
    assert len(filled[0]["masks"][0]["predictions"]) == 5
    # Continuing with NSP from the MLM-only model: the NSP head and the pooler start fresh.
    base = run_file(tmp_path / "on", data_dir)
    both = run_pretraining(dataclasses.replace(base, model=str(result.checkpoint), model_overrides={}))
    assert "nsp_acc" in both.eval


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
def test_run_pretraining_on_contiguous_rows_trains_mlm_on_full_rows(tmp_path, contiguous_dir, arch):
    seen = []
    produce = PretrainingData.__next__

    def counted(self):
        batch = produce(self)
        if self.split == "train":
            seen.append(batch.attention_mask.sum(dim=1).tolist())
        return batch

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(PretrainingData, "__next__", counted)
        result = run_pretraining(run_file(tmp_path, contiguous_dir, "--objective=mlm", arch=arch))
    assert result.step == 6 and 0 < result.eval["mlm_acc"] <= 1 and "nsp_acc" not in result.eval
    lengths = [length for batch in seen for length in batch]
    index = ShardIndex.load(contiguous_dir)
    short = sum(record["instances"] > 0 for record in index.shards("train"))  # a shard's last row
    assert len(lengths) == 6 * 4 and sum(length != 32 for length in lengths) <= short


def test_run_pretraining_refuses_nsp_on_contiguous_rows_before_building_a_model(tmp_path, contiguous_dir,
                                                                                monkeypatch):
    from bertforge.training import pretraining

    monkeypatch.setattr(pretraining, "build_model", lambda *a, **k: pytest.fail("built a model"))
    with pytest.raises(ConfigError, match=r"contiguous rows of text \(prepare --contiguous\).*--objective mlm"):
        run_pretraining(run_file(tmp_path, contiguous_dir))  # mlm+nsp, the default


def test_prepare_command_contiguous_flag_writes_contiguous_rows(tmp_path, data_dir):
    from bertforge.cli import main

    files = [str(p) for p in sorted(data_dir.parent.glob("part*.txt"))]
    main(["prepare", "--corpus", *files, "--tokenizer", str(data_dir), "--out", str(tmp_path / "rows"),
          "--max-seq-length", "32", "--contiguous"])
    index = ShardIndex.load(tmp_path / "rows")
    assert index.settings["contiguous"] is True
    reader = SplitReader(index, "train")
    assert [len(reader.instance(n)[0]) for n in range(len(reader) - 1)] == [32] * (len(reader) - 1)


def test_pretrain_command_defaults_to_the_recipes_warmup(data_dir):
    from bertforge.cli import build_parser, pretrain_config
    from bertforge.training.pretraining import PRETRAIN_WARMUP_RATIO

    args, extra = build_parser().parse_known_args(["pretrain", "--data", str(data_dir), "--lr", "1e-3",
                                                    "--steps", "1000"])
    config = pretrain_config(args, extra)
    assert config.training.warmup_ratio == PRETRAIN_WARMUP_RATIO == 0.06
    assert config.training.resolved_warmup(config.training.total_steps(None)) == 60
    assert config.training.out_dir == "runs/pretrain"  # a flag keeps the table's other defaults
    assert config.objective == "mlm+nsp" and config.training.schedule == "linear"  # Google's recipe by default
    assert config.masking.mlm_probability == 0.15


def test_pretrain_mask_rate_flag_is_validated_and_applies(data_dir):
    from bertforge.cli import build_parser, pretrain_config
    from bertforge.data.masking import MaskingConfig
    from bertforge.training.pretraining import predictions_for_rate

    def parse(*flags):
        args, extra = build_parser().parse_known_args(["pretrain", "--data", str(data_dir), *flags])
        return pretrain_config(args, extra)

    assert parse("--mask-rate", "0.3").masking.mlm_probability == 0.3
    with pytest.raises(ConfigError, match=r"--mask-rate \(masking.mlm_probability\)=1.5 is invalid"):
        parse("--mask-rate", "1.5")
    # 30% of 128 tokens is 39 predictions: the cap (20 by default) rises so that the rate applies.
    assert predictions_for_rate(MaskingConfig(mlm_probability=0.3), 128).max_predictions_per_seq == 39
    assert predictions_for_rate(MaskingConfig(), 128).max_predictions_per_seq == 20


def test_pretrain_tensorboard_without_the_package_is_one_clear_error(data_dir, monkeypatch):
    import importlib.util

    from bertforge.cli import main
    from bertforge.training.pretraining import PretrainTrainingConfig

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a))
    with pytest.raises(ConfigError, match=r"pip install 'bertforge\[tensorboard\]'"):
        PretrainTrainingConfig(tensorboard=True)
    assert main(["pretrain", "--data", str(data_dir), "--model", "tiny", "--tensorboard"]) == 2


def test_cli_pretrain_ctrl_c_saves_the_step_and_prints_the_resume_command(tmp_path, data_dir, monkeypatch,
                                                                        capsys):
    import signal

    from bertforge.cli import main

    run_file(tmp_path, data_dir)
    path = tmp_path / "run.toml"
    produce = PretrainingData.__next__
    served = []

    def interrupted(self):
        if self.split == "train":
            served.append(1)
            if len(served) == 5:  # during step 5; the last checkpoint of the cadence is step 3
                signal.raise_signal(signal.SIGINT)
        return produce(self)

    monkeypatch.setattr(PretrainingData, "__next__", interrupted)
    assert main(["pretrain", str(path), "--steps", "6"]) == 130
    out = tmp_path / "out"
    assert [s for s, _ in list_checkpoints(out)] == [3, 5]
    message = capsys.readouterr().err
    assert f"interrupted after step 5 (its checkpoint is saved); the latest checkpoint is {out}" in message
    assert f"resume with:\n  bertforge pretrain {path} --steps 6 --resume auto" in message
    monkeypatch.undo()
    assert main(["pretrain", str(path), "--steps", "6", "--resume", "auto"]) == 0
    assert [s for s, _ in list_checkpoints(out)][-1] == 6


def test_run_pretraining_modernbert_writes_a_directory_that_loads_and_fills_masks(tmp_path, data_dir):
    from bertforge.families.registry import load_model
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.model.modernbert import ModernBertForMaskedLM
    from bertforge.storage import read_json

    config = run_file(tmp_path, data_dir, arch="modernbert")
    # The recipe's defaults, under the run file's own keys.
    assert (config.objective, config.masking.mlm_probability, config.training.schedule) == ("mlm", 0.3, "wsd")
    result = run_pretraining(config)
    assert result.step == 6
    assert set(result.eval) == {"mlm_loss", "mlm_acc", "mlm_majority_acc", "loss"}
    assert {k for k in result.train if k.startswith(("loss", "nsp", "mlm"))} == {"loss", "loss_mlm", "mlm_acc"}
    assert all(torch.isfinite(torch.tensor(e["values"]["loss"])) for e in result.history)
    saved = read_json(result.checkpoint / "config.json")
    assert saved["model_type"] == "modernbert" and saved["architectures"] == ["ModernBertForMaskedLM"]
    assert (saved["local_attention"], saved["pad_token_id"], saved["cls_token_id"]) == (8, 0, 2)
    model, report = load_model(result.checkpoint)
    assert type(model) is ModernBertForMaskedLM and report.fresh == []
    assert model.bert.encoder.layers[1].attention.window == 4  # a local layer
    filled = load_pipeline(result.checkpoint, "fill-mask")(["the [MASK] was dark."])
    assert len(filled[0]["masks"][0]["predictions"]) == 5
    assert load_config(PretrainConfig, tmp_path / "out" / RUN_CONFIG_NAME) == config
    # Continuing from the directory: with its arch, and refused with the other one.
    again = dataclasses.replace(run_file(tmp_path / "again", data_dir, "--training.steps=1", arch="modernbert"),
                                model=str(result.checkpoint), model_overrides={})
    assert run_pretraining(again).step == 1
    with pytest.raises(ConfigError, match=r"holds a modernbert model but arch='bert'; set arch = 'modernbert'"):
        run_pretraining(dataclasses.replace(run_file(tmp_path / "bert", data_dir), model=str(result.checkpoint),
                                            model_overrides={}))


def test_run_pretraining_modernbert_tokenizer_reads_as_far_as_the_model(tmp_path, data_dir):
    from bertforge.inference.pipelines import load_pipeline
    from bertforge.storage import read_json

    config = run_file(tmp_path, data_dir, "--training.steps=1", arch="modernbert")
    config = dataclasses.replace(config, model_overrides={**config.model_overrides, "max_position_embeddings": 2048})
    result = run_pretraining(config)
    # The vocabulary was made for BERT (512); the saved tokenizer reads the model's 2,048 positions, so a long
    # input's window is the model's.
    assert read_json(result.checkpoint / "tokenizer_config.json")["model_max_length"] == 2048
    assert load_pipeline(result.checkpoint, "fill-mask", max_length=2048).max_length == 2048


def test_run_pretraining_modernbert_directory_loads_in_transformers(tmp_path, data_dir):
    transformers = pytest.importorskip("transformers")
    from bertforge.model.modernbert import ModernBertForMaskedLM

    result = run_pretraining(run_file(tmp_path, data_dir, "--training.steps=2", arch="modernbert"))
    ours = ModernBertForMaskedLM.from_pretrained(result.checkpoint).eval()
    theirs = transformers.AutoModelForMaskedLM.from_pretrained(result.checkpoint, attn_implementation="eager").eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(result.checkpoint)
    batch = tokenizer(["the door was dark and the street was quiet.", "he said."], padding=True,
                      return_tensors="pt")
    with torch.no_grad():
        expected = theirs(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        got = ours(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    real = batch["attention_mask"].bool()
    assert (got[real] - expected[real]).abs().max() < 1e-5


def test_pretrain_modernbert_defaults_and_refusals(tmp_path, data_dir):
    from bertforge.cli import build_parser, pretrain_config

    def parse(*flags):
        args, extra = build_parser().parse_known_args(["pretrain", "--data", str(data_dir), *flags])
        return pretrain_config(args, extra)

    config = parse("--arch", "modernbert", "--model", "mini")
    assert (config.objective, config.masking.mlm_probability, config.training.schedule) == ("mlm", 0.3, "wsd")
    config = parse("--arch", "modernbert", "--mask-rate", "0.15", "--schedule", "linear")
    assert (config.masking.mlm_probability, config.training.schedule) == (0.15, "linear")  # flags win
    assert parse().objective == "mlm+nsp" and parse().masking.mlm_probability == 0.15  # BERT's unchanged
    with pytest.raises(ConfigError, match=r"ModernBERT is pretrained with masked LM only .*use objective mlm"):
        parse("--arch", "modernbert", "--objective", "mlm+nsp")
    assert parse("--arch", "modernbert", "--pack-sequences").pack_sequences  # packed rows as BERT's
    with pytest.raises(ConfigError, match=r"model\)='medium' is neither a model directory nor a preset \(of "
                                         r"arch 'modernbert'\)"):
        parse("--arch", "modernbert", "--model", "medium")
    with pytest.raises(ConfigError, match=r"arch='gpt' is invalid: use one of \('bert', 'modernbert'\)"):
        PretrainConfig(data_dir=str(data_dir), arch="gpt")
