"""Download and unpack what the vLLM contract test runs (``make setup`` calls this).

``PYTHONPATH=tests python -m vllm_contract.fetch`` fetches, for every release in
``releases.toml``:

1. the source distribution, from which only the scheduler tests and the helpers they import are
   unpacked (:data:`SDIST_MEMBERS`), into ``<dir>/<version>/tests/``;
2. for a release that is not the one installed in the venv, its wheel, of which only the Python
   code and data are unpacked (ELF binaries and C++/CUDA sources are skipped: the scheduler and
   the KV cache manager are plain Python), into ``<dir>/<version>/site/``.

``<dir>`` is ``.tools/vllm-contract/`` in the repository (``$PREFIXSERVING_VLLM_CONTRACT_DIR``
puts it elsewhere, e.g. a CI cache). Every download is checked against the sha256 in
``releases.toml`` before anything is unpacked; a release is unpacked into a temporary folder that
is renamed when complete, and ``<dir>/<version>/READY`` records the hashes it came from. A
release whose ``READY`` matches is skipped, so running it again costs nothing. First run: about
45 MB per source distribution and 340 MB for the 0.33.0 wheel; 65 MB on disk afterwards.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import tarfile
import tempfile
import tomllib
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TextIO

HARNESS = Path(__file__).resolve().parent
ROOT = HARNESS.parents[1]
RELEASES_FILE = HARNESS / "releases.toml"
ENV_CONTRACT_DIR = "PREFIXSERVING_VLLM_CONTRACT_DIR"

# What vLLM's scheduler tests import from their own tree: paths in the source distribution, a
# trailing slash meaning the whole folder.
SDIST_MEMBERS = (
    "tests/__init__.py",
    "tests/v1/__init__.py",
    "tests/v1/core/",
    "tests/v1/kv_connector/__init__.py",
    "tests/v1/kv_connector/unit/__init__.py",
    "tests/v1/kv_connector/unit/utils.py",
)
# Wheel members left out besides ELF binaries: C++ and CUDA sources and headers.
NATIVE_SOURCE_SUFFIXES = frozenset({".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".inl"})
ELF_MAGIC = b"\x7fELF"
CHUNK_BYTES = 1 << 20


class FetchError(RuntimeError):
    """A download failed or did not match its pinned sha256."""


@dataclass(frozen=True, slots=True)
class Artifact:
    """One file on PyPI, pinned by its sha256."""

    url: str
    sha256: str

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True, slots=True)
class Release:
    """A vLLM release whose scheduler tests run against PEEK.

    ``installed`` names the venv's distribution that is this release (its tests then run on
    it); otherwise ``wheel`` is the wheel whose Python code runs them."""

    version: str
    sdist: Artifact
    wheel: Artifact | None = None
    installed: str | None = None

    @property
    def artifacts(self) -> tuple[Artifact, ...]:
        return (self.sdist,) if self.wheel is None else (self.sdist, self.wheel)


def releases() -> list[Release]:
    """The releases in ``releases.toml``, in file order."""
    data = tomllib.loads(RELEASES_FILE.read_text())
    out = []
    for entry in data["release"]:
        wheel = entry.get("wheel")
        out.append(
            Release(
                version=entry["version"],
                sdist=Artifact(**entry["sdist"]),
                wheel=None if wheel is None else Artifact(**wheel),
                installed=entry.get("installed"),
            )
        )
    if any((r.wheel is None) == (r.installed is None) for r in out):
        raise ValueError(f"{RELEASES_FILE}: each release needs exactly one of wheel, installed")
    return out


def contract_dir() -> Path:
    """Where the unpacked releases live."""
    override = os.environ.get(ENV_CONTRACT_DIR)
    return Path(override) if override else ROOT / ".tools" / "vllm-contract"


def release_dir(release: Release) -> Path:
    """The release's folder: its ``tests/`` and, for a wheel release, ``site/``."""
    return contract_dir() / release.version


def site_dir(release: Release) -> Path | None:
    """The folder to put first on ``PYTHONPATH`` to import this release's vLLM, if any."""
    return None if release.wheel is None else release_dir(release) / "site"


