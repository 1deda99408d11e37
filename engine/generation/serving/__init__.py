"""Serving machinery without HTTP: the thread that owns the backend (`worker`), the scheduler that decodes
several requests together over its slots, generation jobs and their events, the loaded model's prompt
preparation (`model_service`, `multimodal_chat`) and the request-level pieces they use (stop strings, host
picking, owner tasks, request errors). engine.server puts HTTP on top; the desktop app uses it directly.
"""
