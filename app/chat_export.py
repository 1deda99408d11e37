"""A conversation as a JSON or Markdown file, and back (images travel inline as base64 / data URIs).

JSON is the lossless form (reasoning, tool calls, status, stats). Markdown is for reading and
sharing; it round-trips roles, text, reasoning (a `<details>` block) and images, which is what a
person edits.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any

from app.chat_records import Attachment, Message

FORMAT = "rigllm-chat"
FORMAT_VERSION = 1
_ROLES = {"system": "System", "user": "User", "assistant": "Assistant"}
_HEADING = re.compile(r"^## (System|User|Assistant)\s*$", re.MULTILINE)
_IMAGE = re.compile(r"^!\[([^\]]*)\]\(data:([^;]+);base64,([A-Za-z0-9+/=]+)\)\s*$", re.MULTILINE)
_DETAILS = re.compile(r"^<details><summary>Thinking</summary>\n\n(.*?)\n\n</details>\n*", re.DOTALL)


class ChatImportError(ValueError):
    """The file is not a conversation this version can read; the message says why."""


def to_json(title: str, messages: list[Message]) -> str:
    def one(m: Message) -> dict[str, Any]:
        return {"role": m.role, "content": m.content, "reasoning": m.reasoning,
                "reasoning_seconds": m.reasoning_seconds, "tool_calls": m.tool_calls, "status": m.status,
                "stats": m.stats, "attachments": [{"name": a.name, "mime": a.mime,
                                                   "data": base64.b64encode(a.data).decode()} for a in m.attachments]}

    return json.dumps({"format": FORMAT, "version": FORMAT_VERSION, "title": title,
                       "messages": [one(m) for m in messages]}, indent=2, ensure_ascii=False)


def from_json(text: str) -> tuple[str, list[Message]]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ChatImportError(f"not JSON: {err}") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ChatImportError(f"not a rigllm chat export (no \"format\": \"{FORMAT}\")")
    if doc.get("version", 0) > FORMAT_VERSION:
        raise ChatImportError(f"written by a newer rigllm (format version {doc['version']})")
    try:
        messages = [Message(m["role"], m["content"], m.get("reasoning", ""), m.get("reasoning_seconds"),
                            m.get("tool_calls", []), m.get("status", "complete"), m.get("stats", {}),
                            [Attachment(a["name"], a["mime"], base64.b64decode(a["data"]))
                             for a in m.get("attachments", [])])
                    for m in doc["messages"]]
    except (KeyError, TypeError, ValueError) as err:
        raise ChatImportError(f"a message is malformed: {err!r}") from None
    return str(doc.get("title", "Imported chat")), messages


def to_markdown(title: str, messages: list[Message]) -> str:
    parts = [f"# {title}\n"]
    for m in messages:
        body = []
        if m.reasoning:
            body.append(f"<details><summary>Thinking</summary>\n\n{m.reasoning}\n\n</details>\n")
        body.append(m.content)
        body += [f"![{a.name}](data:{a.mime};base64,{base64.b64encode(a.data).decode()})" for a in m.attachments]
        parts.append(f"## {_ROLES.get(m.role, m.role.title())}\n\n" + "\n\n".join(body) + "\n")
    return "\n".join(parts)


def from_markdown(text: str) -> tuple[str, list[Message]]:
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    title = first[2:].strip() if first.startswith("# ") else "Imported chat"
    chunks = _HEADING.split(text)[1:]
    if not chunks:
        raise ChatImportError("no '## User' / '## Assistant' sections found")
    messages = []
    for heading, body in zip(chunks[0::2], chunks[1::2]):
        role = {v: k for k, v in _ROLES.items()}[heading]
        body = body.strip("\n")
        reasoning = ""
        if match := _DETAILS.match(body):
            reasoning, body = match.group(1), body[match.end():]
        images = [Attachment(n, mime, base64.b64decode(data)) for n, mime, data in _IMAGE.findall(body)]
        content = _IMAGE.sub("", body).strip()
        messages.append(Message(role, content, reasoning, attachments=images))
    return title, messages