def _ready_text(release: Release) -> str:
    return "".join(f"{a.sha256}  {a.filename}\n" for a in release.artifacts)


def is_ready(release: Release) -> bool:
    """Whether the release is unpacked from exactly the pinned files."""
    ready = release_dir(release) / "READY"
    return ready.is_file() and ready.read_text() == _ready_text(release)


def download(artifact: Artifact, dest: Path) -> Path:
    """Stream ``artifact`` into ``dest`` (a folder) and check its sha256."""
    path = dest / artifact.filename
    digest = hashlib.sha256()
    try:
        with urllib.request.urlopen(artifact.url, timeout=120) as response, path.open("wb") as f:
            while chunk := response.read(CHUNK_BYTES):
                digest.update(chunk)
                f.write(chunk)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise FetchError(f"could not download {artifact.url}: {exc}") from exc
    if digest.hexdigest() != artifact.sha256:
        raise FetchError(
            f"{artifact.url}: sha256 is {digest.hexdigest()}, releases.toml pins "
            f"{artifact.sha256}; the file on PyPI changed or the download is corrupt"
        )
    return path


def _safe_relative(name: str) -> PurePosixPath:
    rel = PurePosixPath(name)
    if rel.is_absolute() or ".." in rel.parts:
        raise FetchError(f"archive member {name!r} points outside its folder")
    return rel


def _wanted_sdist_member(rel: PurePosixPath) -> bool:
    path = rel.as_posix()
    return any(
        path.startswith(member) if member.endswith("/") else path == member
        for member in SDIST_MEMBERS
    )


def unpack_sdist(archive: Path, dest: Path) -> int:
    """Write :data:`SDIST_MEMBERS` of a ``vllm-X.tar.gz`` under ``dest``; return the file count."""
    count = 0
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            if not member.isfile():
                continue
            # Members are "vllm-X/<path>".
            rel = _safe_relative(member.name.split("/", 1)[-1])
            if not _wanted_sdist_member(rel):
                continue
            source = tar.extractfile(member)
            assert source is not None  # a regular file
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read())
            count += 1
    missing = [m for m in SDIST_MEMBERS if not (dest / m).exists()]
    if missing:
        raise FetchError(f"{archive.name} lacks {', '.join(missing)}")
    return count


def unpack_wheel_python(archive: Path, dest: Path) -> int:
    """Write a wheel's members under ``dest``, except ELF binaries and C++/CUDA sources;
    return the file count."""
    count = 0
    with zipfile.ZipFile(archive) as whl:
        for info in whl.infolist():
            if info.is_dir():
                continue
            rel = _safe_relative(info.filename)
            if rel.suffix in NATIVE_SOURCE_SUFFIXES:
                continue
            with whl.open(info) as source:
                head = source.read(len(ELF_MAGIC))
                if head == ELF_MAGIC:
                    continue
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                with target.open("wb") as out:
                    out.write(head)
                    shutil.copyfileobj(source, out, CHUNK_BYTES)
            count += 1
    return count


def fetch(release: Release, log: TextIO | None = None) -> Path:
    """Make :func:`release_dir` hold the release's tests (and Python code); return it."""
    target = release_dir(release)
    if is_ready(release):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{release.version}-") as tmp:
        work = Path(tmp)
        partial = work / "release"
        partial.mkdir()
        for artifact in release.artifacts:
            if log is not None:
                print(f"vllm-contract: downloading {artifact.filename}", file=log, flush=True)
            archive = download(artifact, work)
            if artifact is release.sdist:
                unpack_sdist(archive, partial)
            else:
                unpack_wheel_python(archive, partial / "site")
            archive.unlink()
        (partial / "READY").write_text(_ready_text(release))
        if target.exists():
            shutil.rmtree(target)
        partial.rename(target)
    return target


def main() -> int:
    try:
        for release in releases():
            path = fetch(release, log=sys.stderr)
            print(f"vllm-contract: {release.version} ready in {path}")
    except FetchError as exc:
        print(f"vllm-contract: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
