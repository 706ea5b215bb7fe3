"""A Kubernetes API emulator on loopback, built on kmock, for the operator's tests and benchmark.

Start it in a background thread and point kopf and the ``kubernetes`` client at it through a
generated kubeconfig::

    with EmulatorThread() as emulator:
        os.environ["KUBECONFIG"] = str(emulator.write_kubeconfig(tmp_path))
        ...

``emulator.call(fn, *args)`` runs a function on the emulator's loop (for direct access to
``emulator.server.store``, e.g. to install KEDA mid-test or add an admission rule).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import kmock
import yaml

from . import resources
from .server import KubeEmulator
from .store import ApiError, ResourceType, Store

__all__ = ["ApiError", "EmulatorThread", "KubeEmulator", "ResourceType", "Store", "resources"]

T = TypeVar("T")


class EmulatorThread:
    """Runs a :class:`KubeEmulator` on 127.0.0.1 (ephemeral port) in its own thread and loop."""

    def __init__(
        self, extra_types: list[ResourceType] | None = None, port: int | None = None
    ) -> None:
        self.server = KubeEmulator(extra_types=list(extra_types or []))
        self._port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kube-emulator", daemon=True)
        self.url = ""
        self._error: BaseException | None = None

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # surfaced by start()
            self._error = exc
            self._ready.set()

    async def _serve(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        async with self.server, kmock.Server(self.server, port=self._port) as http:
            self.url = f"http://127.0.0.1:{http.port}"
            self._ready.set()
            await self._stop.wait()

    def start(self) -> EmulatorThread:
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._error is not None or not self.url:
            raise RuntimeError(f"the Kubernetes emulator did not start: {self._error!r}")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(timeout=30)

    def __enter__(self) -> EmulatorThread:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` on the emulator's loop and return its result."""
        assert self._loop is not None

        async def run() -> T:
            return fn(*args)

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return future.result(timeout=30)

    def gate(self, matches: Callable[[kmock.Request], bool]) -> Callable[[], None]:
        """Hold every request ``matches`` accepts until the returned function is called."""
        event = self.call(asyncio.Event)
        self.call(self.server.gates.append, (matches, event))
        return lambda: self.call(event.set)

    def install(self, rtype: ResourceType) -> None:
        self.call(self.server.install, rtype)

    def write_kubeconfig(
        self, directory: Path, namespace: str = "default", token: str = "emulator"
    ) -> Path:
        """Write a kubeconfig for this emulator (no TLS; ``token`` is not checked, only
        recorded in each request's ``Authorization`` header) and return its path."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
            "users": [{"name": "emulator", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "emulator",
                    "context": {"cluster": "emulator", "user": "emulator", "namespace": namespace},
                }
            ],
            "current-context": "emulator",
        }
        path = Path(directory) / "kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path
