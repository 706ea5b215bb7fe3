"""Deterministic CPU cost of one region of a process: instructions and simulated cache misses.

CPU-time ratios on a shared or virtual machine move by tens of percent between rounds of the
same code (the scheduler-overhead table read 0.93x to 1.45x for one pair of schedulers in
successive rounds). Valgrind's callgrind counts the instructions a process executes and
simulates its caches, so the same code on the same input gives nearly the same counts whatever
else the machine runs: a small region repeated within 0.01% (what ran before it leaves the
allocator in a slightly different state), the replay benchmark's scheduler steps within 0.2%.

**How**
1. :func:`count` runs a command under ``valgrind --tool=callgrind --cache-sim=yes`` with
   instrumentation and collection off at start, so imports and set-up run about 4x slower than
   natively instead of about 50x slower.
2. Inside that process, :func:`markers` gives three calls into a small C library, built once
   with ``cc`` from callgrind's own header (``valgrind/callgrind.h``). Each call issues a client
   request at an exact point of the program:
   - ``instrument()`` switches instrumentation on (the simulated caches start cold); call it
     before a warm-up;
   - ``start()`` and ``stop()`` switch collection on and off around the measured region.

   ``callgrind_control`` from outside would toggle at valgrind's next poll instead, and that
   moved the edges of a region by about a million instructions from run to run.
3. The counts are read from callgrind's output file. The cache geometry is fixed (``CACHES``),
   so a count does not depend on the host's caches either.

**Estimated cycles**: iai-callgrind's model, L1 hits + 5 x LL hits + 35 x RAM hits, where
every instruction fetch and data read or write is an access. It prices memory stalls, which an
instruction count alone misses. It does not model branch prediction, the TLB or frequency.

**Cost**: the measured region runs about 50-100x slower than natively (cache simulation on).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Environment variable through which :func:`count` tells the measured process where the marker
# library is; :func:`markers` returns no-ops when it is unset (the process runs natively).
LIBRARY_ENV = "PREFIXSERVING_CALLGRIND_MARKERS"
# Callgrind's client-request macros, which the marker library is built from.
HEADER = Path("/usr/include/valgrind/callgrind.h")
# Simulated caches (size, associativity, line size): a common x86 server core's L1s and a
# modest last-level share. Fixed so that counts do not depend on the host.
CACHES = ("--I1=32768,8,64", "--D1=32768,8,64", "--LL=8388608,16,64")
# iai-callgrind's estimated cycles: an L1 hit costs 1, an LL hit 5, a RAM access 35.
LL_HIT_CYCLES = 5
RAM_CYCLES = 35

_MARKERS_C = """\
#include <valgrind/callgrind.h>
void prefixserving_instrument(void) { CALLGRIND_START_INSTRUMENTATION; }
void prefixserving_start(void) { CALLGRIND_TOGGLE_COLLECT; }
void prefixserving_stop(void) { CALLGRIND_TOGGLE_COLLECT; }
"""


@dataclass(frozen=True, slots=True)
class Counts:
    """Callgrind's totals for the collected region: instructions executed (``ir``), data reads
    and writes, and the simulated misses of each cache level."""

    ir: int
    dr: int
    dw: int
    i1_misses: int
    d1_read_misses: int
    d1_write_misses: int
    ll_instruction_misses: int
    ll_read_misses: int
    ll_write_misses: int

    @property
    def estimated_cycles(self) -> int:
        """L1 hits + 5 x LL hits + 35 x RAM accesses (module docstring)."""
        accesses = self.ir + self.dr + self.dw
        l1_misses = self.i1_misses + self.d1_read_misses + self.d1_write_misses
        ram = self.ll_instruction_misses + self.ll_read_misses + self.ll_write_misses
        return (accesses - l1_misses) + LL_HIT_CYCLES * (l1_misses - ram) + RAM_CYCLES * ram

    @classmethod
    def from_output(cls, text: str) -> Counts:
        """Parse a callgrind output file's ``events:`` and ``totals:`` lines."""
        events: list[str] = []
        totals: list[int] = []
        for line in text.splitlines():
            if line.startswith("events:"):
                events = line.split()[1:]
            elif line.startswith("totals:"):
                totals = [int(v) for v in line.split()[1:]]
        if not events or len(totals) != len(events):
            raise ValueError("not a callgrind output file with cache simulation (no totals)")
        by_event = dict(zip(events, totals, strict=True))
        try:
            return cls(
                ir=by_event["Ir"],
                dr=by_event["Dr"],
                dw=by_event["Dw"],
                i1_misses=by_event["I1mr"],
                d1_read_misses=by_event["D1mr"],
                d1_write_misses=by_event["D1mw"],
                ll_instruction_misses=by_event["ILmr"],
                ll_read_misses=by_event["DLmr"],
                ll_write_misses=by_event["DLmw"],
            )
        except KeyError as missing:
            raise ValueError(f"callgrind output lacks the {missing} event") from None


