"""Status -> exception class mapping and what each exception carries."""

from __future__ import annotations

import httpx
import hypic_client as hc
import pytest
from hypic_client._errors import make_status_error


def respond(status: int, **kw) -> hc.Hypic:
    return hc.Hypic(
        "http://hypic.test", max_retries=0, transport=httpx.MockTransport(lambda r: httpx.Response(status, **kw))
    )


@pytest.mark.parametrize(
    ("status", "cls"),
    [
        (400, hc.BadRequestError),
        (401, hc.AuthenticationError),
        (403, hc.PermissionDeniedError),
        (404, hc.NotFoundError),
        (409, hc.ConflictError),
        (422, hc.UnprocessableEntityError),
        (429, hc.RateLimitError),
        (500, hc.InternalServerError),
        (502, hc.InternalServerError),
        (503, hc.InternalServerError),
        (413, hc.APIStatusError),
    ],
)
def test_status_maps_to_class_with_envelope_fields(status: int, cls: type[hc.APIStatusError]):
    env = {"error": {"type": "some_type", "message": "say what to fix", "param": "segments.0.text"}}
    with pytest.raises(cls) as ei:
        respond(status, json=env).health()
    e = ei.value
    assert type(e) is cls
    assert isinstance(e, hc.APIStatusError) and isinstance(e, hc.HypicError)
    assert (e.status_code, e.error_type, e.message, e.param) == (
        status,
        "some_type",
        "say what to fix",
        "segments.0.text",
    )
    assert e.body == env
    assert e.response.status_code == status and e.request.url.path == "/health"
    assert str(status) in str(e) and "say what to fix" in str(e) and "segments.0.text" in str(e)


def test_fastapi_validation_detail_is_understood():
    detail = {
        "detail": [{"loc": ["body", "max_tokens"], "msg": "Input should be a valid integer", "type": "int_parsing"}]
    }
    with pytest.raises(hc.UnprocessableEntityError) as ei:
        respond(422, json=detail).generate(["x"], "q")
    assert ei.value.param == "max_tokens"
    assert ei.value.error_type == "int_parsing"
    assert "valid integer" in ei.value.message


def test_plain_text_and_empty_bodies():
    with pytest.raises(hc.InternalServerError) as ei:
        respond(500, text="upstream exploded").health()
    assert ei.value.message == "upstream exploded" and ei.value.error_type is None
    with pytest.raises(hc.NotFoundError) as ei2:
        respond(404).health()
    assert ei2.value.message == "Not Found" and ei2.value.body is None


def test_detail_string_and_bare_error_string():
    r = httpx.Response(401, json={"detail": "missing api key"}, request=httpx.Request("GET", "http://x/health"))
    assert make_status_error(r).message == "missing api key"
    r = httpx.Response(403, json={"error": "forbidden tenant"}, request=httpx.Request("GET", "http://x/health"))
    e = make_status_error(r)
    assert isinstance(e, hc.PermissionDeniedError) and e.message == "forbidden tenant"


def test_non_json_success_is_a_validation_error():
    with pytest.raises(hc.APIResponseValidationError):
        respond(200, text="<html>proxy</html>").health()


def test_wrong_shape_success_is_a_validation_error():
    with pytest.raises(hc.APIResponseValidationError):
        respond(200, json={"text": ["not", "a", "string"]}).generate(["x"], "q")


def test_client_side_validation_errors_are_value_errors():
    c = hc.Hypic("http://hypic.test", transport=httpx.MockTransport(lambda r: httpx.Response(200, json={})))
    with pytest.raises(ValueError, match="at least one segment or a query"):
        c.generate([])
    with pytest.raises(ValueError, match="non-empty"):
        c.segments.get("")
    with pytest.raises(ValueError, match="pin= and/or ttl="):
        c.segments.update("abc")
