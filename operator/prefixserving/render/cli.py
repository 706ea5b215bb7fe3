"""``prefixserving render``: print a PrefixServing's child objects as a YAML stream."""

from __future__ import annotations

import sys
from pathlib import Path

import click
import yaml

from prefixserving import constants
from prefixserving.api.cli import load_documents
from prefixserving.api.types import ScalingPolicy
from prefixserving.api.validation import SpecError, parse_resource, parse_scaling_policy
from prefixserving.render.children import render_children


def _policy(path: Path | None, wanted: str | None, docs: list[dict]) -> ScalingPolicy | None:
    """The ScalingPolicy named ``wanted``, from ``--policy`` or from the resource file itself."""
    candidates = [d for d in docs if d.get("kind") == constants.POLICY_KIND]
    if path is not None:
        candidates += [d for d in load_documents(path) if d.get("kind") == constants.POLICY_KIND]
    policies = [parse_scaling_policy(d) for d in candidates]
    if wanted is None:
        return None
    for policy in policies:
        if policy.metadata.name == wanted:
            return policy
    if path is not None and len(policies) == 1:
        return policies[0]
    raise click.ClickException(
        f"spec.autoscaling.policyRef names ScalingPolicy {wanted!r}, which was not given:"
        f" pass it with --policy FILE"
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

    \b
    Examples:
      prefixserving render -f examples/minimal.yaml
      prefixserving render -f my-model.yaml --policy examples/scalingpolicy-latency-first.yaml
    """
    docs = load_documents(path)
    resources = [d for d in docs if d.get("kind") != constants.POLICY_KIND]
    if len(resources) != 1:
        raise click.ClickException(f"{path}: expected one PrefixServing, found {len(resources)}")
    try:
        resource = parse_resource(resources[0])
        ref = resource.spec.autoscaling.policy_ref
        policy = _policy(policy_path, ref.name if ref is not None else None, docs)
        children = render_children(resource, policy.spec if policy is not None else None)
    except SpecError as error:
        click.echo(f"{path}: invalid, nothing rendered", err=True)
        for problem in error.problems:
            click.echo(f"  {problem}", err=True)
        sys.exit(1)
    click.echo(yaml.safe_dump_all(children, sort_keys=False, width=1000), nl=False)
