"""``prefixserving crd`` and ``prefixserving validate``."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import click

from prefixserving import constants
from prefixserving.api import crd as crd_module
from prefixserving.api.documents import Document, InputError, read_documents, source_name
from prefixserving.api.types import PrefixServing, ScalingPolicy
from prefixserving.api.validation import (
    Problem,
    SpecError,
    parse_resource,
    parse_scaling_policy,
)


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


# What is printed of the problems, so that a hostile file cannot fill the terminal: the
# problems of at most MAX_DOCUMENTS_SHOWN documents, at most MAX_PROBLEMS_SHOWN of each.
MAX_DOCUMENTS_SHOWN = 4
MAX_PROBLEMS_SHOWN = 8
# Longest line printed for one problem (a key or value can be megabytes long).
MAX_PROBLEM_CHARS = 400

# What a document that is not a mapping is, in YAML's words (by exact type: bool is an int).
_YAML_TYPES: dict[type, str] = {
    list: "list",
    str: "string",
    int: "number",
    float: "number",
    bool: "boolean",
    bytes: "binary value",
    datetime.date: "date",
    datetime.datetime: "timestamp",
}


def load_documents(path: Path) -> list[Document]:
    """The non-empty YAML documents of a file ('-': stdin); exits 1 with every problem (see
    ``api.documents``) when the file cannot be read as YAML."""
    try:
        return read_documents(path)
    except InputError as error:
        raise click.ClickException(str(error)) from None


def check_document(doc: Document) -> PrefixServing | ScalingPolicy:
    """Validate one document as a PrefixServing or ScalingPolicy, chosen by its ``kind``.

    Raises SpecError for anything else: a document that is not a mapping, another kind, and
    every problem of a PrefixServing or ScalingPolicy.
    """
    body = doc.body
    if not isinstance(body, dict):
        kind = _YAML_TYPES.get(type(body), type(body).__name__)
        raise SpecError(
            [
                Problem(
                    "(top level)",
                    f"a {kind}, not a Kubernetes object",
                    "each document is a mapping with apiVersion, kind, metadata and spec;"
                    " see examples/minimal.yaml",
                )
            ]
        )
    kind = body.get("kind")
    if kind == constants.POLICY_KIND:
        return parse_scaling_policy(body)
    if kind == constants.KIND:
        return parse_resource(body)
    raise SpecError(
        [
            Problem(
                "kind",
                f"{kind!r} is not {constants.KIND} or {constants.POLICY_KIND}"
                f" ({constants.API_VERSION})",
                "this command checks only those kinds: fix the kind, or keep other objects in"
                " another file",
            )
        ]
    )


def describe(doc: Document) -> str:
    """``document N (line L)``, then ``Kind name`` as far as the document says them."""
    body = doc.body if isinstance(doc.body, dict) else {}
    kind = body.get("kind")
    metadata = body.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    words = [word[:64] for word in (kind, name) if isinstance(word, str) and word]
    return doc.where + (": " + " ".join(words) if words else "")


class ProblemReport:
    """The problems of a file's documents on stderr, within the limits above; ``verdict``
    follows each document's name (e.g. ``invalid``)."""

    def __init__(self, source: str, verdict: str) -> None:
        self.source = source
        self.verdict = verdict
        self.invalid = 0

    def add(self, doc: Document, error: SpecError) -> None:
        self.invalid += 1
        if self.invalid > MAX_DOCUMENTS_SHOWN:
            return
        click.echo(f"{self.source}: {describe(doc)}: {self.verdict}", err=True)
        for problem in error.problems[:MAX_PROBLEMS_SHOWN]:
            text = str(problem)
            if len(text) > MAX_PROBLEM_CHARS:
                text = text[: MAX_PROBLEM_CHARS - 3] + "..."
            click.echo(f"  {text}", err=True)
        hidden = len(error.problems) - MAX_PROBLEMS_SHOWN
        if hidden > 0:
            click.echo(f"  ... and {hidden} more problems: fix these and run again", err=True)

    def close(self) -> None:
        """Count the invalid documents not shown."""
        hidden = self.invalid - MAX_DOCUMENTS_SHOWN
        if hidden > 0:
            click.echo(
                f"{self.source}: ... and {hidden} more invalid documents: fix these and run again",
                err=True,
            )


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
    source = source_name(path)
    report = ProblemReport(source, "invalid")
    for doc in load_documents(path):
        try:
            check_document(doc)
        except SpecError as error:
            report.add(doc, error)
        else:
            click.echo(f"{source}: {describe(doc)}: valid")
    report.close()
    if report.invalid:
        sys.exit(1)
