"""Render a model's Jinja chat template into the prompt text, the way transformers' `apply_chat_template` does.

Chat templates ship inside model files, so they are untrusted code: they run in jinja2's immutable
sandbox. The environment mirrors Hugging Face's (trim_blocks + lstrip_blocks, loop controls, a
`tojson` that keeps non-ASCII text and takes indent/separators/sort_keys, `raise_exception`,
`strftime_now`, a `namespace` that refuses underscore names) because model authors write and test
their templates against HF; any difference would silently change the prompt the model sees.

Messages are OpenAI-style dicts. Before rendering they are rebuilt from plain JSON types (rich objects
such as decoded images become inert `<TypeName>` placeholders, which is all a template may inspect),
`reasoning`/`thinking` fill a missing `reasoning_content` as HF does, and tool-call `arguments` given
as a JSON string (the OpenAI wire form) become a mapping, as llama.cpp's server does, because Qwen
templates iterate the arguments with `|items`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.utils
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.errors import RigllmError
from engine.paths import RESOURCES_DIR

FALLBACK_TEMPLATE_PATH = RESOURCES_DIR / "chat_template_qwen35.jinja"
_REASONING_ALIASES = ("reasoning_content", "reasoning", "thinking")


class ChatTemplateError(RigllmError):
    """The chat template cannot be compiled, or refused the conversation (its own message is kept)."""


class _TemplateRaised(jinja2.TemplateError):
    """What the template's `raise_exception(message)` throws, so its message reaches the user verbatim."""


class _Namespace(jinja2.utils.Namespace):
    """`namespace()` that refuses underscore-prefixed names, which could reach Python internals."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 — same signature trick as jinja's Namespace
        self, rest = args[0], args[1:]
        attrs = dict(*rest, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates may not store underscore names ({name!r})")


def _raise_exception(message: str) -> None:
    raise _TemplateRaised(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """HF's `tojson`: plain `json.dumps` (jinja's own escapes `<`, `>`, `&` and `'` for HTML)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    env.globals["namespace"] = _Namespace
    return env


def plain_data(value: Any) -> Any:
    """`value` rebuilt from JSON types only; anything else becomes the placeholder `<TypeName>`.

    Subclasses of str/int/float (enums, numpy scalars) are reduced to the base type so the sandbox
    never sees their extra methods.
    """
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_data(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain_data(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if callable(getattr(value, "model_dump", None)):  # pydantic models (API wire types)
        return plain_data(value.model_dump())
    item = getattr(value, "item", None)
    if callable(item) and getattr(value, "shape", None) == ():  # numpy scalar
        return plain_data(item())
    return f"<{type(value).__name__}>"


def _object_arguments(call: Any, message_index: int) -> Any:
    """A tool call whose `function.arguments` JSON string is decoded into the mapping templates expect."""
    if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
        return call
    function = call["function"]
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return call
    try:
        decoded = json.loads(arguments) if arguments.strip() else {}
    except json.JSONDecodeError as err:
        raise ChatTemplateError(
            f"message {message_index}: tool call '{function.get('name')}' has arguments that are not valid JSON ({err})"
        ) from None
    if not isinstance(decoded, dict):
        raise ChatTemplateError(
            f"message {message_index}: tool call '{function.get('name')}' arguments must be a JSON object"
        )
    return {**call, "function": {**function, "arguments": decoded}}


def prepare_messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Fresh plain copies of the messages, normalised as the module docstring describes."""
    prepared: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        msg = plain_data(message)
        if not isinstance(msg, dict):
            raise ChatTemplateError(f"message {index} is not an object")
        if msg.get("reasoning_content") is None:
            reasoning = next((msg[k] for k in _REASONING_ALIASES if msg.get(k) is not None), None)
            if reasoning is not None:
                msg["reasoning_content"] = reasoning
        if isinstance(msg.get("tool_calls"), list):
            msg["tool_calls"] = [_object_arguments(call, index) for call in msg["tool_calls"]]
        prepared.append(msg)
    return prepared


class ChatTemplate:
    """A compiled chat template; `render` turns a conversation into the prompt text."""

    def __init__(self, source: str, *, origin: str = "given", bos_token: str = "", eos_token: str = "") -> None:
        self.source = source
        self.origin = origin
        self._special = {"bos_token": bos_token, "eos_token": eos_token}
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateSyntaxError as err:
            raise ChatTemplateError(
                f"{origin} chat template does not compile: {err.message} (line {err.lineno})"
            ) from None

    @classmethod
    def fallback(cls) -> ChatTemplate:
        """rigllm's own Qwen3.5 template (renders as the official one does; thinking on by default)."""
        return cls(FALLBACK_TEMPLATE_PATH.read_text(encoding="utf-8"), origin="bundled Qwen3.5")

    @classmethod
    def for_model(cls, fields: Mapping[str, Any]) -> ChatTemplate:
        """The GGUF's `tokenizer.chat_template` (with its bos/eos token strings), else the bundled fallback."""
        source = fields.get("tokenizer.chat_template")
        if not isinstance(source, str) or not source.strip():
            return cls.fallback()
        tokens = fields.get("tokenizer.ggml.tokens") or []

        def token_text(key: str) -> str:
            token_id = fields.get(key)
            return tokens[token_id] if isinstance(token_id, int) and 0 <= token_id < len(tokens) else ""

        return cls(source, origin="model's", bos_token=token_text("tokenizer.ggml.bos_token_id"),
                   eos_token=token_text("tokenizer.ggml.eos_token_id"))

    def render(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True, enable_thinking: bool | None = None, **kwargs: Any) -> str:
        """The prompt text. `enable_thinking=None` leaves the variable undefined, i.e. the template's default.

        Extra keyword arguments become template variables (`add_vision_id`, `preserve_thinking`, …).
        """
        context: dict[str, Any] = {**self._special, **plain_data(kwargs)}
        if enable_thinking is not None:
            context["enable_thinking"] = bool(enable_thinking)
        try:
            return self._template.render(
                messages=prepare_messages(messages),
                tools=plain_data(list(tools)) if tools is not None else None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **context,
            )
        except _TemplateRaised as err:
            raise ChatTemplateError(str(err.message)) from None
        except (jinja2.TemplateError, TypeError, ValueError, AttributeError, KeyError, IndexError) as err:
            raise ChatTemplateError(f"{self.origin} chat template failed on this conversation: {err}") from None
