"""GGUF reading, validation, ModelConfig and the HF converter."""
