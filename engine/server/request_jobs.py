"""API requests turned into generation `Job`s for the loaded model (`ModelService`).

Everything that can reject a request happens here, before a job is queued, so a bad request costs
no generation time and always gets a 400 (or 404) instead of failing mid-stream.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from engine.errors import RigllmError
from engine.generation.output_parser import CALL_OPEN
from engine.generation.sampler import SamplingParams
from engine.generation.serving.generation_job import Event, Job
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.request_error import APIError
from engine.generation.serving.request_limits import (LimitExceeded, check_deadline, check_prompt_length, check_stops,
                                                      text_length)
from engine.generation.serving.tool_schemas import check_tools, tool_names
from engine.generation.tool_call_syntax import FUNCTION_OPEN
from engine.server.logprob_format import requested_top_logprobs
from engine.server.request_fields import (choice_count, choice_seed, legacy_tools, prompt_list, sampling_seed,
                                          template_role, token_bias)
from engine.server.response_format import json_constraint_for
from engine.server.structured_reply import thinking_budget, tool_choice_constraint
from engine.server.wire import ChatCompletionRequest, ChatMessage, CompletionRequest, SamplingFields


def check_model(service: ModelService, requested: str | None) -> None:
    """A 404 unless the request names this model (or none)."""
    if requested and requested != service.model_id:
        raise APIError(404, f"The model '{requested}' does not exist; this server serves '{service.model_id}'",
                       param="model", code="model_not_found")

def chat_job(service: ModelService, req: ChatCompletionRequest, sink: Callable[[Event], None],
             backend_takes_images: bool = True, index: int = 0) -> Job:
    """The request as a job (for choice `index` of `n`); `backend_takes_images`: `GenerationWorker.supports_images`
    (when False, images are refused before the tower runs; `GenerationWorker.submit` refuses them in any case)."""
    check_model(service, req.model)
    tools, tool_choice = legacy_tools(req.functions, req.function_call, req.tools, req.tool_choice)
    if (tools, tool_choice) != (req.tools, req.tool_choice):
        req = req.model_copy(update={"tools": tools, "tool_choice": tool_choice})
    try:
        check_tools(req.tools)
    except LimitExceeded as err:
        raise APIError(400, str(err), param=err.param) from None
    constraint = json_constraint_for(req.response_format, service.tokenizer)
    if constraint is not None and req.tool_choice not in (None, "auto", "none"):
        raise APIError(400, "response_format json_object cannot be combined with a required or named "
                       "tool_choice (that reply starts with a tool call)", param="response_format")
    tools, forced = _tools(req)
    if forced:
        named = req.tool_choice.get("function", {}).get("name") if isinstance(req.tool_choice, dict) else None
        parallel = named is None and req.parallel_tool_calls is not False  # a named choice is one call
        constraint = tool_choice_constraint(tools or [], named, parallel, service.tokenizer)
    kwargs = req.chat_template_kwargs or {}
    enable_thinking = kwargs.get("enable_thinking")
    if enable_thinking is not None and not isinstance(enable_thinking, bool):
        raise APIError(400, "chat_template_kwargs.enable_thinking must be true or false",
                       param="chat_template_kwargs")
    messages = [template_message(i, m) for i, m in enumerate(req.messages)]
    try:
        check_prompt_length(text_length(messages), service.context_length, service.max_token_chars, "messages")
        prepared = service.prepare_chat(messages, tools=tools, enable_thinking=enable_thinking, reply_prefix=forced,
                                        backend_takes_images=backend_takes_images)
    except LimitExceeded as err:
        raise APIError(400, str(err), param=err.param, code="context_length_exceeded") from None
    except RigllmError as err:
        code = "context_length_exceeded" if "context holds" in str(err) else None
        raise APIError(400, str(err), param="messages", code=code) from None
    limit = req.max_completion_tokens or req.max_tokens
    prompt = prepared.chat
    job = _job(service, req, prepared.token_ids, limit, prompt.thinking, tools, sink, index)
    job.turn_start = service.turn_start(prepared.token_ids)
    job.constraint = constraint
    if prompt.thinking and not forced:
        job.thinking_budget = thinking_budget(req.reasoning_effort, req.max_thinking_tokens, job.max_tokens,
                                              constrained=constraint is not None)
    job.reply_prefix = prompt.reply_prefix
    job.multimodal = prepared.multimodal
    return job

def completion_job(service: ModelService, req: CompletionRequest, sink: Callable[[Event], None],
                   index: int = 0) -> Job:
    """Choice `index`: prompt `index // n` of the request's prompts (strings or token ids), its sample
    `index % n`; with `echo` the prompt's text leads the choice's text."""
    check_model(service, req.model)
    n = choice_count(req.n)
    _check_prompt_texts(service, req)
    ids = prompt_list(req.prompt, service.tokenizer)[index // n]
    if len(ids) >= service.context_length:
        raise APIError(400, f"the prompt is {len(ids)} tokens, the context holds {service.context_length}",
                       param="prompt", code="context_length_exceeded")
    job = _job(service, req, ids, req.max_tokens, False, None, sink, index % n)
    if req.echo:
        job.reply_prefix = service.tokenizer.decode(ids)
    return job


def choice_total(service: ModelService, req: SamplingFields) -> tuple[int, int]:
    """(choices in the response, choices per prompt): `n`, times the prompts of a completion request."""
    n = choice_count(req.n)
    if isinstance(req, CompletionRequest):
        _check_prompt_texts(service, req)
        return n * len(prompt_list(req.prompt, service.tokenizer)), n
    return n, n


def _check_prompt_texts(service: ModelService, req: CompletionRequest) -> None:
    """A 400 before tokenizing for a prompt text that cannot fit the context whatever it tokenizes to."""
    prompts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    for text in prompts:
        if isinstance(text, str):
            try:
                check_prompt_length(len(text), service.context_length, service.max_token_chars, "prompt")
            except LimitExceeded as err:
                raise APIError(400, str(err), param=err.param, code="context_length_exceeded") from None

def _tools(req: ChatCompletionRequest) -> tuple[list[dict[str, Any]] | None, str]:
    """The tools the reply may call, and the text the reply is forced to start with.

    "required" and a named function are met by starting the reply with the call's own markup (the
    model then writes the name and arguments, or only the arguments); with thinking on, the forced
    text first closes the reasoning block, left empty, since a call comes after it.
    """
    choice = req.tool_choice
    if choice is None or choice == "auto":
        return req.tools or None, ""
    if choice == "none":
        return None, ""
    if not req.tools:
        raise APIError(400, "tool_choice needs tools", param="tool_choice")
    if choice == "required":
        return req.tools, f"{CALL_OPEN}\n{FUNCTION_OPEN}"
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(name, str):
        raise APIError(400, 'tool_choice must be "auto", "none", "required" or '
                       '{"type": "function", "function": {"name": ...}}', param="tool_choice")
    if name not in tool_names(req.tools):
        raise APIError(400, f"tool_choice names '{name}', which is not among the tools", param="tool_choice")
    return req.tools, f"{CALL_OPEN}\n{FUNCTION_OPEN}{name}>\n"

def _job(service: ModelService, req: SamplingFields, prompt_ids: list[int], limit: int | None, thinking: bool,
         tools: list[dict[str, Any]] | None, sink: Callable[[Event], None], sample: int = 0) -> Job:
    """`sample`: which of the prompt's `n` choices (its seed is the request's plus `sample`)."""
    top_logprobs = requested_top_logprobs(req)
    values = {k: getattr(req, k) for k in ("temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                                           "presence_penalty", "frequency_penalty")}
    values["seed"] = choice_seed(sampling_seed(req.seed), sample)
    try:
        params = SamplingParams(**{k: v for k, v in values.items() if v is not None})
    except RigllmError as err:
        raise APIError(400, str(err), param=str(err).split(" ", 1)[0]) from None
    room = service.context_length - len(prompt_ids)
    max_tokens = min(limit or service.limits.default_max_tokens, room)
    try:
        stop = check_stops(req.stop)
        deadline = check_deadline(req.deadline_seconds)
    except LimitExceeded as err:
        raise APIError(400, str(err), param=err.param) from None
    return Job(prompt_ids, params, max_tokens, thinking, tools, stop, sink, top_logprobs=top_logprobs,
               speculative=req.speculative is not False,
               deadline=time.monotonic() + deadline if deadline is not None else None,
               logit_bias=token_bias(req.logit_bias, service.tokenizer.vocab_size))


def template_message(index: int, message: ChatMessage) -> dict[str, Any]:
    """A message as the chat template wants it: no None fields; text parts joined, unless the message
    holds images, whose parts then stay in place (the template writes each image's marker where it is)."""
    msg = message.model_dump(exclude_none=True)
    msg["role"] = template_role(msg["role"])
    if isinstance(message.content, list):
        for part in message.content:
            kind_ok = (part.type == "text" and part.text is not None) or (part.type == "image_url" and part.image_url)
            if not kind_ok:
                raise APIError(400, f"messages[{index}]: content part type '{part.type}' is not supported (text and "
                               "image_url parts are; an image_url part needs its image_url)",
                               param=f"messages.{index}.content")
        if all(part.type == "text" for part in message.content):
            msg["content"] = "".join(part.text or "" for part in message.content)
    elif message.content is None:
        msg["content"] = ""
    return msg
