"""User settings: declared with types and defaults, stored in QSettings under a schema version.

Declaring them in one dataclass (the Orange `Setting` idea) keeps the settings dialog, the
generation request and persistence in agreement; a stored value of the wrong type or out of range
falls back to the default instead of breaking start-up. `SETTINGS_VERSION` is written with the
values; `migrate` upgrades older layouts in place.

System-prompt presets: the built-in ones (`DEFAULT_PRESETS`) live in the code and are read-only; the
user's own are stored apart from them (`user_presets`), so no edit can overwrite a built-in.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from PySide6.QtCore import QSettings

from engine.errors import RigllmError
from engine.generation.sampler import SamplingParams
from engine.hub.library import default_models_dir

SETTINGS_VERSION = 3
THEMES = ("system", "dark", "light")
DEFAULT_PRESETS = {
    "Helpful assistant": "You are a helpful assistant.",
    "Concise": "Answer briefly and precisely.",
    "Coder": "You are an expert programmer. Answer with working code and short explanations.",
}
DEFAULT_PRESET = "Helpful assistant"
_STORED_AS = {"presets": "user_presets"}  # field -> QSettings key where they differ


@dataclass
class AppSettings:
    temperature: float = 0.7
    top_p: float = 0.8
    top_k: int = 20
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    max_tokens: int = 1024
    thinking: bool = True
    speculative: bool = True  # speculative decoding with the model's MTP head, when it has one
    raw_prompt: bool = False  # no chat template: the conversation's text as written (base models, trained fixtures)
    system_preset: str = DEFAULT_PRESET
    presets: dict[str, str] = field(default_factory=dict)  # the user's own presets (the built-ins are DEFAULT_PRESETS)
    theme: str = "system"
    api_port: int = 8765
    rig_host: str = ""  # the last rig connected to ("Connect to rig"); its key is in the keyring
    rig_port: int = 8000
    models_dir: str = field(default_factory=lambda: str(default_models_dir()))  # the library's folder (issue 31)
    hub_proxy: str = ""  # http://host:port for the Hub's traffic; "" = the environment's HTTPS_PROXY, if any

    def sampling(self) -> SamplingParams:
        """Raises RigllmError (one line) for an invalid combination, which the dialog shows."""
        return SamplingParams(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                              repetition_penalty=self.repetition_penalty, presence_penalty=self.presence_penalty,
                              frequency_penalty=self.frequency_penalty)

    @property
    def system_prompt(self) -> str:
        if self.system_preset in DEFAULT_PRESETS:
            return DEFAULT_PRESETS[self.system_preset]
        return self.presets.get(self.system_preset, "")

    def validate(self) -> None:
        self.sampling()
        if self.max_tokens < 1:
            raise RigllmError("max tokens must be at least 1")
        if self.theme not in THEMES:
            raise RigllmError(f"theme must be one of {', '.join(THEMES)}")
        if not 1 <= self.api_port <= 65535:
            raise RigllmError("the API port must be in 1-65535")
        if not 1 <= self.rig_port <= 65535:
            raise RigllmError("the rig's port must be in 1-65535")
        if set(self.presets) & set(DEFAULT_PRESETS):
            raise RigllmError("a preset of your own cannot take a built-in preset's name")
        if not self.models_dir.strip():
            raise RigllmError("the models folder must be set")
        if self.hub_proxy and not self.hub_proxy.startswith(("http://", "https://", "socks5://")):
            raise RigllmError("the Hub proxy must be a URL like http://host:port")


def migrate(store: QSettings) -> None:
    """Version 1 kept the system prompt as one string under `system_prompt`; it becomes a user preset.
    Version 2 kept built-in and user presets together under `presets`, so clearing a built-in's text
    overwrote it: the built-ins come back, and a built-in the user had really rewritten is kept as their
    own "<name> (edited)"."""
    version = int(store.value("version", 0) or 0)
    if version == 1 and store.contains("system_prompt"):
        store.setValue("user_presets", {"Custom": str(store.value("system_prompt"))})
        store.setValue("system_preset", "Custom")
        store.remove("system_prompt")
    if version == 2 and store.contains("presets"):
        user: dict[str, str] = {}
        for name, text in dict(store.value("presets") or {}).items():
            name, text = str(name), str(text)
            if name not in DEFAULT_PRESETS:
                user[name] = text
            elif text.strip() and text != DEFAULT_PRESETS[name]:
                user[f"{name} (edited)"] = text
                if store.value("system_preset") == name:
                    store.setValue("system_preset", f"{name} (edited)")
        store.setValue("user_presets", user)
        store.remove("presets")
    store.setValue("version", SETTINGS_VERSION)


def load(store: QSettings) -> AppSettings:
    migrate(store)
    defaults = AppSettings()
    values: dict[str, Any] = {}
    for f in fields(AppSettings):
        default = getattr(defaults, f.name)
        raw = store.value(_STORED_AS.get(f.name, f.name), default)
        try:
            if isinstance(default, bool):
                value = raw if isinstance(raw, bool) else str(raw).lower() in ("true", "1")
            elif isinstance(default, dict):
                value = {str(k): str(v) for k, v in dict(raw).items()}
            else:
                value = type(default)(raw)
        except (TypeError, ValueError):
            value = default
        values[f.name] = value
    settings = AppSettings(**values)
    try:
        settings.validate()
    except RigllmError:
        return defaults
    return settings


def save(store: QSettings, settings: AppSettings) -> None:
    for name, value in asdict(settings).items():
        store.setValue(_STORED_AS.get(name, name), value)
    store.setValue("version", SETTINGS_VERSION)
    store.sync()