class Markers:
    """The measured process's calls into the marker library (no-ops when not under
    :func:`count`): ``instrument`` before a warm-up, ``start`` / ``stop`` around the region."""

    def __init__(self, library: ctypes.CDLL | None) -> None:
        self._library = library

    @property
    def active(self) -> bool:
        return self._library is not None

    def instrument(self) -> None:
        if self._library is not None:
            self._library.prefixserving_instrument()

    def start(self) -> None:
        if self._library is not None:
            self._library.prefixserving_start()

    def stop(self) -> None:
        if self._library is not None:
            self._library.prefixserving_stop()


def markers(env: Mapping[str, str] | None = None) -> Markers:
    """The markers of this process: active when :func:`count` started it."""
    path = (os.environ if env is None else env).get(LIBRARY_ENV)
    return Markers(ctypes.CDLL(path) if path else None)


def unavailable() -> str | None:
    """Why :func:`count` cannot run here (None when it can)."""
    for tool in ("valgrind", "cc"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (Debian: apt-get install valgrind gcc)"
    if not HEADER.is_file():
        return f"{HEADER} is missing (Debian: apt-get install valgrind)"
    return None


def count(argv: Sequence[str], env: Mapping[str, str] | None = None) -> Counts:
    """Run ``argv`` under callgrind and return the counts of the region its :func:`markers`
    delimit (zero if it never calls ``start``). Raises RuntimeError with valgrind's output when
    the command fails."""
    reason = unavailable()
    if reason:
        raise RuntimeError(f"cannot count instructions: {reason}")
    child_env = {**(os.environ if env is None else env), LIBRARY_ENV: str(_library())}
    with tempfile.TemporaryDirectory(prefix="callgrind-") as tmp:
        out = Path(tmp) / "callgrind.out"
        command = [
            "valgrind",
            "--tool=callgrind",
            "--cache-sim=yes",
            *CACHES,
            "--instr-atstart=no",
            "--collect-atstart=no",
            f"--callgrind-out-file={out}",
            *argv,
        ]
        done = subprocess.run(command, env=child_env, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.is_file():
            raise RuntimeError(
                f"{' '.join(argv)} failed under callgrind (exit {done.returncode}):\n"
                + (done.stderr or done.stdout)[-2000:]
            )
        return Counts.from_output(out.read_text())


def _library() -> Path:
    """The marker library, compiled once per source text into the temporary directory."""
    digest = hashlib.sha256(_MARKERS_C.encode()).hexdigest()[:12]
    path = Path(tempfile.gettempdir()) / f"prefixserving-callgrind-{digest}.so"
    if not path.is_file():
        with tempfile.TemporaryDirectory(prefix="callgrind-build-") as tmp:
            source = Path(tmp) / "markers.c"
            source.write_text(_MARKERS_C)
            built = Path(tmp) / path.name
            subprocess.run(
                ["cc", "-O2", "-shared", "-fPIC", "-o", str(built), str(source)],
                check=True,
                capture_output=True,
            )
            os.replace(built, path)  # atomic: concurrent builders never see a partial file
    return path
