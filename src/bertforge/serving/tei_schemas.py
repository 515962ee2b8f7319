"""The request and response models of text-embeddings-inference's routes (its `openapi.json`) and of the
Cohere rerank body that `/v1/rerank` also takes: pydantic models that validate each body and describe it in
`/openapi.json` (no coercion; TEI's ignore the fields TEI does not use, `TeiModel`; the Cohere body on our
`/v1/rerank` refuses unknown fields); the routes that answer them are `tei_routes`.

`truncate` absent or null means the server's `auto_truncate` (TEI's `--auto-truncate`; what `/info` reports:
true unless started with `--auto-truncate false`); the direction
takes TEI's spellings ("Right"/"Left") and the lower-case ones its clients send.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from bertforge.serving.wire_schemas import (  # isort: skip  (first: the serve-extra check)
    INPUTS,
    LENIENT_CONFIG,
    Dimensions,
    Text,
    TokenIds,
    WireModel,
    fitted,
    register,
)

from pydantic import BaseModel, ConfigDict, Field

Direction = Literal["right", "left", "Right", "Left"]


class TeiModel(WireModel):
    """A TEI request: fields TEI does not use are ignored, as TEI ignores them (the route names them in
    ``X-Ignored-Fields``); the fields it has are strict."""

    model_config = LENIENT_CONFIG
PromptName = Annotated[str, Field(json_schema_extra=fitted("prompt-name"))]


@register
class EmbedRequest(TeiModel):
    inputs: Text | TokenIds | Annotated[list[Text | TokenIds], INPUTS]
    normalize: bool = True
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: PromptName | None = None
    dimensions: Dimensions | None = None


@register
class EmbedSparseRequest(TeiModel):
    inputs: Text | TokenIds | Annotated[list[Text | TokenIds], INPUTS]
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: PromptName | None = None


@register
class EmbedAllRequest(EmbedSparseRequest):
    """The same body as /embed_sparse: token vectors are never normalized."""


class SimilarityInput(TeiModel):
    source_sentence: Text
    sentences: Annotated[list[Text], INPUTS]


class SimilarityParameters(TeiModel):
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    prompt_name: PromptName | None = None


@register
class SimilarityRequest(TeiModel):
    inputs: SimilarityInput
    parameters: SimilarityParameters | None = None


@register
class RerankRequest(TeiModel):
    query: Text
    texts: Annotated[list[Text], INPUTS]
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    raw_scores: bool = False
    return_text: bool = False


@register
class PredictRequest(TeiModel):
    inputs: Text | Annotated[list[Text], Field(min_length=2, max_length=2)] | Annotated[
        list[Annotated[list[Text], Field(min_length=1, max_length=2)]], INPUTS]
    truncate: bool | None = None
    truncation_direction: Direction = "right"
    raw_scores: bool = False


class ClassificationParameters(TeiModel):
    """Hugging Face's text-classification parameters (`InferenceClient.text_classification`)."""

    top_k: Annotated[int, Field(ge=1)] | None = None
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = None


@register
class ModelPredictRequest(PredictRequest):
    """`POST /` of a classifier: TEI's /predict body, plus the `parameters` Hugging Face's client sends."""

    parameters: ClassificationParameters | None = None


@register
class TokenizeRequest(TeiModel):
    inputs: Text | Annotated[list[Text], INPUTS]
    add_special_tokens: bool = True
    prompt_name: PromptName | None = None


@register
class DecodeRequest(TeiModel):
    ids: TokenIds | Annotated[list[TokenIds], INPUTS]
    skip_special_tokens: bool = True


class CohereDocument(BaseModel):
    """A Cohere document given as an object: its `text` is ranked, other string fields are kept aside."""

    model_config = ConfigDict(extra="allow", strict=True)
    __pydantic_extra__: dict[str, str]
    text: Text


@register
class CohereRerankRequest(WireModel):
    """The Cohere / Infinity rerank request."""

    query: Text
    documents: Annotated[list[Text | CohereDocument], INPUTS]
    model: str | None = None
    top_n: Annotated[int, Field(ge=1)] | None = None
    return_documents: bool = False
    max_chunks_per_doc: int | None = Field(None, description="accepted and ignored")


class Rank(BaseModel):
    index: int
    score: float
    text: str | None = None


class SparseValue(BaseModel):
    index: int
    value: float


class Prediction(BaseModel):
    label: str
    score: float


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class ServedModel(BaseModel):
    """One served model, in /info's `models`."""

    model_id: str
    model_type: dict[str, Any]
    tasks: list[str]
    max_input_length: int


class Info(BaseModel):
    model_id: str
    model_sha: str | None = None
    model_dtype: str
    model_type: dict[str, Any]
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int
    max_batch_requests: int | None = None
    max_client_batch_size: int
    auto_truncate: bool
    tokenization_workers: int
    version: str
    tasks: list[str] = Field(description="the routes of this model (bertforge's task names)")
    models: list[ServedModel] = Field(description="every served model (GET /models/<name>/info for one's fields)")


class TEIError(BaseModel):
    error: str
    error_type: str


class CohereResult(BaseModel):
    index: int
    relevance_score: float
    document: dict[str, str] | None = None


class CohereRerankResponse(BaseModel):
    id: str
    model: str
    results: list[CohereResult]


TEI_ERRORS = {status: {"model": TEIError, "description": text} for status, text in (
    (400, "malformed JSON, or several models and none named"), (404, "model not served"),
    (413, "batch size error"), (422, "validation or tokenization error (input over max_input_length)"),
    (424, "no served model is of this kind"), (429, "model is overloaded"), (503, "timed out"))}
