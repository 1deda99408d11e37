"""The one exception type the CLI turns into a clear one-line message and a non-zero exit.

Anything the user can cause (a bad file, a model that does not fit, a malformed request) raises
`RigllmError` with a message that names the problem; everything else is a bug and keeps its traceback.
"""


class RigllmError(Exception):
    """A user-facing error: `str(err)` is a complete one-line explanation."""


class ModelFileError(RigllmError):
    """The model file is missing, unreadable, not a GGUF, or not a supported Qwen3.5/3.6 model."""
