"""PEEK's Prometheus metrics, served on the engine's own ``/metrics`` next to vLLM's.

vLLM's scheduler runs in the engine-core process while ``/metrics`` is served by the API server
process from prometheus_client's default registry. The two meet through a snapshot file:

* the API server process loads the ``vllm.general_plugins`` entry point :func:`register`
  before it spawns the engine core; it sets ``PREFIXSERVING_PEEK_METRICS_FILE`` (a per-server
  temporary path unless already set) and registers :class:`SnapshotCollector` in the default
  registry, so every scrape of ``/metrics`` includes the snapshot;
* the engine core inherits the variable; the scheduler's :class:`SnapshotWriter` rewrites the
  file (text exposition format, atomic rename) at the end of a step's ``update_from_output``
  once per ``interval_s``, and at every step where the number of held siblings changed, one
  file per data-parallel engine (``<path>.<engine>``). The queue signal subtracts held siblings
  from ``vllm:num_requests_waiting``, which vLLM counts in that same call for every step: the
  two describe the same moment and reach ``/metrics`` the time of one output message apart,
  where a timer alone would leave a burst's siblings counted as queue for up to
  ``interval_s``.

Each file starts with a ``# pid <n>`` comment; a file whose engine process is gone is not
exported (an idle engine keeps its last snapshot, which stays valid). With
``PROMETHEUS_MULTIPROC_DIR`` set (several API servers), the same file is read by each server.

Metric names (labels ``engine``, ``model_name`` as on vLLM's metrics):

================================================  =======  ======================================
name                                              type     meaning
================================================  =======  ======================================
``prefixserving:peek_info``                       gauge    1, labels ``base`` (vLLM's
                                                           ``AsyncScheduler`` or ``Scheduler``)
                                                           and ``fallback`` (why PEEK keeps
                                                           vLLM's order, empty when it does not)
``prefixserving:peek_held_siblings``              gauge    siblings held for a running pioneer
``prefixserving:peek_pinned_blocks``              gauge    KV blocks hard-pinned by the guard
``prefixserving:peek_uncached_waiting_tokens``    gauge    prompt tokens the waiting requests
                                                           still need computed, each shared block
                                                           once, less what pioneers compute
``prefixserving:peek_admitted_total``             counter  admitted requests per lane
                                                           (``lane``: resume, fcfs, aged,
                                                           cache)
``prefixserving:peek_admitted_tokens_total``      counter  their uncached prompt tokens
``prefixserving:peek_sibling_holds_total``        counter  times a sibling was held
``prefixserving:peek_pressure_steps_total``       counter  steps the guard met planned blocks in
                                                           the eviction window
``prefixserving:peek_headroom_stops_total``       counter  steps whose admissions stopped to keep
                                                           decode headroom
================================================  =======  ======================================
"""

from __future__ import annotations

import glob
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector, CollectorRegistry

ENV_METRICS_FILE = "PREFIXSERVING_PEEK_METRICS_FILE"
PREFIX = "prefixserving:peek_"
LABELS = ("engine", "model_name")
# Names other components query (the operator's status, the autoscalers).
PEEK_INFO = PREFIX + "info"
PEEK_HELD_SIBLINGS = PREFIX + "held_siblings"
PEEK_UNCACHED_WAITING_TOKENS = PREFIX + "uncached_waiting_tokens"


@dataclass(frozen=True, slots=True)
class PeekSnapshot:
    """Values of one engine's PEEK metrics at one moment."""

    base: str
    fallback: str
    held_siblings: int
    pinned_blocks: int
    uncached_waiting_tokens: int
    admitted: dict[str, int]
    admitted_tokens: dict[str, int]
    sibling_holds: int
    pressure_steps: int
    headroom_stops: int


