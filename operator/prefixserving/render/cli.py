"""``prefixserving render``: print a PrefixServing's child objects as a YAML stream."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import yaml

from prefixserving.api.cli import ProblemReport, check_document, load_documents
from prefixserving.api.documents import source_name
from prefixserving.api.types import PrefixServing, ScalingPolicy
from prefixserving.api.validation import SpecError
from prefixserving.render.children import render_children

NOTHING_RENDERED = "invalid, nothing rendered"


def _checked(path: Path) -> tuple[list[PrefixServing | ScalingPolicy], bool]:
    """Every document of ``path`` validated; problems go to stderr. Returns the resources and
    whether all documents were valid."""
    report = ProblemReport(source_name(path), NOTHING_RENDERED)
    out: list[PrefixServing | ScalingPolicy] = []
    for doc in load_documents(path):
        try:
            out.append(check_document(doc))
        except SpecError as error:
            report.add(doc, error)
    report.close()
    return out, report.invalid == 0


def _policy(
    source: str, wanted: str | None, policies: list[ScalingPolicy], from_file: bool
) -> ScalingPolicy | None:
    """The ScalingPolicy named ``wanted``; a ``--policy`` file with one policy is taken as it.
    ``source`` names the resource's file in the error."""
    if wanted is None:
        return None
    for policy in policies:
        if policy.metadata.name == wanted:
            return policy
    if from_file and len(policies) == 1:
        return policies[0]
    raise click.ClickException(
        f"{source}: spec.autoscaling.policyRef names ScalingPolicy {wanted!r}, which was not given:"
        f" pass it with --policy FILE; nothing rendered"
    )


@click.command()
@click.option(
    "-f",
    "--file",
    "path",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path, allow_dash=True),
    help="YAML file with one PrefixServing (and optionally its ScalingPolicy).",
)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help="YAML file with the ScalingPolicy that spec.autoscaling.policyRef names.",
)
def render(path: Path, policy_path: Path | None) -> None:
    """Print the objects the operator would create for a PrefixServing (a GitOps preview).

    Prints nothing on stdout, and exits 1, when any document of the files is invalid.

    \b
    Examples:
      prefixserving render -f examples/minimal.yaml
      prefixserving render -f my-model.yaml --policy examples/scalingpolicy-latency-first.yaml
    """
    source = source_name(path)
    documents, valid = _checked(path)
    policies = [d for d in documents if isinstance(d, ScalingPolicy)]
    if policy_path is not None:
        extra, extra_valid = _checked(policy_path)
        valid = valid and extra_valid
        stray = [d.metadata.name for d in extra if isinstance(d, PrefixServing)]
        if stray:
            raise click.ClickException(
                f"{source_name(policy_path)}: --policy takes ScalingPolicy documents, found"
                f" PrefixServing {', '.join(stray)}; pass that file with -f"
            )
        policies += [d for d in extra if isinstance(d, ScalingPolicy)]
    if not valid:
        sys.exit(1)
    resources = [d for d in documents if isinstance(d, PrefixServing)]
    if len(resources) != 1:
        names = ", ".join(r.metadata.name for r in resources)
        raise click.ClickException(
            f"{source}: expected one PrefixServing, found {len(resources)}"
            + (f" ({names}): render them one file at a time" if resources else "")
        )
    (resource,) = resources
    ref = resource.spec.autoscaling.policy_ref
    wanted = ref.name if ref is not None else None
    policy = _policy(source, wanted, policies, policy_path is not None)
    children = render_children(resource, policy.spec if policy is not None else None)
    click.echo(yaml.safe_dump_all(children, sort_keys=False, width=1000), nl=False)
