"""The strict request and response models of bertforge's own task routes (`POST /v1/<task>`), for validation
and for `/openapi.json`.

A task route checks a body in two passes: first the family's own parsing (`InferenceService.validate`: its
messages name the input and the fix, e.g. ``inputs[3].context: text is empty``), then the route's strict model
here (`check_task_body`), which refuses what the families let through: `parameters` that is not an object
(null, [], false), unknown fields inside an input, parameters of the wrong type (a string for a number, a
float for an integer). The same models describe each route's body and answer in the OpenAPI document, so
generated clients and fuzzers know every field (before, `inputs` was ``items: {}``).

The field names and bounds are those the families check (`Family.parse`, `validate_options`); a test holds
every route's documented example to its model.
"""

from __future__ import annotations

import itertools
import re
from typing import Annotated, Any, Union

from bertforge.families.embedding import POOLINGS
from bertforge.families.reranking import MAX_CANDIDATES
from bertforge.inference.wire_inputs import CUT_TASKS
from bertforge.interop.sentence_transformers import SPLADE_ACTIVATIONS, SPLADE_STRATEGIES
from bertforge.serving.envelopes import RequestError

from bertforge.serving.wire_schemas import FIT, INPUTS, Text, WireModel, check_body, fitted, register  # isort: skip (first)

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag

# A fill-mask text holds the literal marker the family looks for.
MaskedText = Annotated[str, Field(min_length=1, description="a text with [MASK] where a word is to be predicted",
                                  json_schema_extra={"pattern": r"\[MASK\]"})]
Word = Annotated[str, Field(min_length=1, description="a word (not whitespace alone)", json_schema_extra=fitted("word"))]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Probability = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
# Each pooling mode at most once, joined by '+'; the document lists them in one order (the server takes any).
POOLING_NAMES = ["+".join(combination) for size in range(1, len(POOLINGS) + 1)
                 for combination in itertools.combinations(POOLINGS, size)]


# --- inputs --------------------------------------------------------------------------------------------------

class TextInput(WireModel):
    text: Text


class MaskedTextInput(WireModel):
    text: MaskedText


class PairInput(WireModel):
    text: Text
    text_pair: Text | None = None


class WordsInput(WireModel):
    words: Annotated[list[Word], Field(min_length=1)]


class QuestionInput(WireModel):
    question: Text
    context: Text
    id: str | None = None


class RerankInput(WireModel):
    query: Text
    texts: Annotated[list[Text], Field(min_length=1, max_length=MAX_CANDIDATES)]


class ChoiceInput(WireModel):
    context: Text
    endings: Annotated[list[Text], Field(min_length=2)]
    start: str = ""


# --- parameters ----------------------------------------------------------------------------------------------

class NoParameters(WireModel):
    """This task takes no parameters."""


def option(kind: Any, description: str | None = None, fit: str | None = None, enum: list[str] | None = None) -> Any:
    """A parameter that may be left out (the model's default) but not sent as null; `fit`: its bounds are the
    served models' (`wire_schemas.fitted`); `enum`: the values the document lists (the family checks them)."""
    def described(schema: dict[str, Any]) -> None:
        schema.pop("default", None)  # absent means the model's own default, which differs per model directory
        if fit is not None:
            schema[FIT] = fit
        if enum is not None:
            schema["enum"] = enum

    return Field(default=None, description=description, json_schema_extra=described)


class ClassifyParameters(WireModel):
    threshold: Probability | None = option(None, "multi-label decision threshold (null or absent: the model's)")


class EmbedParameters(WireModel):
    pooling: str = option(None, "pooling modes joined by '+', each at most once", enum=POOLING_NAMES)
    normalize: bool = option(None, "scale each vector to length 1")
    layer: int = option(None, "hidden layer to pool (-1: the last)", fit="layer")
    token_vectors: bool = option(None, "every token's vector of the layer instead of one pooled vector")


class SparseParameters(WireModel):
    pooling: str = option(None, "SPLADE pooling over the tokens", enum=list(SPLADE_STRATEGIES))
    activation: str = option(None, "log(1 + relu) of the logits, or once more log1p", enum=list(SPLADE_ACTIVATIONS))
    max_terms: Annotated[int, Field(ge=0)] = option(None, "keep each text's largest this many weights (0: all, up to the "
                                                   "server's max_sparse_terms)", fit="sparse-terms")
    tokens: bool = option(None, "add each term's vocabulary token")


class MultiVectorParameters(WireModel):
    role: str = option(None, "document (the default: cut to the model's document length, punctuation dropped) or "
                       "query (filled with [MASK] to the model's query length)", enum=["document", "query"])


class FillMaskParameters(WireModel):
    top_k: Annotated[int, Field(ge=1, le=100)] = option(None)


class RerankParameters(WireModel):
    top_n: Annotated[int, Field(ge=1)] = option(None, "keep the n best")
    return_text: bool = option(None, "add each text to its result")


class AnswerParameters(WireModel):
    max_answer_length: Annotated[int, Field(ge=1, le=512)] = option(None)
    n_best_size: Annotated[int, Field(ge=1, le=100)] = option(None)
    version_2_with_negative: bool = option(None)
    null_score_diff_threshold: Finite = option(None)


# --- outputs (extra fields allowed: an answer may grow a field without breaking clients) ------------------------

class Output(BaseModel):
    model_config = ConfigDict(extra="allow")


class Prediction(Output):
    token: str
    id: int
    score: float


class Mask(Output):
    start: int
    end: int
    predictions: list[Prediction]


