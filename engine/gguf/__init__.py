"""GGUF reading, validation, ModelConfig, HF converter and synthetic model writers."""
