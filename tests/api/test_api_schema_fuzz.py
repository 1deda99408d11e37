"""schemathesis fuzzes every operation of the live server's /openapi.json: bad or odd input never gets a 5xx.

The server runs the real reference backend on the demo model with a 48-token context, so requests
that pass validation still generate (and sample with whatever parameters were fuzzed) but stay short.
"""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from api_fixtures import live_server, model_backend

FUZZ_CONTEXT = 48


@pytest.fixture(scope="module")
def api_schema():
    loaded = load_model(ensure_demo_model())
    with live_server(loaded, model_backend(loaded), context_length=FUZZ_CONTEXT) as live:
        yield schemathesis.openapi.from_url(live.base_url.removesuffix("/v1") + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=25, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case):
    case.call_and_validate(checks=[not_a_server_error], timeout=30)
