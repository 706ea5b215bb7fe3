"""Backend discovery, load scraping and passive health.

**Discovery**: a static list of base URLs (local use), or the DNS name of the engine headless
Service (Kubernetes). A headless Service lists only Ready pods, so a replica still warming up
gets no traffic. The name is resolved every ``dns_interval_s`` through an injectable
:data:`Resolver` (default: the system resolver); a name with no records means no backends,
any other resolver error keeps the last known list.

**Load**: every ``scrape_interval_s`` each backend's ``/metrics`` is fetched (timeout
``scrape_timeout_s``) and three vLLM series are read: ``vllm:num_requests_waiting`` (summed over
engines), ``vllm:kv_cache_usage_perc`` (the largest) and ``vllm:num_requests_running`` (summed),
in one pass (:func:`parse_load`). With the router's own in-flight count they form the
:class:`BackendLoad` the policies see.

**Health** (passive): a failure before the answer's first byte (a connection or read error,
a timeout, a 5xx status; ``router.proxy``) counts; after
``eject_after_failures`` consecutive failures the backend is ejected for ``eject_base_s``,
doubled at each further ejection up to ``eject_max_s``. Once the time is up the scrape loop
probes ``/health``; success brings the backend back (a probe failure ejects it again). A
success on real traffic resets the backoff. While no backend is healthy every ejected one is
probed at each scrape, its time up or not: the backoff keeps traffic off a failing backend,
and with none healthy there is no traffic to protect, only requests held for the first engine
that answers (scale from zero: an engine that starts behind a fixed ``--backend`` URL is found
within one scrape interval, not at the end of a 30 s backoff). Such an early probe that fails
leaves the ejection as it was.

**Identity** (with ``PoolConfig.identity_port``, the engine pods' warm-up sidecar port): at
each discovery refresh (every ``dns_interval_s``, for a static list too) each member without
a known routing identity is asked ``GET http://HOST:IDENTITY_PORT/identity`` (timeout
``scrape_timeout_s``). ``200 {"identity": "<name>"}`` with a non-empty string is remembered for
that URL; anything else (``{"identity": null}``, ``503`` while the sidecar has not resolved it,
another status, a body that is not that JSON, a connection error or a timeout) leaves the URL
without one, and it is asked again at the next refresh. A URL's identity is forgotten when the
URL leaves the members (a later pod may get the same IP). :meth:`BackendPool.identities` gives
them to the policies (``RoutingContext.identities``), which rank a backend by its identity
(its URL without one): a pod that replaced another in a rolling update reports that pod's
identity and takes its place in every ranking, so no other key moves. Until a router has
asked, it ranks a new pod by its URL, so router replicas may disagree on that pod's keys for
at most about one refresh interval (plus the request's timeout) after it joins, provided its
sidecar has resolved its identity by then (the pod is in DNS only once Ready, after its
warm-up). Without ``identity_port`` nothing is asked and every backend is ranked by its URL.

**Cost**: one request per backend per scrape interval; parsing reads the exposition line by
line, looks only at ``vllm:`` lines and parses the values of the three series only. Identity:
one request per new backend (more only while its sidecar does not answer one); the identities
are copied only when one is learned or forgotten, never per routing decision.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import aiohttp

from prefixserving import constants
from prefixserving.router.policies.base import BackendLoad
from prefixserving.router.upstream import backend_address

log = logging.getLogger(__name__)

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""``(host, port) -> IP addresses``; raise ``LookupError`` when the name has no records."""

WAITING_METRIC = "vllm:num_requests_waiting"
KV_USAGE_METRIC = "vllm:kv_cache_usage_perc"
RUNNING_METRIC = "vllm:num_requests_running"
_NO_RECORDS = {socket.EAI_NONAME, getattr(socket, "EAI_NODATA", socket.EAI_NONAME)}


async def system_resolver(host: str, port: int) -> list[str]:
    """Resolve ``host`` with the system resolver (every A/AAAA record)."""
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        if error.errno in _NO_RECORDS:
            raise LookupError(host) from error
        raise
    return sorted({str(info[4][0]) for info in infos})


def backend_url(address: str, port: int) -> str:
    """``http://ADDRESS:PORT``, with brackets around an IPv6 address."""
    host = f"[{address}]" if ":" in address else address
    return f"http://{host}:{port}"


def _sample_value(line: str) -> float:
    rest = line[line.rindex("}") + 1 :] if "}" in line else line.split(None, 1)[1]
    return float(rest.split()[0])


class ScrapedLoad(NamedTuple):
    """What one scrape of an engine's ``/metrics`` tells the router."""

    waiting: float
    kv_usage: float
    running: float


