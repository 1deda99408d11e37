"""Mainstream clients against the live server on the trained fixture: the official openai SDK
(`.parse()`; chat, completions, Responses and tools are in test_api_structured_trained /
test_api_responses / test_api_request_fields), litellm, langchain-openai and the `llm` CLI.

Replies are the tiny model's; what is checked is that each client gets a well-formed answer through its
own parsing: text, a stream, a tool call to a listed function with valid arguments, structured output."""

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
from pydantic import BaseModel

from api_fixtures import live_server, model_backend
from test_api_structured_trained import TIME, loaded  # noqa: F401 (the trained fixture for conftest's server)

ASK = "the weather in paris"
NO_THINKING = {"reasoning_effort": "none"}


class Weather(BaseModel):
    city: str
    hot: bool


def test_openai_parse_returns_the_model(client, server):
    r = client.chat.completions.parse(model=server.model_id, messages=[{"role": "user", "content": ASK}],
                                      response_format=Weather, max_tokens=120, temperature=0)
    parsed = r.choices[0].message.parsed
    assert isinstance(parsed, Weather)


def test_litellm_completion_and_stream(server):
    litellm = pytest.importorskip("litellm")
    args = dict(model=f"openai/{server.model_id}", api_base=server.base_url, api_key="noop",
                messages=[{"role": "user", "content": ASK}], max_tokens=20, temperature=0, **NO_THINKING)
    whole = litellm.completion(**args)
    assert whole.choices[0].message.content and whole.usage.completion_tokens <= 20
    streamed = "".join(c.choices[0].delta.content or "" for c in litellm.completion(stream=True, **args))
    assert streamed == whole.choices[0].message.content


@pytest.fixture(scope="module")
def chat_model(server):
    ChatOpenAI = pytest.importorskip("langchain_openai").ChatOpenAI  # in the dev extra; absent on the GPU image
    return ChatOpenAI(model=server.model_id, base_url=server.base_url, api_key="noop", temperature=0,
                      max_tokens=60, max_retries=0, reasoning_effort="none")


def test_langchain_invoke_and_stream(chat_model):
    whole = chat_model.invoke(ASK)
    assert whole.content
    assert "".join(chunk.content for chunk in chat_model.stream(ASK)) == whole.content


def test_langchain_bind_tools(chat_model):
    from langchain_core.tools import tool
    from pydantic import BaseModel, Field

    class TimeArgs(BaseModel):
        zone: str = Field(max_length=16, description="an IANA time zone")

    @tool(args_schema=TimeArgs)
    def get_time(zone: str) -> str:
        """The time in a zone."""
        return "noon"

    # the fixture was never trained on tools: a bounded string lets its call close inside the budget (a call
    # cut by the budget is dropped, finish_reason "length")
    reply = chat_model.bind_tools([get_time], tool_choice="get_time").invoke(ASK)
    (call,) = reply.tool_calls
    assert call["name"] == "get_time" and set(call["args"]) == {"zone"} and len(call["args"]["zone"]) <= 16


def test_langchain_with_structured_output_default(chat_model):
    result = chat_model.with_structured_output(Weather).invoke(ASK)  # the default method: json_schema
    assert isinstance(result, Weather)


def test_llm_cli_shows_the_reasoning_inline(loaded, tmp_path):
    """The `llm` CLI drops `reasoning_content`; with `--reasoning-format none` the reasoning is in the text."""
    with live_server(loaded, model_backend(loaded), reasoning_format="none") as live:
        (tmp_path / "extra-openai-models.yaml").write_text(
            f"- model_id: rig\n  model_name: {live.model_id}\n  api_base: {live.base_url}\n")
        env = {**os.environ, "LLM_USER_PATH": str(tmp_path), "OPENAI_API_KEY": "noop"}
        cli = Path(sys.executable).with_name("llm")
        if not cli.is_file():
            pytest.skip(f"the llm CLI (dev extra) is not installed beside {sys.executable}")
        done = subprocess.run([str(cli), "-m", "rig", "--no-log", "-o", "max_tokens", "30", "-o", "temperature", "0",
                               ASK], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("<think>")
