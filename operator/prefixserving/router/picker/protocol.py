"""The Endpoint Picker protocol (gateway-api-inference-extension,
``docs/proposals/004-endpoint-picker-protocol``, v1 as of tag v1.6.0) over Envoy's
``ext_proc`` messages (package ``xds-protos``): its names, and builders of the answers.

- Request, gateway -> picker: the gateway MAY restrict the pick to a subset, a list of
  ``ip:port`` under ``x-gateway-destination-endpoint-subset`` in the filter metadata namespace
  ``envoy.lb.subset_hint`` of the request's ``metadata_context``.
- Answer, picker -> gateway: the picked endpoints as ``ip:port,ip:port,...`` (the first is
  used; a retry goes down the list) in the request header ``x-gateway-destination-endpoint``
  and, with the same value, in the dynamic metadata ``envoy.lb`` under the same key; or an
  immediate response: 503 when no endpoint is eligible, 429 when the request is shed.
- Response, gateway -> picker: the endpoint that served, under
  ``x-gateway-destination-endpoint-served`` in the ``envoy.lb`` filter metadata of the
  response messages' ``metadata_context``.
- Health: the gRPC health services ``liveness``, ``readiness`` and
  ``envoy.service.ext_proc.v3.ExternalProcessor``.

Endpoints are written ``ip:port`` (``[v6]:port``); the router's backends are
``http://ip:port``, so one is the other without the scheme. All functions are pure; each
builds one small message (a few microseconds).
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    BodyMutation,
    BodyResponse,
    CommonResponse,
    HeaderMutation,
    HeadersResponse,
    HttpHeaders,
    ImmediateResponse,
    ProcessingRequest,
    ProcessingResponse,
    StreamedBodyResponse,
    TrailersResponse,
)
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.protobuf.struct_pb2 import Struct

from prefixserving.router.errors import error_body

DESTINATION_KEY = "x-gateway-destination-endpoint"
DESTINATION_NAMESPACE = "envoy.lb"
SERVED_KEY = "x-gateway-destination-endpoint-served"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
LIVENESS = "liveness"
READINESS = "readiness"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
_SCHEME = "http://"
_OVERWRITE = HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD


def endpoint(backend: str) -> str:
    """``http://10.0.0.5:8000`` -> ``10.0.0.5:8000``."""
    return backend.removeprefix(_SCHEME)


def backend(endpoint_: str) -> str:
    """``10.0.0.5:8000`` -> ``http://10.0.0.5:8000``, the router's name of the backend."""
    return _SCHEME + endpoint_


def destination(backends: Iterable[str]) -> str:
    """The protocol's value for an ordered list of backends: ``ip:port,ip:port,...``."""
    return ",".join(endpoint(b) for b in backends)


def headers_of(message: HttpHeaders) -> dict[str, str]:
    """Header name (lower case) -> value; Envoy sends either ``raw_value`` or ``value``. A
    repeated header keeps its first value."""
    out: dict[str, str] = {}
    for header in message.headers.headers:
        value = header.raw_value.decode("latin-1") if header.raw_value else header.value
        out.setdefault(header.key.lower(), value)
    return out


def subset_hint(request: ProcessingRequest) -> frozenset[str] | None:
    """The subset of endpoints the gateway allows, or None when it gives none."""
    namespace = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if namespace is None or SUBSET_KEY not in namespace.fields:
        return None
    values = namespace.fields[SUBSET_KEY].list_value.values
    return frozenset(v.string_value for v in values)


def served_endpoint(request: ProcessingRequest) -> str | None:
    """The endpoint the gateway says served the request, or None."""
    namespace = request.metadata_context.filter_metadata.get(DESTINATION_NAMESPACE)
    if namespace is None or SERVED_KEY not in namespace.fields:
        return None
    return namespace.fields[SERVED_KEY].string_value or None


def _destination_common(value: str) -> CommonResponse:
    # Overwrite, never append: a client must not steer the gateway with its own header.
    header = HeaderValueOption(
        header=HeaderValue(key=DESTINATION_KEY, raw_value=value.encode()), append_action=_OVERWRITE
    )
    return CommonResponse(
        header_mutation=HeaderMutation(set_headers=[header]), clear_route_cache=True
    )


def _destination_metadata(value: str) -> Struct:
    metadata = Struct()
    metadata.update({DESTINATION_NAMESPACE: {DESTINATION_KEY: value}})
    return metadata


def pick_in_headers(value: str) -> ProcessingResponse:
    """The answer to the request headers that carries the pick ``value``."""
    return ProcessingResponse(
        request_headers=HeadersResponse(response=_destination_common(value)),
        dynamic_metadata=_destination_metadata(value),
    )


def pick_in_body(value: str) -> ProcessingResponse:
    """The answer to a buffered request body that carries the pick ``value`` (the gateway
    holds the headers until the buffered body is answered)."""
    return ProcessingResponse(
        request_body=BodyResponse(response=_destination_common(value)),
        dynamic_metadata=_destination_metadata(value),
    )


def continue_request_headers() -> ProcessingResponse:
    return ProcessingResponse(request_headers=HeadersResponse())


def continue_response_headers() -> ProcessingResponse:
    return ProcessingResponse(response_headers=HeadersResponse())


def continue_request_body() -> ProcessingResponse:
    """The answer to one request body chunk in ``STREAMED`` mode: pass it on unchanged."""
    return ProcessingResponse(request_body=BodyResponse())


def continue_response_body() -> ProcessingResponse:
    return ProcessingResponse(response_body=BodyResponse())


def _streamed(chunk: bytes, end_of_stream: bool) -> CommonResponse:
    streamed = StreamedBodyResponse(body=chunk, end_of_stream=end_of_stream)
    return CommonResponse(body_mutation=BodyMutation(streamed_response=streamed))


def echo_request_body(chunk: bytes, end_of_stream: bool) -> ProcessingResponse:
    """The answer to a request body chunk in ``FULL_DUPLEX_STREAMED`` mode, where the gateway
    forwards what the picker sends back: the chunk itself."""
    return ProcessingResponse(request_body=BodyResponse(response=_streamed(chunk, end_of_stream)))


def echo_response_body(chunk: bytes, end_of_stream: bool) -> ProcessingResponse:
    return ProcessingResponse(response_body=BodyResponse(response=_streamed(chunk, end_of_stream)))


def continue_request_trailers() -> ProcessingResponse:
    return ProcessingResponse(request_trailers=TrailersResponse())


def continue_response_trailers() -> ProcessingResponse:
    return ProcessingResponse(response_trailers=TrailersResponse())


def immediate(
    status: int,
    message: str,
    *,
    param: str | None = None,
    retry_after_s: int | None = None,
) -> ProcessingResponse:
    """An answer the gateway sends to the client instead of forwarding the request: an
    OpenAI-style JSON error (``router.errors``), with ``Retry-After`` when given."""
    headers = [
        HeaderValueOption(header=HeaderValue(key="content-type", raw_value=b"application/json"))
    ]
    if retry_after_s is not None:
        headers.append(
            HeaderValueOption(
                header=HeaderValue(key="retry-after", raw_value=str(retry_after_s).encode())
            )
        )
    body = json.dumps(error_body(status, message, param)).encode()
    return ProcessingResponse(
        immediate_response=ImmediateResponse(
            status=HttpStatus(code=status),  # type: ignore[arg-type]
            headers=HeaderMutation(set_headers=headers),
            body=body,
            details=f"prefixserving_picker_{status}",
        )
    )
