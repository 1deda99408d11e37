"""rigllm engine: model loading, backends, generation, server and CLI (never imports Qt)."""
