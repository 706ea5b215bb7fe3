"""Replay a Dockerfile's build on this machine, without a Docker engine.

What is reproduced, and how:

1. The build context: the repository as ``docker build -f images/NAME/Dockerfile .`` sends it,
   filtered by ``.dockerignore`` with the Docker SDK's own code (``docker.utils.build.tar``, a
   port of moby's pattern matcher: paths are matched from the context root, a parent's match
   covers its children, the last matching line wins, ``!`` keeps a path). Its tar is extracted
   into a folder; symlinks stay symlinks.
2. The Dockerfile: parsed by buildkit's own parser (the ``dockerfile`` package) into stages.
3. Each stage's filesystem is a folder standing for ``/``, at the same host path for every
   stage, so absolute paths written in a stage (a venv's script shebangs) stay valid where a
   later stage copies them, as in Docker. When a stage ends its folder is moved aside: the next
   stage holds only what it copies ``--from`` it.
4. ``WORKDIR``, ``ENV`` (``$VAR`` expanded) and ``COPY`` from the context or ``--from`` a
   stage: a named source that is a link is followed; inside a copied folder links stay links,
   so a link to a path the Dockerfile did not copy dangles, as it does in the image. A copied
   link that is absolute or climbs out of the stage is refused: it would resolve on this
   machine, not in the image.
5. ``RUN`` in the build stages: ``/bin/sh -c`` in the stage's WORKDIR, with every container
   path the Dockerfile names (WORKDIRs, COPY destinations and ``--from`` sources) rewritten
   under the stage folder, this machine's Python first on PATH standing for the ``python:*``
   base image, none of this process's PYTHONPATH / VIRTUAL_ENV, and the caller's build
   environment on top (``build_env``: pip settings, as the build host's mirror configuration
   reaches ``docker build``). The final stage's RUN lines
   act on its base image, which is not here: they are returned (:attr:`Image.runs`) for the
   test to reproduce or account for.

Anything else is refused with :class:`NotReproduced` naming the line (ADD, SHELL, ARG inside a
stage, COPY flags other than ``--from``, wildcard sources, exec-form RUN, a build stage whose
base is not ``python:*``). Not checked by any replay: the base images' own contents (their
Python version, the vLLM image's packages), users and file permissions.

Cost: one tar of the context (about 1 MB with the repository's ``.dockerignore``), the copies,
and whatever the RUN lines cost (a ``pip install`` of the package and its dependencies).
"""

from __future__ import annotations

import glob
import os
import posixpath
import re
import shlex
import shutil
import string
import subprocess
import sys
import tarfile
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import dockerfile
from docker.utils.build import tar

# Build stages run on this machine's Python, which stands for these base images only.
PYTHON_BASE_IMAGE = "python:"
# Instructions that change no file and no environment of what the tests run.
METADATA_ONLY = frozenset({"EXPOSE", "USER", "LABEL"})
# Variables of this process that must not reach a command that runs "in the image".
HOST_ONLY_ENV = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")


class NotReproduced(Exception):
    """The Dockerfile uses something this replay does not do: extend this module."""


class BuildFailed(Exception):
    """A step failed where ``docker build`` would fail (a RUN exited non-zero, a COPY source
    is not in the context)."""

    def __init__(self, line: int, step: str, output: str) -> None:
        super().__init__(f"Dockerfile line {line}: {step}\n{output}")
        self.line = line
        self.step = step
        self.output = output


@dataclass
class Stage:
    """One ``FROM`` and the instructions after it."""

    name: str
    base: str
    commands: list[dockerfile.Command]


@dataclass
class Image:
    """The final stage of a replayed build."""

    root: Path
    env: dict[str, str]
    workdir: str = "/"
    entrypoint: tuple[str, ...] = ()
    runs: list[str] = field(default_factory=list)

    def path(self, container_path: str) -> Path:
        """Where ``container_path`` of the image is on this machine."""
        return within(self.root, posixpath.join(self.workdir, container_path))

    def command(self, *args: str, entrypoint: str | None = None) -> list[str]:
        """``docker run [--entrypoint ENTRYPOINT] IMAGE ARGS...``: the entrypoint's program
        found on the image's PATH among the image's own files (never this machine's)."""
        if entrypoint is None and not self.entrypoint:
            raise NotReproduced("the image has no exec-form ENTRYPOINT")
        program, *fixed = (entrypoint,) if entrypoint is not None else self.entrypoint
        for directory in self.env["PATH"].split(os.pathsep):
            candidate = Path(directory) / program
            if candidate.is_relative_to(self.root) and os.access(candidate, os.X_OK):
                return [str(candidate), *fixed, *args]
        raise AssertionError(f"{program} is not in the image on its PATH {self.env['PATH']}")

    def process_env(self) -> dict[str, str]:
        """The environment a process in the image starts with."""
        return process_env(self.env)


