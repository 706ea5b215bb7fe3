"""The import rules of docs/architecture.md hold in the product, the checker catches each kind
of violation, and the architecture map names every package."""

from __future__ import annotations

import re
from pathlib import Path

from imports_support import PACKAGE, RULES, violations

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ROOT / "operator" / PACKAGE
ARCHITECTURE = ROOT / "docs" / "architecture.md"


def test_the_product_keeps_the_import_rules() -> None:
    found = violations(PRODUCT)
    assert found == [], "import rules broken (docs/architecture.md):\n" + "\n".join(map(str, found))


# module path -> source with one violation, and the rule (or "kopf handler") it must report.
PLANTED = {
    "api/bad_relative.py": ("from ..router import app\n", "api-is-the-bottom-layer"),
    "api/bad_lazy.py": (
        "import importlib\nimportlib.import_module('prefixserving.render.children')\n",
        "api-is-the-bottom-layer",
    ),
    "router/bad_kopf.py": ("import kopf\n", "kopf-only-in-controller"),
    "peek/bad_vllm.py": ("from vllm.v1.request import Request\n", "peek-is-plain-python"),
    "render/bad_client.py": ("from kubernetes import client\n", "api-server-only-in-kube"),
    "warmup/bad_vllm.py": (
        "def f():\n    import vllm\n    return vllm\n",
        "vllm-only-in-engine",
    ),
    "cli_table.py": ("COMMANDS = {'x': ('prefixserving_lab.sim.cli:main', 'help')}\n", "no-lab"),
    "controller/handlers/bad_decorator.py": (
        "import kopf as k\n\n@k.on.create('prefixserving.io', 'v1alpha1', 'x')\ndef h(**_): pass\n",
        "kopf handler",
    ),
}
# What the rules allow: none of these may be reported.
ALLOWED = {
    "api/quantities.py": "from kubernetes.utils import parse_quantity\n",
    "api/layers.py": "from prefixserving import constants\nfrom prefixserving.peek import guard\n",
    "controller/kube.py": "import kubernetes\nfrom kubernetes.client import ApiClient\n",
    "controller/handlers/errors.py": "import kopf\nraise kopf.PermanentError('x')\n",
    "controller/main.py": "import kopf\n\n@kopf.on.create('g', 'v', 'p')\ndef h(**_): pass\n",
    "engine/vllm.py": "from vllm.v1.core.sched.scheduler import Scheduler\n",
    "router/metrics_names.py": "WAITING = 'vllm:num_requests_waiting'\n",
    "warmup/events.py": "from kubernetes import client, config\n",
}


def _package(root: Path, modules: dict[str, str]) -> Path:
    package = root / PACKAGE
    for relative, source in modules.items():
        path = package / relative
        for folder in [path.parent, *path.parent.parents]:
            if folder == root:
                break
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "__init__.py").touch()
        path.write_text(source)
    return package


def test_every_planted_violation_is_reported_with_its_file_and_rule(tmp_path: Path) -> None:
    package = _package(tmp_path, {path: source for path, (source, _) in PLANTED.items()})
    found = violations(package)
    for relative, (_, rule) in PLANTED.items():
        hits = [v for v in found if v.path == package / relative and rule in v.text]
        assert len(hits) == 1, f"{relative}: expected one {rule!r} violation in {found}"
    assert {v.path for v in found} == {package / relative for relative in PLANTED}
    assert {rule for _, rule in PLANTED.values()} >= {r.name for r in RULES}


def test_what_the_rules_allow_is_not_reported(tmp_path: Path) -> None:
    assert violations(_package(tmp_path, ALLOWED)) == []


def test_the_architecture_map_names_every_package() -> None:
    text = ARCHITECTURE.read_text()
    section = text.split("## The packages and what they may import", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `(\w+)/` \|", section, flags=re.MULTILINE))
    folders = {p.parent.name for p in PRODUCT.glob("*/__init__.py")}
    assert listed == folders, (
        f"docs/architecture.md lists {sorted(listed)}, the code has {sorted(folders)}"
    )
