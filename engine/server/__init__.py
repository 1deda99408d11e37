"""The OpenAI-compatible HTTP front end (`rigllm serve`): routes, wire types, request checks, error mapping,
access and admin. The worker and scheduler it drives are engine.generation.serving (no HTTP there)."""