def within(root: Path, path: str) -> Path:
    """``path`` (absolute or relative) scoped to ``root`` the way Docker scopes it: ``..``
    stops at the top, never above it."""
    return root / posixpath.normpath(posixpath.join("/", path)).lstrip("/")


def process_env(image_env: dict[str, str]) -> dict[str, str]:
    """This process's environment (registry settings for pip among it) without the variables
    that would make Python import this checkout, overlaid with the image's ENV."""
    base = {k: v for k, v in os.environ.items() if k not in HOST_ONLY_ENV}
    return base | image_env


def read_stages(path: Path) -> list[Stage]:
    """The stages of the Dockerfile at ``path``, in order."""
    stages: list[Stage] = []
    for command in dockerfile.parse_file(str(path)):
        instruction = command.cmd.upper()
        if instruction == "FROM":
            base, *alias = command.value
            named = len(alias) == 2 and alias[0].upper() == "AS"
            stages.append(Stage(alias[1] if named else str(len(stages)), base, []))
        elif stages:
            stages[-1].commands.append(command)
        elif instruction != "ARG":  # ARGs before the first FROM only parameterise FROM lines
            raise _not_reproduced(path, command)
    return stages


def dockerignore_patterns(context: Path) -> list[str]:
    """The patterns of ``context/.dockerignore``, read as the Docker SDK reads the file."""
    path = context / ".dockerignore"
    lines = path.read_text().splitlines() if path.exists() else []
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def extract_context(source: Path, into: Path) -> Path:
    """The build context ``docker build SOURCE`` sends, extracted into ``into``."""
    with (
        tar(str(source), exclude=dockerignore_patterns(source)) as archive,
        tarfile.open(fileobj=archive) as members,
    ):
        # The "data" filter refuses links that are absolute or leave the context.
        members.extractall(into, filter="data")
    return into


def replay(
    dockerfile_path: Path, context: Path, workdir: Path, build_env: Mapping[str, str] | None = None
) -> Image:
    """Replay the build of ``dockerfile_path`` over the extracted ``context``.

    ``workdir`` (empty, or missing) receives the stages' filesystems; ``build_env`` is added to
    the environment of the build stages' RUN lines (not to the image's ENV). Returns the final
    stage. Raises BuildFailed where the build would fail and NotReproduced where the Dockerfile
    leaves what this replay does.
    """
    return _Replay(dockerfile_path, context, workdir, build_env or {}).build()


