"""rigllm's PySide6 desktop app: chat, model loading with a per-card memory budget, rig monitor, API toggle."""
