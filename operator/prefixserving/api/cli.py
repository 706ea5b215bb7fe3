"""``prefixserving crd`` and ``prefixserving validate``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click
import yaml

from prefixserving import constants
from prefixserving.api import crd as crd_module
from prefixserving.api.validation import SpecError, parse_resource, parse_scaling_policy


@click.command()
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write one file per CRD here (e.g. crds/) instead of printing them.",
)
def crd(out_dir: Path | None) -> None:
    """Print (or write) the PrefixServing and ScalingPolicy CRDs generated from the API models.

    \b
    Examples:
      prefixserving crd | kubectl apply --server-side -f -
      prefixserving crd --out-dir crds/
    """
    try:
        if out_dir is None:
            click.echo(
                "---\n".join(crd_module.dump(c) for c in crd_module.crds().values()), nl=False
            )
            return
        for path in crd_module.write(out_dir):
            click.echo(f"wrote {path}")
    except crd_module.CrdRejected as exc:  # nothing was written: write() generates all first
        raise click.ClickException(str(exc)) from exc


def load_documents(path: Path) -> list[dict[str, Any]]:
    """Every non-empty YAML document of a file ('-' reads stdin); exits 1 on a YAML error or a
    document that is not a mapping."""
    text = sys.stdin.read() if str(path) == "-" else path.read_text()
    try:
        docs = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        raise click.ClickException(f"{path}: not valid YAML: {error}") from None
    for index, doc in enumerate(docs):
        if not isinstance(doc, dict):
            raise click.ClickException(
                f"{path}: document {index} is a {type(doc).__name__}, not a Kubernetes object"
            )
    return docs


def check_document(doc: dict[str, Any]) -> Any:
    """Validate one document as a PrefixServing or ScalingPolicy by its kind."""
    if doc.get("kind") == constants.POLICY_KIND:
        return parse_scaling_policy(doc)
    return parse_resource(doc)


@click.command()
@click.option(
    "-f",
    "--file",
    "path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path, allow_dash=True),
    help="YAML file with PrefixServing and/or ScalingPolicy documents ('-': stdin).",
)
def validate(path: Path) -> None:
    """Check resources; print every problem with its field path and a hint; exit 1 if any.

    \b
    Examples:
      prefixserving validate -f my-model.yaml
      kubectl get pfx my-model -o yaml | prefixserving validate -f -
    """
    failed = False
    for index, doc in enumerate(load_documents(path)):
        name = (doc.get("metadata") or {}).get("name", f"document {index}")
        try:
            check_document(doc)
        except SpecError as error:
            failed = True
            click.echo(f"{path}: {doc.get('kind', '?')} {name}: invalid", err=True)
            for problem in error.problems:
                click.echo(f"  {problem}", err=True)
        else:
            click.echo(f"{path}: {doc.get('kind')} {name}: valid")
    if failed:
        sys.exit(1)
