"""The data position is global: a run saved at one world size resumes at another and takes exactly the steps
of the uninterrupted run (`data.finetuning.FeatureBatches`, `data.datasets.PretrainingData`), with the
accumulation adapted to keep the global batch (`training.resume.keep_global_batch`).

These are the fast guards of the multi-process tests in tests/distributed/test_elastic_resume.py: every
rank's source is built here in one process, as each rank would build it.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch

from bertforge.constants import TRAINING_STATE_NAME
from bertforge.data.datasets import RECORD_ENV
from bertforge.data.finetuning import Feature, FeatureBatches
from bertforge.errors import ConfigError
from bertforge.training.config import TrainingConfig
from bertforge.training.resume import keep_global_batch, resumed_config, saved_layout

sys.path.insert(0, str(Path(__file__).resolve().parent))
import test_data_datasets  # noqa: E402
from test_data_datasets import make, rows  # noqa: E402

data_dir = test_data_datasets.data_dir  # the prepared-shards fixture

# One global step of 8 examples, laid out four ways: (world size, batch size, accumulation).
LAYOUTS = [(4, 2, 1), (2, 2, 2), (1, 2, 4), (1, 8, 1)]


def features(count: int) -> list[Feature]:
    return [Feature(i, [2, 5 + i % 7, 3], [0, 0, 0], label=i % 2) for i in range(count)]


def steps(sources: list, count: int, accumulation: int) -> list[list[int]]:
    """The example ids of `count` optimizer steps over all ranks (`sources`: one per rank), each step sorted."""
    streams = [endless(source) for source in sources]
    taken = []
    for _ in range(count):
        ids = [i for stream in streams for _ in range(accumulation) for i in next(stream)]
        taken.append(sorted(ids))
    return taken


def endless(source):
    while True:
        for batch in source:
            yield batch.feature_index.tolist()


def feature_sources(world: int, batch: int, accumulation: int, count: int = 23, **options) -> list[FeatureBatches]:
    return [FeatureBatches(features(count), batch, 0, shuffle=True, seed=5, rank=rank, world_size=world,
                           grad_accumulation=accumulation, **options) for rank in range(world)]


def test_feature_batches_every_layout_of_one_global_step_takes_the_same_examples():
    # 23 examples, steps of 8: 2 whole steps and a partial one of 7 per epoch (split over the micro-batches).
    expected = steps(feature_sources(1, 8, 1), 9, 1)
    assert [len(s) for s in expected[:3]] == [8, 8, 7]
    assert sorted(i for s in expected[:3] for i in s) == list(range(23))  # an epoch is every example once
    for world, batch, accumulation in LAYOUTS:
        sources = feature_sources(world, batch, accumulation)
        assert {len(s) for s in sources} == {3 * accumulation}, (world, batch, accumulation)
        assert steps(sources, 9, accumulation) == expected, (world, batch, accumulation)


@pytest.mark.parametrize("before, after", [((4, 2, 1), (2, 2, 2)), ((2, 2, 2), (1, 2, 4)), ((4, 2, 1), (1, 2, 4))])
def test_feature_batches_resume_on_another_world_size_takes_the_uninterrupted_steps(before, after):
    uninterrupted = steps(feature_sources(*before), 10, before[2])
    first = feature_sources(*before)
    done = steps(first, 4, before[2])
    states = [source.state_dict() for source in first]
    assert all(state == states[0] for state in states)  # global: the same on every rank
    resumed = feature_sources(*after)
    for source in resumed:
        source.load_state_dict(json.loads(json.dumps(states[0])))
    assert done + steps(resumed, 6, after[2]) == uninterrupted


def test_feature_batches_a_partial_step_smaller_than_its_micro_batches_waits_for_the_next_epoch():
    # 9 examples in steps of 4 over 2 ranks: the last one cannot give both ranks an example.
    sources = feature_sources(2, 2, 1, count=9)
    assert [len(s) for s in sources] == [2, 2]
    assert sorted(i for s in steps(sources, 2, 1) for i in s) != list(range(9))
    one = feature_sources(1, 4, 1, count=9)[0]
    assert len(one) == 3  # one process keeps it: a last batch of one example


def test_feature_batches_read_the_earlier_position_format():
    source = feature_sources(2, 2, 1)[1]
    source.load_state_dict({"epoch": 1, "position": 3, "seed": 5})  # 3 batches of 2 on each of 2 ranks
    assert source.state_dict() == {"epoch": 1, "consumed": 12, "seed": 5}


def test_feature_batches_record_each_training_batch_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv(RECORD_ENV, str(tmp_path))
    source = feature_sources(2, 2, 1)[1]
    taken = [batch.feature_index.tolist() for batch in source]
    lines = [json.loads(line) for line in (tmp_path / "examples-rank1.jsonl").read_text().splitlines()]
    assert [line["ids"] for line in lines] == taken and {line["epoch"] for line in lines} == {0}


def pretraining_steps(data_dir: Path, world: int, batch: int, accumulation: int, count: int,
                      state: dict | None = None) -> tuple[list[list[tuple]], dict]:
    """The instances (as their masked rows) of `count` steps of the pretraining stream laid out as (world,
    batch, accumulation), each step sorted; and the (global) position after them."""
    sources = [make(data_dir, batch_size=batch, rank=r, world_size=world, grad_accumulation=accumulation)
               for r in range(world)]
    for source in sources:
        if state is not None:
            source.load_state_dict(state)
    taken = [sorted(row for source in sources for _ in range(accumulation) for row in rows(next(source)))
             for _ in range(count)]
    assert len({json.dumps(s.state_dict()) for s in sources}) == 1
    return taken, sources[0].state_dict()


# Steps of 12 instances: the split's 105 leave 9 after the last whole step, more than one global batch of
# most layouts, so an epoch cut per global batch instead of per step would show.
PRETRAINING_LAYOUTS = [(4, 3, 1), (2, 3, 2), (1, 3, 4), (1, 12, 1)]


def test_pretraining_data_every_layout_of_one_global_step_takes_the_same_instances(data_dir):
    per_epoch = make(data_dir, batch_size=12).num_instances // 12
    count = per_epoch + 3  # across an epoch boundary: every layout ends the epoch on the same step
    expected, _ = pretraining_steps(data_dir, 1, 12, 1, count)
    for world, batch, accumulation in PRETRAINING_LAYOUTS:
        assert pretraining_steps(data_dir, world, batch, accumulation, count)[0] == expected, (world, batch)
        source = make(data_dir, batch_size=batch, world_size=world, grad_accumulation=accumulation)
        assert source.steps_per_epoch == per_epoch * accumulation


def test_pretraining_data_resume_on_another_world_size_takes_the_uninterrupted_steps(data_dir):
    per_epoch = make(data_dir, batch_size=12).num_instances // 12
    uninterrupted, _ = pretraining_steps(data_dir, 4, 3, 1, per_epoch + 4)
    done, state = pretraining_steps(data_dir, 4, 3, 1, per_epoch - 1)
    rest, _ = pretraining_steps(data_dir, 2, 3, 2, 5, state=state)
    assert done + rest == uninterrupted


def config(**settings) -> TrainingConfig:
    return TrainingConfig(steps=10, **settings)


def test_keep_global_batch_adapts_the_accumulation_to_a_new_world_size():
    saved = (8, 1, 4)  # batch 8 x accumulation 1 x 4 processes = 32 per step
    assert keep_global_batch(config(batch_size=8), saved, 2).grad_accumulation == 2
    assert keep_global_batch(config(batch_size=8), saved, 1).grad_accumulation == 4
    assert keep_global_batch(config(batch_size=8, grad_accumulation=4), (8, 2, 2), 1).grad_accumulation == 4
    assert keep_global_batch(config(batch_size=8, grad_accumulation=1), (8, 2, 2), 4).grad_accumulation == 1
    assert keep_global_batch(config(batch_size=8), None, 2).grad_accumulation == 1  # nothing saved: as given
    with pytest.raises(ConfigError, match="batch_size x grad_accumulation x 3 = 32"):
        keep_global_batch(config(batch_size=8), saved, 3)


def test_keep_global_batch_keeps_a_changed_batch_and_says_what_changes(caplog):
    with caplog.at_level(logging.WARNING, logger="bertforge.training"):
        kept = keep_global_batch(config(batch_size=4), (8, 1, 4), 2)
        same_world = keep_global_batch(config(batch_size=8, grad_accumulation=2), (8, 1, 4), 4)
    assert (kept.batch_size, kept.grad_accumulation, same_world.grad_accumulation) == (4, 1, 2)
    assert "32 examples per step" in caplog.text and "each step now sees 8 examples" in caplog.text


def test_resumed_config_reads_the_checkpoint_the_run_resumes_from(tmp_path):
    checkpoint = tmp_path / "checkpoint-000004"
    checkpoint.mkdir()
    torch.save({"config": {"batch_size": 8, "grad_accumulation": 1}, "world_size": 4,
                "optimizer": {"state": {0: torch.zeros(3)}}}, checkpoint / TRAINING_STATE_NAME)
    assert saved_layout(checkpoint) == (8, 1, 4)
    resumed = resumed_config(config(batch_size=8, out_dir=str(tmp_path), resume="auto"), world_size=2)
    assert resumed.grad_accumulation == 2
    fresh = resumed_config(config(batch_size=8, out_dir=str(tmp_path / "new"), resume="auto"), world_size=2)
    assert fresh.grad_accumulation == 1
