"""OpenAI-style error answers: ``{"error": {"message", "type", "param", "code"}}``, as HTTP
responses of the router and as the bodies of the endpoint picker's immediate responses."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    408: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    502: "upstream_error",
    503: "service_unavailable",
}


def error_body(status: int, message: str, param: str | None = None) -> dict[str, Any]:
    """The error object the OpenAI client libraries understand."""
    return {
        "error": {
            "message": message,
            "type": _TYPES.get(status, "server_error"),
            "param": param,
            "code": status,
        }
    }


def error_response(
    status: int,
    message: str,
    *,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """A JSON error answer the OpenAI client libraries understand."""
    body = error_body(status, message, param)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))
