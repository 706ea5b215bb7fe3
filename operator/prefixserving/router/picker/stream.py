"""One ``Process`` stream of the endpoint picker: one HTTP request, from its headers to the end
of its response.

**Algorithm** (:class:`PickStream`; :meth:`~PickStream.handle` turns each message from the
gateway into the answers to send, in order; the gateway's processing mode comes from the
``protocol_config`` of the first message, ``FULL_DUPLEX_STREAMED`` when absent, which is the
mode the gateways configure for an InferencePool):

1. *Request headers.* A keyed path (``POST /v1/completions``, ``/v1/chat/completions``,
   ``router.app.KEYED_PATHS``) whose body will come before the answer is due
   (``FULL_DUPLEX_STREAMED``; ``STREAMED`` with ``send_body_without_waiting_for_header_response``)
   waits for it; a ``Content-Type`` other than JSON answers 415, a ``Content-Length`` over
   the limit 413, at once. With ``BUFFERED`` modes the headers are passed at once and the pick
   goes into the body's answer. Any other request (no body, another path, a mode that sends
   no body first) is picked now, without a key (the policy balances by load).
2. *Request body.* Chunks go into a :class:`~prefixserving.router.streamed_body.StreamedBody`
   (which decodes only what the key reads) and are held, not answered: the gateway wants the
   headers' answer first. At the end of the body (its last chunk, or the trailers): the key
   (``router.prefix_hashing``, the HTTP router's functions), then :meth:`Router.decide
   <prefixserving.router.app.Router.decide>` (hygiene and hot prefixes, the policy's decision
   with the scraped loads) among the healthy backends, cut to the gateway's subset hint.
   With no healthy backend the pick waits for one up to the router's ``no_engine_hold_s``
   (``router.hold``, the HTTP router's hold and held-request gauge), then answers 503.
   The answer names the decision's backend and fallbacks in the header and the dynamic
   metadata (``protocol.pick_in_headers``), then the held chunks follow, echoed in
   ``FULL_DUPLEX_STREAMED`` (the gateway forwards what comes back), passed in ``STREAMED``.
   Body errors answer 400 (413 over the size limit) with the router's messages; no eligible
   backend 503; every eligible engine with ``shed_waiting_requests`` or more waiting
   requests 429 (off at 0). Both with ``Retry-After``.
3. *Response.* Its headers carry the endpoint that served: when a retry of the gateway landed
   on a fallback, the in-flight count moves there, the policy is told
   (``RoutingPolicy.on_served``) and ``retries_total{reason="gateway"}`` counts it. Response
   body chunks are echoed or passed per the response mode.
4. *End* (the gateway closes or cancels the stream): the in-flight count is released and
   ``requests_total`` counts the outcome: the response's status class once the response
   ended (its last body chunk or trailers; its headers when the gateway sends no response
   body), ``rejected`` (4xx of the picker), ``shed`` (429), ``no_backend`` (503), or
   ``disconnected`` (the stream ended before the response did: the client went away; an
   engine that fails answers through the gateway with a 5xx status).

The backend's in-flight count (``BackendPool.acquire``) is held from the pick to the end of
the stream, so the load the policy sees counts the requests in flight through this picker as
the HTTP router counts its own. ``added_latency_seconds`` observes the time from the moment
the picker has what it needs (headers, or the body's last chunk) to its answer.

**Cost** per request: the body reader's (``router.streamed_body``), the key's hashes, one
policy decision, one answer message per message received plus one for the pick; a held pick
costs nothing while it waits (``router.hold``).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass
from typing import Any

from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import ProcessingRequest, ProcessingResponse

from prefixserving import constants
from prefixserving.router import prefix_hashing
from prefixserving.router.app import KEYED_PATHS, NO_ENGINE_MESSAGE, KeyFunction, Router
from prefixserving.router.picker import protocol
from prefixserving.router.policies.base import Decision
from prefixserving.router.policies.load import all_waiting_at_least
from prefixserving.router.streamed_body import BodyTooLarge, StreamedBody

Mode = ProcessingMode.BodySendMode
_FULL_DUPLEX = ProcessingMode.FULL_DUPLEX_STREAMED
_STREAMED = ProcessingMode.STREAMED
_BUFFERED = frozenset({ProcessingMode.BUFFERED, ProcessingMode.BUFFERED_PARTIAL})
_JSON_TYPES = ("application/json",)


@dataclass(frozen=True, slots=True)
class PickerConfig:
    """``shed_waiting_requests``: answer 429 when every eligible engine has at least this many
    requests waiting (0: never shed)."""

    shed_waiting_requests: int = constants.PICKER_SHED_WAITING_REQUESTS


class Outcome(enum.StrEnum):
    """How a stream ended, besides a response's status class."""

    REJECTED = "rejected"
    SHED = "shed"
    NO_BACKEND = "no_backend"
    DISCONNECTED = "disconnected"


def _status_outcome(status: int) -> str:
    if status < 400:
        return "ok"
    return "client_error" if status < 500 else "server_error"