def snapshot_families(snap: PeekSnapshot, engine: str, model_name: str) -> list[Metric]:
    """Prometheus metric families for a snapshot."""
    base = [engine, model_name]
    info = GaugeMetricFamily(
        PEEK_INFO,
        "PEEK's scheduler base and fallback reason (empty: PEEK order).",
        labels=[*LABELS, "base", "fallback"],
    )
    info.add_metric([*base, snap.base, snap.fallback], 1)
    families: list[Metric] = [info]
    for name, doc, value in (
        ("held_siblings", "Siblings held for a running pioneer.", snap.held_siblings),
        ("pinned_blocks", "KV blocks hard-pinned by the eviction guard.", snap.pinned_blocks),
        (
            "uncached_waiting_tokens",
            "Prompt tokens the waiting requests still need computed (shared blocks once).",
            snap.uncached_waiting_tokens,
        ),
    ):
        gauge = GaugeMetricFamily(PREFIX + name, doc, labels=LABELS)
        gauge.add_metric(base, value)
        families.append(gauge)
    for name, doc, per_lane in (
        ("admitted", "Admitted requests per lane.", snap.admitted),
        ("admitted_tokens", "Uncached prompt tokens admitted per lane.", snap.admitted_tokens),
    ):
        counter = CounterMetricFamily(PREFIX + name, doc, labels=[*LABELS, "lane"])
        for lane, value in sorted(per_lane.items()):
            counter.add_metric([*base, lane], value)
        families.append(counter)
    for name, doc, value in (
        ("sibling_holds", "Times a sibling was held for its pioneer.", snap.sibling_holds),
        (
            "pressure_steps",
            "Steps the guard met planned blocks in the eviction window.",
            snap.pressure_steps,
        ),
        (
            "headroom_stops",
            "Steps whose admissions stopped to keep decode headroom.",
            snap.headroom_stops,
        ),
    ):
        counter = CounterMetricFamily(PREFIX + name, doc, labels=LABELS)
        counter.add_metric(base, value)
        families.append(counter)
    return families


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def render_snapshot(snap: PeekSnapshot, engine: str, model_name: str) -> bytes:
    """Text exposition of a snapshot."""
    registry = CollectorRegistry()
    registry.register(_Families(snapshot_families(snap, engine, model_name)))
    return generate_latest(registry)


class SnapshotWriter:
    """Writes one engine's snapshot file at most once per ``interval_s`` (engine process)."""

    def __init__(self, path: str, engine: str, model_name: str, interval_s: float = 1.0) -> None:
        self.path = Path(f"{path}.{engine}")
        self.engine = engine
        self.model_name = model_name
        self.interval_s = interval_s
        self._last_write = float("-inf")
        self._written_held: int | None = None  # None: nothing written yet

    @classmethod
    def from_env(cls, engine: str, model_name: str) -> SnapshotWriter | None:
        path = os.environ.get(ENV_METRICS_FILE)
        return None if not path else cls(path, engine, model_name)

    def due(self, held_siblings: int) -> bool:
        """True when ``interval_s`` passed since the last write, or ``held_siblings`` differs
        from the count the last write exported (module docstring)."""
        if held_siblings != self._written_held:
            return True
        return time.monotonic() - self._last_write >= self.interval_s

    def write(self, snap: PeekSnapshot) -> None:
        self._last_write = time.monotonic()
        self._written_held = snap.held_siblings
        tmp = self.path.with_name(self.path.name + ".tmp")
        header = f"# pid {os.getpid()}\n".encode()
        tmp.write_bytes(header + render_snapshot(snap, self.engine, self.model_name))
        os.replace(tmp, self.path)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


class SnapshotCollector(Collector):
    """Exports the snapshot files ``<path>.<engine>`` (API server process)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def collect(self) -> Iterator[Metric]:
        """One family per name, with the samples of every live engine's file."""
        merged: dict[str, Metric] = {}
        for file in sorted(glob.glob(glob.escape(self.path) + ".*")):
            if file.endswith(".tmp"):
                continue
            try:
                text = Path(file).read_text()
            except OSError:
                continue
            if not _writer_alive(text):
                continue
            for family in text_string_to_metric_families(text):
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        yield from merged.values()


def _writer_alive(text: str) -> bool:
    first = text.split("\n", 1)[0]
    if not first.startswith("# pid "):
        return False
    try:
        os.kill(int(first.removeprefix("# pid ")), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


_registered = False


def _in_api_server() -> bool:
    """True in a process that serves vLLM's OpenAI API (and so its ``/metrics``)."""
    main_spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    names = [*sys.modules, getattr(main_spec, "name", "") or ""]
    return any(name.startswith(_API_MODULES) for name in names)


_API_MODULES = ("vllm.entrypoints.openai", "vllm.entrypoints.cli")


def register() -> None:
    """``vllm.general_plugins`` entry point: runs in every vLLM process, idempotent. In the API
    server it picks the snapshot path (unless set) before the engine core is spawned; other
    processes (engine core, offline ``LLM``, replays) only export what is already configured."""
    global _registered
    if _registered:
        return
    path = os.environ.get(ENV_METRICS_FILE)
    if not path and _in_api_server():
        path = os.path.join(tempfile.gettempdir(), f"prefixserving-peek-{os.getpid()}.prom")
        os.environ[ENV_METRICS_FILE] = path
    if path:
        _registered = True
        REGISTRY.register(SnapshotCollector(path))
