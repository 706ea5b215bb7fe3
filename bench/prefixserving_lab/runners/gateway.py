"""The gateway's side of the endpoint picker's ext_proc stream: the messages Envoy's ext_proc
filter sends (request headers, body chunks, trailers, response headers with the endpoint that
served, response body chunks), the pick read back from an answer, and the credentials that
trust a picker's self-signed certificate. The picker tests and ``bench/picker_latency.py``
drive the picker with these; no gateway is involved.

Envoy sends header values as ``raw_value`` bytes and pseudo-headers (``:method``, ``:path``,
``:authority``, ``:status``) as headers; so do these. Cost: one protobuf message per call.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterable

import grpc
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue, Metadata
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    HttpBody,
    HttpHeaders,
    HttpTrailers,
    ProcessingRequest,
    ProcessingResponse,
    ProtocolConfiguration,
)
from google.protobuf.struct_pb2 import Struct

from prefixserving.router.picker import protocol

FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED
CHAT = "/v1/chat/completions"
# The name the picker's self-signed certificate is issued to.
CERTIFICATE_NAME = "localhost"


def modes(
    request: int = FULL_DUPLEX, response: int = FULL_DUPLEX, body_first: bool = False
) -> ProtocolConfiguration:
    """The body modes the filter announces in its first message."""
    return ProtocolConfiguration(
        request_body_mode=request,  # type: ignore[arg-type]
        response_body_mode=response,  # type: ignore[arg-type]
        send_body_without_waiting_for_header_response=body_first,
    )


def request_headers(
    path: str = CHAT,
    *,
    method: str = "POST",
    headers: Iterable[tuple[str, str]] = (("content-type", "application/json"),),
    end_of_stream: bool = False,
    subset: Iterable[str] | None = None,
    config: ProtocolConfiguration | None = None,
) -> ProcessingRequest:
    """The first message of a stream; ``subset``: the gateway's ``envoy.lb.subset_hint``."""
    items = [(":method", method), (":path", path), (":authority", "gateway"), *headers]
    message = ProcessingRequest(
        request_headers=HttpHeaders(
            headers=HeaderMap(headers=[HeaderValue(key=k, raw_value=v.encode()) for k, v in items]),
            end_of_stream=end_of_stream,
        )
    )
    if subset is not None:
        hint = Struct()
        hint.update({protocol.SUBSET_KEY: list(subset)})
        message.metadata_context.filter_metadata[protocol.SUBSET_NAMESPACE].CopyFrom(hint)
    if config is not None:
        message.protocol_config.CopyFrom(config)
    return message


def request_body(chunk: bytes, end_of_stream: bool = False) -> ProcessingRequest:
    return ProcessingRequest(request_body=HttpBody(body=chunk, end_of_stream=end_of_stream))


def request_trailers() -> ProcessingRequest:
    return ProcessingRequest(request_trailers=HttpTrailers())


def response_headers(status: int = 200, served: str | None = None) -> ProcessingRequest:
    """The response's headers; ``served``: the endpoint that answered, in the metadata the
    gateway reports it with (``x-gateway-destination-endpoint-served``)."""
    message = ProcessingRequest(
        response_headers=HttpHeaders(
            headers=HeaderMap(
                headers=[
                    HeaderValue(key=":status", raw_value=str(status).encode()),
                    HeaderValue(key="content-type", raw_value=b"text/event-stream"),
                ]
            )
        ),
        metadata_context=Metadata(),
    )
    if served is not None:
        metadata = Struct()
        metadata.update({protocol.SERVED_KEY: served})
        message.metadata_context.filter_metadata[protocol.DESTINATION_NAMESPACE].CopyFrom(metadata)
    return message


def response_body(chunk: bytes, end_of_stream: bool = False) -> ProcessingRequest:
    return ProcessingRequest(response_body=HttpBody(body=chunk, end_of_stream=end_of_stream))


def chunks(raw: bytes, size: int) -> list[bytes]:
    """``raw`` cut into ``size``-byte body chunks (one empty chunk for an empty body)."""
    return [raw[i : i + size] for i in range(0, len(raw), size)] or [b""]


def picked(answer: ProcessingResponse) -> tuple[str, str]:
    """(header value, dynamic metadata value) of a pick in a headers or body answer."""
    which = answer.WhichOneof("response")
    common = getattr(answer, which).response
    (option,) = common.header_mutation.set_headers
    assert option.header.key == protocol.DESTINATION_KEY
    metadata = answer.dynamic_metadata.fields[protocol.DESTINATION_NAMESPACE].struct_value
    return option.header.raw_value.decode(), metadata.fields[protocol.DESTINATION_KEY].string_value


def trusting_credentials(
    host: str, port: int
) -> tuple[grpc.ChannelCredentials, list[tuple[str, str]]]:
    """Credentials and channel options that trust the certificate the picker at ``host:port``
    serves (its self-signed one), as a gateway given that certificate would."""
    certificate = ssl.get_server_certificate((host, port)).encode()
    credentials = grpc.ssl_channel_credentials(root_certificates=certificate)
    return credentials, [("grpc.ssl_target_name_override", CERTIFICATE_NAME)]
