"""Per-model profiles: how a model was last loaded (backend, cards, split, context, KV) and how it was
last talked to (sampling, max tokens, thinking, speculation, system preset, raw prompt mode).

Kept in QSettings under `profiles/<key>` as JSON (a key per model file, so a 9B and a 27B each come
back as they were left), plus `last_model` and `api_server_on` so a restart reopens the last model
with its profile and the API server as it was. Nothing here is Qt beyond the QSettings it writes.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from PySide6.QtCore import QSettings

from app.settings import AppSettings

CHAT_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty",
               "max_tokens", "thinking", "speculative", "system_preset", "raw_prompt")
DEMO = ""  # the `last_model` value that names the generated demo model


@dataclass
class ModelProfile:
    backend: str = "auto"
    cards: tuple[int, ...] = ()
    split: tuple[int, ...] | None = None
    context: int | None = None
    kv_format: str = "f16"
    chat: dict[str, Any] = field(default_factory=dict)  # the CHAT_FIELDS of AppSettings last used with it

    def with_chat(self, settings: AppSettings) -> AppSettings:
        """`settings` with this model's remembered chat fields (unknown or mistyped ones are skipped)."""
        known: dict[str, Any] = {}
        for name, value in self.chat.items():
            if name not in CHAT_FIELDS:
                continue
            default = getattr(settings, name)
            if isinstance(default, float) and type(value) is int:  # JSON wrote 1.0 as 1
                value = float(value)
            if type(value) is type(default):
                known[name] = value
        return replace(settings, **known)


def chat_part(settings: AppSettings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in CHAT_FIELDS}


def _key(model: str) -> str:
    return "profiles/" + hashlib.sha256(model.encode("utf-8")).hexdigest()[:20]


class ModelProfiles:
    def __init__(self, store: QSettings):
        self.store = store

    def get(self, model: str) -> ModelProfile | None:
        """The profile of the model file at `model` (DEMO for the demo model), None when there is none."""
        raw = self.store.value(_key(model))
        if not raw:
            return None
        try:
            data = json.loads(str(raw))
            names = {f.name for f in fields(ModelProfile)}
            profile = ModelProfile(**{k: v for k, v in data.items() if k in names})
        except (TypeError, ValueError):
            return None
        profile.cards = tuple(profile.cards)
        profile.split = tuple(profile.split) if profile.split is not None else None
        return profile

    def put(self, model: str, profile: ModelProfile) -> None:
        self.store.setValue(_key(model), json.dumps(asdict(profile)))
        self.store.sync()

    def remember_chat(self, model: str, settings: AppSettings) -> None:
        profile = self.get(model) or ModelProfile()
        profile.chat = chat_part(settings)
        self.put(model, profile)

    @property
    def last_model(self) -> str | None:
        """The model loaded when the app last closed (DEMO for the demo model), None before any."""
        value = self.store.value("last_model")
        return None if value is None else str(value)

    @last_model.setter
    def last_model(self, model: str) -> None:
        self.store.setValue("last_model", model)

    @property
    def api_server_on(self) -> bool:
        return str(self.store.value("api_server_on", "false")).lower() in ("true", "1")

    @api_server_on.setter
    def api_server_on(self, on: bool) -> None:
        self.store.setValue("api_server_on", on)
        self.store.sync()