def parse_load(text: str) -> ScrapedLoad:
    """Waiting (summed over engines), KV usage (the largest) and running (summed) requests from
    a Prometheus text exposition of a vLLM engine; 0 for a series that is absent. One pass."""
    waiting = kv_usage = running = 0.0
    for line in text.splitlines():
        if not line.startswith("vllm:"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name == WAITING_METRIC:
            waiting += _sample_value(line)
        elif name == KV_USAGE_METRIC:
            kv_usage = max(kv_usage, _sample_value(line))
        elif name == RUNNING_METRIC:
            running += _sample_value(line)
    return ScrapedLoad(waiting, kv_usage, running)


@dataclass(slots=True)
class BackendState:
    """What the router tracks per backend."""

    url: str
    in_flight: int = 0
    waiting: float = 0.0
    kv_usage: float = 0.0
    running: float = 0.0
    failures: int = 0
    ejections: int = 0
    ejected_until: float | None = None


@dataclass(frozen=True, slots=True)
class PoolConfig:
    """Discovery, scraping, ejection and identity settings (see the module docstring;
    ``identity_port`` None: no identities)."""

    scrape_interval_s: float = 1.0
    scrape_timeout_s: float = 0.8
    dns_interval_s: float = 2.0
    eject_after_failures: int = 3
    eject_base_s: float = 2.0
    eject_max_s: float = 30.0
    identity_port: int | None = None


class BackendPool:
    """The set of backends, their loads and their health.

    Give either ``static`` URLs or ``dns`` (``(name, port)``). ``on_eject(url)`` is called at
    each ejection (the router counts them in its metrics); ``on_healthy_change()`` whenever
    the healthy set changes (the router's hold wakes its waiters); ``on_members_change(members)``
    whenever a backend joins or leaves (the KV event subscriptions follow the members).
    """

    def __init__(
        self,
        *,
        static: Sequence[str] = (),
        dns: tuple[str, int] | None = None,
        resolver: Resolver = system_resolver,
        config: PoolConfig | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_eject: Callable[[str], None] | None = None,
    ) -> None:
        if bool(static) == (dns is not None):
            raise ValueError("give either static backends or a DNS name, not both")
        for url in static:
            backend_address(url)  # ValueError with the expected form
        self.config = config or PoolConfig()
        self.dns = dns
        self._resolver = resolver
        self._clock = clock
        self.on_eject = on_eject
        self.on_healthy_change: Callable[[], None] | None = None
        self.on_members_change: Callable[[tuple[str, ...]], None] | None = None
        self._states: dict[str, BackendState] = {}
        self._healthy: tuple[str, ...] = ()
        self._identities: dict[str, str] = {}
        self._set_members(url.rstrip("/") for url in static)

    # Membership -----------------------------------------------------------------------------

    def _set_members(self, urls: Iterable[str]) -> None:
        wanted = set(urls)
        changed = wanted != self._states.keys()
        for url in list(self._states):
            if url not in wanted:
                del self._states[url]
        if not self._identities.keys() <= wanted:
            self._identities = {u: i for u, i in self._identities.items() if u in wanted}
        for url in wanted:
            self._states.setdefault(url, BackendState(url))
        self._update_healthy()
        if changed and self.on_members_change is not None:
            self.on_members_change(self.members)

    def _update_healthy(self) -> None:
        healthy = tuple(sorted(url for url, s in self._states.items() if s.ejected_until is None))
        changed, self._healthy = healthy != self._healthy, healthy
        if changed and self.on_healthy_change is not None:
            self.on_healthy_change()

    async def refresh_members(self) -> None:
        """Resolve the DNS name once and replace the member list."""
        if self.dns is None:
            return
        name, port = self.dns
        try:
            addresses = await self._resolver(name, port)
        except LookupError:
            addresses = []
        except Exception as error:  # keep the last list on resolver trouble
            log.warning("resolving %s failed, keeping %d backends: %s", name, len(self), error)
            return
        self._set_members(backend_url(address, port) for address in addresses)

    def __len__(self) -> int:
        return len(self._states)

    @property
    def members(self) -> tuple[str, ...]:
        return tuple(sorted(self._states))

    def healthy(self) -> tuple[str, ...]:
        """Members not ejected, sorted."""
        return self._healthy

    def state(self, url: str) -> BackendState | None:
        return self._states.get(url)

    def identities(self) -> dict[str, str]:
        """The known routing identities, by member URL (module docstring). The dict is
        replaced, never changed, when one is learned or forgotten: read it, do not change it."""
        return self._identities

    def loads(self) -> dict[str, BackendLoad]:
        return {
            url: BackendLoad(s.in_flight, s.waiting, s.kv_usage, s.running)
            for url, s in self._states.items()
            if s.ejected_until is None
        }

    # Traffic accounting ---------------------------------------------------------------------

    def acquire(self, url: str) -> None:
        state = self._states.get(url)
        if state is not None:
            state.in_flight += 1

    def release(self, url: str) -> None:
        state = self._states.get(url)
        if state is not None and state.in_flight > 0:
            state.in_flight -= 1

    def record_success(self, url: str) -> None:
        state = self._states.get(url)
        if state is not None:
            state.failures = 0
            state.ejections = 0

    def record_failure(self, url: str) -> None:
        state = self._states.get(url)
        if state is None or state.ejected_until is not None:
            return
        state.failures += 1
        if state.failures >= self.config.eject_after_failures:
            self._eject(state)

    def _eject(self, state: BackendState) -> None:
        backoff_s = min(self.config.eject_base_s * 2**state.ejections, self.config.eject_max_s)
        state.ejections += 1
        state.ejected_until = self._clock() + backoff_s
        state.failures = 0
        self._update_healthy()
        log.warning("ejected backend %s for %.1f s", state.url, backoff_s)
        if self.on_eject is not None:
            self.on_eject(state.url)

    # Scraping and probing -------------------------------------------------------------------

    def _timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.config.scrape_timeout_s)

    async def _scrape(self, session: aiohttp.ClientSession, state: BackendState) -> None:
        try:
            async with session.get(f"{state.url}/metrics", timeout=self._timeout()) as response:
                if response.status != 200:
                    return
                text = await response.text()
        except aiohttp.ClientConnectorError:
            self.record_failure(state.url)
            return
        except (aiohttp.ClientError, TimeoutError):
            return
        state.waiting, state.kv_usage, state.running = parse_load(text)

    async def _probe(
        self, session: aiohttp.ClientSession, state: BackendState, *, early: bool = False
    ) -> None:
        try:
            async with session.get(f"{state.url}/health", timeout=self._timeout()) as response:
                ok = response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            ok = False
        if state.url not in self._states:
            return
        if ok:
            state.ejected_until = None
            state.failures = 0
            self._update_healthy()
            log.info("backend %s is back", state.url)
        elif not early:
            self._eject(state)

    async def scrape_once(self, session: aiohttp.ClientSession) -> None:
        """Scrape every healthy backend and probe every ejected one whose time is up (every
        ejected one while none is healthy: module docstring)."""
        now = self._clock()
        none_healthy = not self._healthy
        jobs = []
        for state in list(self._states.values()):
            if state.ejected_until is None:
                jobs.append(self._scrape(session, state))
            elif state.ejected_until <= now:
                jobs.append(self._probe(session, state))
            elif none_healthy:
                jobs.append(self._probe(session, state, early=True))
        await asyncio.gather(*jobs)

    # Identities -----------------------------------------------------------------------------

    async def _ask_identity(
        self, session: aiohttp.ClientSession, url: str, port: int
    ) -> str | None:
        """The identity the warm-up sidecar on ``port`` of ``url``'s host reports; None for
        anything but a ``200`` with a non-empty string."""
        address = backend_url(backend_address(url)[0], port) + constants.WARMUP_IDENTITY_PATH
        try:
            async with session.get(address, timeout=self._timeout()) as response:
                if response.status != 200:
                    return None
                answer = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        identity = answer.get("identity") if isinstance(answer, dict) else None
        return identity if isinstance(identity, str) and identity else None

    async def refresh_identities(self, session: aiohttp.ClientSession) -> None:
        """Ask every member without a known identity for its own, concurrently, and remember
        the answers of those still members (module docstring). Nothing without
        ``identity_port``."""
        port = self.config.identity_port
        if port is None:
            return
        asked = [url for url in self._states if url not in self._identities]
        answers = await asyncio.gather(*(self._ask_identity(session, url, port) for url in asked))
        learned = {
            url: identity
            for url, identity in zip(asked, answers, strict=True)
            if identity is not None and url in self._states
        }
        if learned:
            self._identities = {**self._identities, **learned}

    async def refresh(self, session: aiohttp.ClientSession) -> None:
        """One discovery refresh: the DNS name (when given), then the missing identities."""
        await self.refresh_members()
        await self.refresh_identities(session)

    async def run(self, session: aiohttp.ClientSession) -> None:
        """Refresh (every ``dns_interval_s``) and scrape loads until cancelled."""
        next_refresh = 0.0
        while True:
            if self._clock() >= next_refresh:
                await self.refresh(session)
                next_refresh = self._clock() + self.config.dns_interval_s
            try:
                await self.scrape_once(session)
            except Exception:
                log.exception("scraping backends failed")
            await asyncio.sleep(self.config.scrape_interval_s)