class FillMaskOutput(Output):
    masks: list[Mask]
    filled: str | list[str] | None = None


class ClassifyOutput(Output):
    label: str | None = None
    labels: list[str] | None = None
    score: float | None = None
    scores: dict[str, float] | list[float] | None = None
    value: float | None = None
    windows: int


class Entity(Output):
    type: str
    start: int
    end: int
    text: str
    score: float


class TagOutput(Output):
    entities: list[Entity]
    tags: list[Any] | None = None


class Candidate(Output):
    text: str
    start: int | None = None
    end: int | None = None
    probability: float
    logit_score: float


class AnswerOutput(Output):
    answer: str
    start: int | None = None
    end: int | None = None
    probability: float
    logit_score: float
    nbest: list[Candidate] | None = None
    null_margin: float | None = None


class ChooseOutput(Output):
    choice: int
    score: float
    scores: list[float]
    logits: list[float]


class EmbedOutput(Output):
    embedding: list[float] | list[list[float]]  # one vector, or one per token (token_vectors)


class SparseOutput(Output):
    indices: list[int]
    values: list[float]
    tokens: list[str] | None = None


class MultiVectorOutput(Output):
    embeddings: list[list[float]]  # one unit vector per scored token


class Ranked(Output):
    index: int
    score: float
    logit: float
    text: str | None = None


class RerankOutput(Output):
    results: list[Ranked]


class TruncationUsage(Output):
    """What the answer of a task that cuts over-long inputs to the window says of it (`wire_inputs`' rule)."""

    truncated_inputs: int = Field(description="texts cut to the model's window (0: none)")


def shape_of(value: Any) -> str:
    return "object" if isinstance(value, dict) else "list" if isinstance(value, list) else "text"


def one_of(**shapes: Any) -> Any:
    """An input that may come in several JSON shapes (text, list, object), told apart by its shape so a refusal
    names the problem of the shape that was sent (not of every shape it was not)."""
    return Annotated[Union[tuple(Annotated[kind, Tag(shape)] for shape, kind in shapes.items())],  # noqa: UP007
                     Discriminator(shape_of)]


Pair = Annotated[list[Text], Field(min_length=1, max_length=2, description="[text] or [text, text_pair]")]
QuestionPair = Annotated[list[Text], Field(min_length=2, max_length=2, description="[question, context]")]

# task -> (input type, parameters model, output model)
TASK_MODELS: dict[str, tuple[Any, type[WireModel], type[BaseModel]]] = {
    "classify": (one_of(text=Text, list=Pair, object=PairInput), ClassifyParameters, ClassifyOutput),
    "embed": (one_of(text=Text, object=TextInput), EmbedParameters, EmbedOutput),
    "embed-sparse": (one_of(text=Text, object=TextInput), SparseParameters, SparseOutput),
    "embed-multi-vector": (one_of(text=Text, object=TextInput), MultiVectorParameters, MultiVectorOutput),
    "tag": (one_of(text=Text, object=TextInput | WordsInput), NoParameters, TagOutput),
    "answer": (one_of(object=QuestionInput, list=QuestionPair), AnswerParameters, AnswerOutput),
    "choose": (ChoiceInput, NoParameters, ChooseOutput),
    "fill-mask": (one_of(text=MaskedText, object=MaskedTextInput), FillMaskParameters, FillMaskOutput),
    "rerank": (RerankInput, RerankParameters, RerankOutput),
}


def model_names(task: str) -> tuple[str, str]:
    """The OpenAPI component names of a task's request and response: `ClassifyTaskRequest`,
    `ClassifyTaskResponse` (TEI's `EmbedRequest` is another body)."""
    stem = "".join(part.capitalize() for part in task.split("-"))
    return f"{stem}TaskRequest", f"{stem}TaskResponse"


def build_models(task: str) -> tuple[type[WireModel], type[BaseModel]]:
    """(request model, response model) of `/v1/<task>` (registered for the OpenAPI document)."""
    from pydantic import create_model

    item, parameters, output = TASK_MODELS[task]
    request_name, response_name = model_names(task)
    request = create_model(request_name, __base__=WireModel,
                           inputs=(Annotated[list[item], INPUTS], ...),
                           parameters=(parameters, Field(default_factory=parameters)))
    usage = {"usage": (TruncationUsage, ...)} if task in CUT_TASKS else {}
    response = create_model(response_name, __base__=Output, outputs=(list[output], ...), **usage)
    register(request)
    return request, response


REQUEST_MODELS: dict[str, type[WireModel]] = {}
RESPONSE_MODELS: dict[str, type[BaseModel]] = {}
for _task in TASK_MODELS:
    REQUEST_MODELS[_task], RESPONSE_MODELS[_task] = build_models(_task)


def check_task_body(task: str, body: Any) -> None:
    """422 (RequestError) naming the first field of `body` the strict model of `/v1/<task>` refuses; a task
    without a model (served elsewhere) passes."""
    model = REQUEST_MODELS.get(task)
    if model is None:
        return
    try:
        check_body(model, body)
    except RequestError as error:
        error.message = readable_location(error.message)
        raise


def readable_location(message: str) -> str:
    """pydantic's `inputs.0.object.TextInput.x` as the request's own path, `inputs[0].x`."""
    message = re.sub(r"\.(?:text|list|object)(?=[.:\s])", "", message)
    message = re.sub(r"\.[A-Z]\w*Input(?=[.:\s])", "", message)
    return re.sub(r"\.(\d+)", r"[\1]", message)
