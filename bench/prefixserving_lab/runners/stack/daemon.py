"""``prefixserving stack up`` in the background: a process that holds a running stack.

It writes ``state.json`` (its pid, the router URL, the engines) once the stack is ready and
stops everything when it receives SIGTERM (``prefixserving stack down``) or SIGINT.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path

from prefixserving_lab.runners.stack.local import StackConfig, running_stack


def hold(config: StackConfig, state_path: Path) -> None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with running_stack(config, workdir=state_path.parent / "work") as stack:
            state = {
                "pid": os.getpid(),
                "router_url": stack.router_url,
                "engines": [engine.url for engine in stack.engines],
                "warmup": stack.warmup_urls,
            }
            state_path.write_text(json.dumps(state, indent=2) + "\n")
            stop.wait()
    except Exception as exc:  # reported to `stack up`, which is waiting for the state file
        state_path.write_text(json.dumps({"pid": os.getpid(), "error": str(exc)}) + "\n")
        raise
    finally:
        if state_path.exists() and "error" not in state_path.read_text():
            state_path.unlink()


if __name__ == "__main__":
    spec = json.loads(sys.argv[1])
    hold(StackConfig(**spec["config"]), Path(spec["state"]))
