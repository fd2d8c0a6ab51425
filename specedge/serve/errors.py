"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}} with the matching HTTP status."""

from __future__ import annotations

TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
         405: "invalid_request_error", 408: "timeout_error", 413: "invalid_request_error",
         429: "rate_limit_error", 500: "server_error", 503: "server_error"}


class APIError(Exception):
    """An error answered to the client; the server goes on."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None, type: str | None = None):  # noqa: A002 - OpenAI's field name
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}
        self.type = type or TYPES.get(status, "invalid_request_error")

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, param, code)


def unsupported(param: str, value, why: str = "") -> APIError:
    """A parameter this server cannot honour at a non-default value: refused, never ignored."""
    shown = repr(value) if not isinstance(value, str) else f"'{value}'"
    return APIError(400, f"'{param}' = {shown} is not supported by this server{why}", param, "unsupported_parameter")