class _Replay:
    def __init__(
        self, dockerfile_path: Path, context: Path, workdir: Path, build_env: Mapping[str, str]
    ) -> None:
        self.path = dockerfile_path
        self.build_env = dict(build_env)
        self.stages = read_stages(dockerfile_path)
        self.context = context
        self.root = workdir / "root"
        self.finished = workdir / "stages"
        self.finished.mkdir(parents=True, exist_ok=True)
        names = sorted(_container_paths(self.stages), key=len, reverse=True)
        self.container_path = (
            re.compile(r"(?<![\w.\-/])(" + "|".join(map(re.escape, names)) + r")(?![\w.\-])")
            if names
            else None
        )

    def build(self) -> Image:
        *builders, final = self.stages
        for stage in builders:
            if not stage.base.startswith(PYTHON_BASE_IMAGE):
                raise NotReproduced(f"{self.path}: build stage {stage.name} is FROM {stage.base}")
            self._apply(stage, run=True)
            self.root.rename(self.finished / stage.name)
        return self._apply(final, run=False)

    def _apply(self, stage: Stage, run: bool) -> Image:
        self.root.mkdir()
        python_bin = str(Path(sys.executable).parent)
        image = Image(root=self.root, env={"PATH": f"{python_bin}{os.pathsep}{os.environ['PATH']}"})
        for command in stage.commands:
            instruction = command.cmd.upper()
            if instruction == "WORKDIR":
                (value,) = command.value
                image.workdir = posixpath.join(image.workdir, value)
                image.path(".").mkdir(parents=True, exist_ok=True)
            elif instruction == "ENV":
                pairs = iter(command.value)
                for name, value in zip(pairs, pairs, strict=True):
                    words = " ".join(shlex.split(self._host_paths(value)))
                    # Docker expands an unset variable to nothing.
                    image.env[name] = string.Template(words).substitute(defaultdict(str, image.env))
            elif instruction == "COPY":
                self._copy(command, image.workdir)
            elif instruction == "RUN" and not command.json:
                (script,) = command.value
                if run:
                    self._run(command.start_line, script, image)
                else:
                    image.runs.append(script)
            elif instruction == "ENTRYPOINT" and command.json:
                image.entrypoint = tuple(command.value)
            elif instruction not in METADATA_ONLY:
                raise _not_reproduced(self.path, command)
        return image

    def _host_paths(self, text: str) -> str:
        """``text`` with the container paths the Dockerfile names moved under the stage."""
        if self.container_path is None:
            return text
        return self.container_path.sub(lambda m: f"{self.root}{m.group(1)}", text)

    def _run(self, line: int, script: str, image: Image) -> None:
        result = subprocess.run(
            ["/bin/sh", "-c", self._host_paths(script)],
            cwd=image.path("."),
            env=process_env(self.build_env | image.env),  # the Dockerfile's ENV wins
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        if result.returncode != 0:
            raise BuildFailed(line, f"RUN {script} exited {result.returncode}", result.stdout)

    def _copy(self, command: dockerfile.Command, workdir: str) -> None:
        flags = dict(flag.removeprefix("--").partition("=")[::2] for flag in command.flags)
        if set(flags) - {"from"}:
            raise _not_reproduced(self.path, command)
        source_root = self.finished / flags["from"] if "from" in flags else self.context
        if not source_root.is_dir():
            raise NotReproduced(f"{self.path}:{command.start_line}: no stage {flags['from']}")
        *sources, destination = command.value
        target = posixpath.join(workdir, destination)
        into_folder = destination.endswith("/") or len(sources) > 1
        for source in sources:
            if glob.has_magic(source):
                raise _not_reproduced(self.path, command)
            named = within(source_root, source)
            resolved = named.resolve()  # Docker follows a named source that is a link
            if not resolved.is_relative_to(source_root.resolve()) or not resolved.exists():
                raise BuildFailed(command.start_line, f"COPY {source}: not found", "")
            host_target = within(self.root, target)
            if resolved.is_dir():
                shutil.copytree(resolved, host_target, symlinks=True, dirs_exist_ok=True)
            else:
                if into_folder or host_target.is_dir():
                    host_target = host_target / named.name
                host_target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(resolved, host_target)
            if "from" not in flags:
                self._check_links(host_target)

    def _check_links(self, copied: Path) -> None:
        """Refuse copied links that would resolve on this machine instead of in the image."""
        links = [copied] if copied.is_symlink() else []
        for folder, dirs, files in os.walk(copied):
            links += [Path(folder, n) for n in dirs + files if Path(folder, n).is_symlink()]
        for link in links:
            target = os.readlink(link)
            lands = Path(os.path.normpath(link.parent / target))
            if os.path.isabs(target) or not lands.is_relative_to(self.root):
                relative = link.relative_to(self.root)
                raise NotReproduced(f"{self.path}: copied link /{relative} -> {target}")


def _container_paths(stages: list[Stage]) -> set[str]:
    """The container paths the Dockerfile names: WORKDIRs, absolute COPY destinations and
    ``COPY --from`` sources (the outermost of nested ones; ``/`` itself is never rewritten)."""
    named: set[str] = set()
    for stage in stages:
        workdir = "/"
        for command in stage.commands:
            instruction = command.cmd.upper()
            if instruction == "WORKDIR":
                workdir = posixpath.join(workdir, command.value[0])
                named.add(workdir)
            elif instruction == "COPY":
                *sources, destination = command.value
                named.add(posixpath.join(workdir, destination))
                if any(flag.startswith("--from=") for flag in command.flags):
                    named.update(sources)
    paths = {posixpath.normpath(p) for p in named} - {"/"}
    return {p for p in paths if not any(p.startswith(f"{q}/") for q in paths)}


def _not_reproduced(path: Path, command: dockerfile.Command) -> NotReproduced:
    return NotReproduced(
        f"{path}:{command.start_line}: {command.original!r} is not reproduced by "
        f"{Path(__file__).name}; extend it so the image tests follow the Dockerfile"
    )