def _json_content(content_type: str | None) -> bool:
    if content_type is None:
        return True
    return content_type.split(";", 1)[0].strip().lower() in _JSON_TYPES


class PickStream:
    """The state of one stream (see the module docstring)."""

    def __init__(self, router: Router, config: PickerConfig) -> None:
        self.router = router
        self.config = config
        self.request_mode: int = _FULL_DUPLEX
        self.response_mode: int = _FULL_DUPLEX
        self.body_before_answer = True
        self.finished = False  # an immediate response was sent: nothing more to do
        self.decision: Decision | None = None
        self.serving: str | None = None  # the backend holding this request's in-flight count
        self.outcome: str | None = None
        self.status: int | None = None
        self._first = True
        self._key_function: KeyFunction | None = None
        self._body: StreamedBody | None = None
        self._held: list[bytes] = []
        self._subset: frozenset[str] | None = None
        self._response_done = False

    # Dispatch -------------------------------------------------------------------------------

    async def handle(self, request: ProcessingRequest) -> list[ProcessingResponse]:
        """The answers to one message from the gateway, in the order to send them (awaits only
        while a pick is held for a Ready engine)."""
        if self._first:
            self._first = False
            self._read_modes(request)
        kind = request.WhichOneof("request")
        if kind == "request_headers":
            return await self._request_headers(request)
        if kind == "request_body":
            body = request.request_body
            return await self._request_body(body.body, body.end_of_stream)
        if kind == "request_trailers":
            return await self._request_trailers()
        if kind == "response_headers":
            return self._response_headers(request)
        if kind == "response_body":
            body = request.response_body
            return self._response_body(body.body, body.end_of_stream)
        if kind == "response_trailers":
            self._response_done = True
            return [protocol.continue_response_trailers()]
        return []

    def _read_modes(self, request: ProcessingRequest) -> None:
        if not request.HasField("protocol_config"):
            return
        config = request.protocol_config
        self.request_mode = config.request_body_mode
        self.response_mode = config.response_body_mode
        self.body_before_answer = self.request_mode == _FULL_DUPLEX or (
            self.request_mode == _STREAMED and config.send_body_without_waiting_for_header_response
        )

    # Request --------------------------------------------------------------------------------

    async def _request_headers(self, request: ProcessingRequest) -> list[ProcessingResponse]:
        ready_at = time.perf_counter()
        message = request.request_headers
        headers = protocol.headers_of(message)
        self._subset = protocol.subset_hint(request)
        path = headers.get(":path", "").split("?", 1)[0]
        key_function = KEYED_PATHS.get(path) if headers.get(":method") == "POST" else None
        has_body = not message.end_of_stream
        if key_function is None or not has_body:
            return [await self._pick(None, {}, ready_at, in_body=False)]
        if not _json_content(headers.get("content-type")):
            return [
                self._reject(
                    415,
                    f"Content-Type {headers['content-type']!r} is not JSON; send the body as "
                    "JSON with the header 'Content-Type: application/json'",
                )
            ]
        limit = self.router.config.max_body_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return [self._reject(413, f"request body is over the limit of {limit} bytes")]
        if self.request_mode in _BUFFERED:
            self._start_body(key_function)
            return [protocol.continue_request_headers()]
        if not self.body_before_answer:  # the body comes only after the answer: no key
            return [await self._pick(None, {}, ready_at, in_body=False)]
        self._start_body(key_function)
        return []

    def _start_body(self, key_function: KeyFunction) -> None:
        self._key_function = key_function
        self._body = StreamedBody(self.router.key_config, self.router.config.max_body_bytes)

    async def _request_body(self, chunk: bytes, end_of_stream: bool) -> list[ProcessingResponse]:
        if self._body is None:  # picked already: pass the chunk on
            return [self._pass_request_chunk(chunk, end_of_stream)]
        try:
            self._body.feed(chunk)
        except BodyTooLarge as error:
            return [self._reject(413, str(error))]
        except prefix_hashing.RequestError as error:
            return [self._reject(400, str(error), error.param)]
        if self.request_mode not in _BUFFERED:  # echoed or passed after the pick
            self._held.append(chunk)
        if not end_of_stream and self.request_mode != ProcessingMode.BUFFERED_PARTIAL:
            return []
        if self.request_mode == ProcessingMode.BUFFERED_PARTIAL and not end_of_stream:
            # the gateway's buffer limit cut the body: what came is all there is to pick by
            self._body = None
            return [await self._pick(None, {}, time.perf_counter(), in_body=True)]
        return await self._end_of_body(last_chunk_ends=True)

    async def _request_trailers(self) -> list[ProcessingResponse]:
        if self._body is None:
            answers = []
        else:
            answers = await self._end_of_body(last_chunk_ends=False)
        if self.finished:
            return answers
        return [*answers, protocol.continue_request_trailers()]

    async def _end_of_body(self, last_chunk_ends: bool) -> list[ProcessingResponse]:
        """The body is complete: key, pick, then the held chunks."""
        assert self._body is not None and self._key_function is not None
        ready_at = time.perf_counter()
        body, self._body = self._body, None
        try:
            view = body.finish()
            key = self._key_function(view, self.router.key_config)
        except prefix_hashing.RequestError as error:
            return [self._reject(400, str(error), error.param)]
        in_body = self.request_mode in _BUFFERED
        answers = [await self._pick(key, view, ready_at, in_body=in_body)]
        if self.finished or in_body:
            return answers
        held, self._held = self._held, []
        for number, chunk in enumerate(held, start=1):
            answers.append(self._pass_request_chunk(chunk, last_chunk_ends and number == len(held)))
        return answers

    def _pass_request_chunk(self, chunk: bytes, end_of_stream: bool) -> ProcessingResponse:
        if self.request_mode == _FULL_DUPLEX:
            return protocol.echo_request_body(chunk, end_of_stream)
        return protocol.continue_request_body()

    # Picking --------------------------------------------------------------------------------

    async def _eligible(self) -> tuple[str, ...]:
        """The healthy backends (held for up to ``no_engine_hold_s`` while there are none), cut
        to the gateway's subset hint."""
        healthy = await self.router.hold.backends()
        if self._subset is None:
            return healthy
        return tuple(b for b in healthy if protocol.endpoint(b) in self._subset)

    async def _pick(
        self,
        key: prefix_hashing.PrefixKey | None,
        body: dict[str, Any],
        ready_at: float,
        *,
        in_body: bool,
    ) -> ProcessingResponse:
        router = self.router
        eligible = await self._eligible()
        if self._subset is not None and not eligible:
            router.decide(key, body, ())  # hygiene and hot prefixes still see the request
            return self._unavailable(
                "none of the endpoints in the gateway's subset hint "
                f"({', '.join(sorted(self._subset)) or 'empty'}) is a ready engine"
            )
        shed = self.config.shed_waiting_requests
        if shed and eligible and all_waiting_at_least(router.pool.loads(), eligible, shed):
            router.decide(key, body, ())
            self.outcome = Outcome.SHED
            self.finished = True
            return protocol.immediate(
                429,
                f"every engine has {shed} or more requests waiting; retry shortly",
                retry_after_s=router.config.retry_after_s,
            )
        decision = router.decide(key, body, eligible)
        if decision is None:
            return self._unavailable(NO_ENGINE_MESSAGE)
        self.decision = decision
        self.serving = decision.backend
        router.pool.acquire(decision.backend)
        value = protocol.destination(decision.candidates)
        answer = protocol.pick_in_body(value) if in_body else protocol.pick_in_headers(value)
        router.metrics.added_latency.observe(time.perf_counter() - ready_at)
        return answer

    def _unavailable(self, message: str) -> ProcessingResponse:
        self.outcome = Outcome.NO_BACKEND
        self.finished = True
        return protocol.immediate(503, message, retry_after_s=self.router.config.retry_after_s)

    def _reject(self, status: int, message: str, param: str | None = None) -> ProcessingResponse:
        self.outcome = Outcome.REJECTED
        self.finished = True
        self._body = None
        self._held = []
        return protocol.immediate(status, message, param=param)

    # Response -------------------------------------------------------------------------------

    def _response_headers(self, request: ProcessingRequest) -> list[ProcessingResponse]:
        headers = protocol.headers_of(request.response_headers)
        status = headers.get(":status", "")
        self.status = int(status) if status.isdigit() else None
        if request.response_headers.end_of_stream or self.response_mode == ProcessingMode.NONE:
            self._response_done = True  # no body follows, or none is sent to the picker
        served = protocol.served_endpoint(request)
        if served is not None and self.decision is not None:
            self._follow(protocol.backend(served))
        return [protocol.continue_response_headers()]

    def _follow(self, served: str) -> None:
        """The gateway says ``served`` answered: move the in-flight count there."""
        if served == self.serving or self.decision is None:
            return
        pool = self.router.pool
        if self.serving is not None:
            pool.release(self.serving)
        pool.acquire(served)
        self.serving = served
        self.router.policy.on_served(self.decision, served)
        self.router.metrics.retries.inc("gateway")

    def _response_body(self, chunk: bytes, end_of_stream: bool) -> list[ProcessingResponse]:
        if end_of_stream:
            self._response_done = True
        if self.response_mode == _FULL_DUPLEX:
            return [protocol.echo_response_body(chunk, end_of_stream)]
        return [protocol.continue_response_body()]

    # End ------------------------------------------------------------------------------------

    def close(self) -> None:
        """The stream ended (closed or cancelled by the gateway): release the in-flight count
        and count the outcome. Called once."""
        metrics = self.router.metrics
        if self.serving is not None:
            self.router.pool.release(self.serving)
        if self.outcome is not None:
            metrics.requests.inc("", self.outcome)
        elif self.status is not None and self._response_done:
            metrics.requests.inc(self.serving or "", _status_outcome(self.status))
        else:  # the client went away before the response ended
            metrics.requests.inc(self.serving or "", Outcome.DISCONNECTED)
