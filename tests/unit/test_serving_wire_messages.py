"""The one-line refusals of a request body that does not fit its schema: a problem inside a field is named by
its own path and answered with what that path accepts, not what the top-level field does."""

import pytest

pytest.importorskip("fastapi")

from pydantic import ValidationError  # noqa: E402

from bertforge.serving.search_routes import SearchRequest  # noqa: E402
from bertforge.serving.wire_schemas import validation_message  # noqa: E402


def refusal(body):
    with pytest.raises(ValidationError) as caught:
        SearchRequest.model_validate(body)
    return validation_message(caught.value.errors(include_url=False), SearchRequest, body)


def test_validation_message_names_the_nested_field_and_what_it_takes():
    message, param = refusal({"query": "x", "filter": {"source": ["s1"]}})
    assert param == "filter"
    assert message.startswith("filter.source must be a string")
    assert "an object with the fields eq, ne, in" in message
    assert message.endswith("got a list of 1 item")


def test_validation_message_of_a_top_level_field_keeps_its_description():
    message, _ = refusal({"query": "x", "filter": ["s1"]})
    assert message == "filter must be an object, or null; got a list of 1 item"
