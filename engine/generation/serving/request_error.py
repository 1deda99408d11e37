"""`APIError`: a request the serving layer refuses, with the HTTP status and OpenAI error fields to answer with.

It is raised below HTTP (the worker refuses a job with images for a backend without a tower; the
server's request checks refuse bad fields), so it lives here without any web framework;
engine.server.api_errors turns it into a JSON response.
"""

from __future__ import annotations


class APIError(Exception):
    """A request we refuse, with the status code and OpenAI error fields to send back."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers  # e.g. Retry-After on a 503
