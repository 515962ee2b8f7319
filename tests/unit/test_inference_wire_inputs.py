"""The one truncation rule's pieces (`inference.wire_inputs`, issue #46): which inputs of our own routes it
wraps, how a cut is marked and counted, and how a streamed feature step notes the cut inputs."""

from __future__ import annotations

from bertforge.families.reranking import RerankQuery
from bertforge.inference.pipelines import load_pipeline
from bertforge.inference.wire_inputs import (
    TRUNCATED,
    EmbedText,
    TruncatedInput,
    cut_inputs,
    family_results,
    noting_cuts,
    truncated_count,
)

LONG = "word " * 300  # over the tiny model's window


def test_wire_inputs_cut_inputs_wraps_texts_and_rerank_queries_and_leaves_windowed_tasks(tiny_minilm_model):
    query = RerankQuery("q", ("a", "b"))
    embed = cut_inputs("embed", ["a", "b"], True)
    ranked = cut_inputs("rerank", [query], False)
    assert embed == [EmbedText(text="a"), EmbedText(text="b")] and all(item.truncate for item in embed)
    assert isinstance(ranked[0], TruncatedInput) and ranked[0].example is query and not ranked[0].truncate
    assert ranked[0].pairs(query) == [("q", "a"), ("q", "b")]
    assert cut_inputs("classify", ["a"], True) == ["a"]  # classify windows a long text: not this rule's


def test_wire_inputs_a_cut_window_is_marked_and_counted_once_per_text(tiny_minilm_model):
    pipeline = load_pipeline(tiny_minilm_model, "embed", device="cpu")
    parsed = [EmbedText(text="short"), EmbedText(text=LONG)]
    features = pipeline.features(parsed)
    assert [feature.truncated for feature in features] == [False, True]
    assert len(features[1].input_ids) == pipeline.max_length
    results = pipeline.run_parsed(parsed, pipeline.check_options({}))
    assert [result[TRUNCATED] for result in results] == [0, 1] and truncated_count(results) == 1
    plain = family_results(results, parsed)
    assert all(set(result) == {"embedding"} for result in plain)  # our routes answer the family's results


def test_wire_inputs_family_results_keep_a_family_s_own_tokens():
    parsed = [EmbedText(text="a")]
    results = [{"indices": [1], "values": [0.5], "tokens": ["a"], TRUNCATED: 0}]  # sparse terms' names
    assert family_results(results, parsed) == [{"indices": [1], "values": [0.5], "tokens": ["a"]}]


def test_wire_inputs_noting_cuts_names_inputs_across_streamed_slices(tiny_minilm_model):
    pipeline = load_pipeline(tiny_minilm_model, "embed", device="cpu")
    items = [EmbedText(text=text) for text in ("a", LONG, "b", LONG, LONG)]
    cut, told = [], []
    make = noting_cuts(pipeline.features, cut, told.append)
    for start in (0, 2, 4):  # the streamed feature step: consecutive slices, each indexed from 0
        make(items[start:start + 2])
    assert cut == [1, 3, 4] and told == [1, 1, 1]
