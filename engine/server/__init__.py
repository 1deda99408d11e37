"""The OpenAI-compatible HTTP API (`rigllm serve`): wire types, request pipeline, one generation worker."""
