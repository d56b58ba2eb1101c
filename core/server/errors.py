"""The server's refusals, in the shape of the API the request spoke (:func:`dialect_of` its path): OpenAI's
``{"error": {"message", "type", "param", "code"}}``, Ollama's ``{"error": "message"}`` and Anthropic's
``{"type": "error", "error": {"type", "message"}}``."""

from __future__ import annotations

from typing import Any

#: the ``error.type`` OpenAI gives each status
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
               415: "invalid_request_error", 421: "invalid_request_error", 429: "rate_limit_error",
               500: "server_error", 501: "not_supported_error", 503: "unavailable_error"}


class ApiError(Exception):
    """A request the server refuses: HTTP ``status`` with an OpenAI-shaped body (:meth:`body`)."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": ERROR_TYPES.get(self.status, "invalid_request_error"),
                          "param": self.param, "code": self.code}}


#: the ``error.type`` Anthropic gives each status
ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                   404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 500: "api_error",
                   503: "overloaded_error"}


def dialect_of(path: str) -> str:
    """The API a request path belongs to: "ollama" (``/api/…`` and ``/``), "anthropic" (``/v1/messages…``) or
    "openai" (the rest)."""
    if path == "/" or path.startswith("/api/"):
        return "ollama"
    if path.startswith("/v1/messages"):
        return "anthropic"
    return "openai"


def error_body(exc: ApiError, dialect: str) -> dict[str, Any]:
    """``exc`` as ``dialect``'s error body."""
    if dialect == "ollama":
        return {"error": exc.message}
    if dialect == "anthropic":
        return {"type": "error", "error": {"type": ANTHROPIC_TYPES.get(exc.status, "invalid_request_error"),
                                           "message": exc.message}}
    return exc.body()


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    """A 400: the request is malformed or asks for something this server does not do."""
    return ApiError(400, message, param=param, code=code)
