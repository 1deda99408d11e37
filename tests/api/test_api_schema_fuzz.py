"""schemathesis fuzzes every operation of the live server's /openapi.json: bad or odd input never gets a
5xx, and every response conforms to the document (its status code, content type, headers and body
schema are the ones declared).

The server runs the real reference backend on the demo model with a 48-token context, so requests
that pass validation still generate (and sample with whatever parameters were fuzzed) but stay short.
The operations are driven through schemathesis' Python API (one hypothesis run per operation),
since its pytest plugin does not run under pytest 9.
"""

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from api_fixtures import live_server, model_backend

FUZZ_CONTEXT = 48
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_headers_conformance,
          response_schema_conformance]


@pytest.fixture(scope="module")
def api_schema():
    loaded = load_model(ensure_demo_model())
    with live_server(loaded, model_backend(loaded), context_length=FUZZ_CONTEXT) as live:
        yield schemathesis.openapi.from_url(live.base_url.removesuffix("/v1") + "/openapi.json")


def test_every_operation_answers_as_documented(api_schema):
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) >= 14  # both prefixes of models, chat, completions, health, tokenize, detokenize
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, database=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        def fuzz(case):
            case.call_and_validate(checks=CHECKS, timeout=30)

        fuzz()
