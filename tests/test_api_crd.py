"""The CRDs generated from the models: committed copies are current, the schema is structural
and documented, the API server's defaulting agrees with pydantic's, and the examples pass."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from api_support import CrdValidator, apply_defaults, json_schema
from prefixserving import constants
from prefixserving.api import crd
from prefixserving.api.validation import parse_resource, parse_scaling_policy
from render_examples import EXAMPLES, example_documents

ROOT = Path(__file__).resolve().parents[1]
CHART_CRDS = ROOT / "charts" / "prefixserving-operator" / "crds"
REGENERATE = "run `make crds` (prefixserving crd --out-dir crds, then copy into the chart)"


@pytest.mark.parametrize("folder", [ROOT / "crds", CHART_CRDS], ids=["crds", "chart"])
@pytest.mark.parametrize("file_name", sorted(crd.crds()))
def test_committed_crds_equal_the_generated_ones(folder: Path, file_name: str) -> None:
    path = folder / file_name
    assert path.exists(), f"{path} missing: {REGENERATE}"
    assert path.read_text() == crd.dump(crd.crds()[file_name]), f"{path} is stale: {REGENERATE}"


def _walk(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    nodes = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        nodes += _walk(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        nodes += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        nodes += _walk(schema["additionalProperties"], f"{path}{{}}")
    return nodes


def _schema(generated: dict[str, Any]) -> dict[str, Any]:
    return generated["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.mark.parametrize("file_name", sorted(crd.crds()))
def test_schema_is_structural_and_every_field_is_described(file_name: str) -> None:
    schema = _schema(crd.crds()[file_name])
    for path, node in _walk(schema):
        assert "$ref" not in node and "title" not in node, path
        assert node.get("additionalProperties") is not False, path
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
        else:
            assert "type" in node, f"{path} has no type"
            assert "anyOf" not in node, path
        parent_is_field = path and not path.endswith(("[]", "}"))
        if parent_is_field and path != ".metadata":
            assert node.get("description"), f"{path} has no description (kubectl explain)"


def test_prefixserving_crd_names_status_and_columns() -> None:
    generated = crd.prefixserving_crd()
    spec = generated["spec"]
    assert generated["metadata"]["name"] == f"{constants.PLURAL}.{constants.GROUP}"
    assert spec["names"]["shortNames"] == [constants.SHORT_NAME]
    assert spec["scope"] == "Namespaced"
    (version,) = spec["versions"]
    assert version["name"] == constants.VERSION
    assert version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Ready", "Replicas", "Warm", "Hit rate", "KV usage", "Queue", "Age"]
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"observedGeneration", "conditions", "replicas", "readyReplicas", "warmReplicas"} <= set(
        status
    )
    assert {"routerEndpoint", "metrics"} <= set(status)
    assert {"hitRate", "kvCacheUsage", "queueDepth", "asOf"} <= set(status["metrics"]["properties"])


@pytest.mark.parametrize("generated", [crd.prefixserving_crd(), crd.scaling_policy_crd()])
def test_printer_columns_read_fields_the_schema_has(generated: dict[str, Any]) -> None:
    """A column whose path names no field prints an empty cell forever (the API server does not
    check): every plain ``.spec``/``.status`` path resolves in the schema, with the column's
    type."""
    (version,) = generated["spec"]["versions"]
    plain = [
        c
        for c in version["additionalPrinterColumns"]
        if c["jsonPath"].startswith((".spec.", ".status.")) and "[" not in c["jsonPath"]
    ]
    assert plain, "no column reads a plain field"
    for column in plain:
        node = version["schema"]["openAPIV3Schema"]
        for part in column["jsonPath"].lstrip(".").split("."):
            assert part in node.get("properties", {}), f"{column['name']}: no field {part}"
            node = node["properties"][part]
        assert node["type"] == column["type"], f"{column['name']}: {node['type']}"


def test_schema_carries_enums_ranges_and_defaults() -> None:
    spec = _schema(crd.prefixserving_crd())["properties"]["spec"]["properties"]
    engine = spec["engine"]["properties"]
    assert engine["blockSize"]["enum"] == [16, 32, 64, 128]
    assert engine["tensorParallelSize"]["minimum"] == 1
    assert engine["gpuResourceName"]["default"] == "nvidia.com/gpu"
    assert spec["scheduler"]["properties"]["policy"]["enum"] == ["peek", "fcfs"]
    assert spec["scheduler"]["properties"]["policy"]["default"] == "peek"
    assert spec["placement"]["properties"]["ipc"]["default"] == "isolated"
    assert spec["router"]["properties"]["algorithm"]["default"] == "prefix-affinity"
    assert spec["autoscaling"]["properties"]["backend"]["enum"] == ["keda", "hpa"]
    assert spec["engine"]["default"] == {}  # so the API server fills in the engine's fields


def test_api_server_defaulting_agrees_with_pydantic() -> None:
    """A minimal body defaulted by the CRD schema parses to the same model as without it."""
    schema = _schema(crd.prefixserving_crd())
    (body,) = example_documents("minimal")
    defaulted = apply_defaults(schema, copy.deepcopy(body))
    assert defaulted["spec"]["engine"]["blockSize"] == 16
    assert defaulted["spec"]["placement"]["shm"]["sizeLimit"] == "16Gi"
    assert parse_resource(defaulted) == parse_resource(body)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.stem)
def test_examples_pass_the_crd_schema_and_cel_rules(path: Path) -> None:
    validators = {
        constants.KIND: CrdValidator(crd.prefixserving_crd()),
        constants.POLICY_KIND: CrdValidator(crd.scaling_policy_crd()),
    }
    parsers = {constants.KIND: parse_resource, constants.POLICY_KIND: parse_scaling_policy}
    for doc in yaml.safe_load_all(path.read_text()):
        if not doc:
            continue
        assert validators[doc["kind"]].errors(doc) == []
        parsers[doc["kind"]](doc)


@pytest.mark.parametrize("file_name", sorted(crd.crds()))
def test_every_default_validates_against_its_own_schema(file_name: str) -> None:
    """The API server refuses a CRD whose defaults do not match their schema (after its own
    defaulting of the default value)."""
    import jsonschema

    for _path, node in _walk(_schema(crd.crds()[file_name])):
        if "default" in node:
            schema = {k: v for k, v in node.items() if k != "default"}
            value = apply_defaults(schema, copy.deepcopy(node["default"]))
            jsonschema.Draft202012Validator(json_schema(schema)).validate(value)


def test_cel_rules_name_existing_fields() -> None:
    """Each rule's fieldPath points at a property of the node the rule sits on."""
    for generated in crd.crds().values():
        for path, node in _walk(_schema(generated)):
            for rule in node.get("x-kubernetes-validations", []):
                if "fieldPath" in rule:
                    target = node
                    for part in rule["fieldPath"].strip(".").split("."):
                        target = target["properties"][part]
                    assert target, (path, rule)


@pytest.mark.parametrize("version", ["1.29", "1.35"])
@pytest.mark.parametrize("path", sorted(CHART_CRDS.glob("*.yaml")), ids=lambda p: p.name)
def test_crd_manifests_pass_the_kubernetes_schema(path: Path, version: str) -> None:
    """The CRD objects themselves (field names such as fieldPath, printer columns) are valid
    apiextensions.k8s.io/v1 for both Kubernetes versions."""
    from api_support import assert_all_valid

    assert_all_valid([d for d in yaml.safe_load_all(path.read_text()) if d], version)
