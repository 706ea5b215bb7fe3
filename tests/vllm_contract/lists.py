"""The contract's two lists: ``deselected.toml`` (tests that cannot run on a CPU-only machine) and
``judged.toml`` (tests that fail with PEEK on, each judged), and their Markdown rendering for
``docs/peek.md``.

``PYTHONPATH=tests python -m vllm_contract.lists --write docs/peek.md`` (``make docs``) rewrites
the part of ``docs/peek.md`` between :data:`BEGIN` and :data:`END`; a test checks it is current.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HARNESS = Path(__file__).resolve().parent
DESELECTED_FILE = HARNESS / "deselected.toml"
JUDGED_FILE = HARNESS / "judged.toml"
BEGIN = "<!-- vllm-contract-lists: generated from tests/vllm_contract/*.toml by `make docs` -->"
END = "<!-- vllm-contract-lists: end -->"


@dataclass(frozen=True, slots=True)
class Deselection:
    """A test deselected in one release: its group in ``deselected.toml`` (0, 1, ...), why, and
    what its stock failure message contains (None for a group whose failure depends on the
    machine, which the stock run does not check)."""

    test_id: str
    group: int
    reason: str
    fails_with: str | None


@dataclass(frozen=True, slots=True)
class Judgement:
    """A test that fails with PEEK on in some releases: what it asserts, what PEEK does instead
    and why, and the verdict: ``intended`` (an ordering difference PEEK is designed to make) or
    ``defect`` (to be fixed in PEEK; the list then drops it)."""

    test_id: str
    versions: tuple[str, ...]
    cause: str
    asserts: str
    peek: str
    verdict: str


VERDICTS = ("intended", "defect")


def _groups(path: Path) -> list[dict]:
    return tomllib.loads(path.read_text()).get("group", [])


def deselected(version: str) -> dict[str, Deselection]:
    """The tests deselected in ``version``, by id."""
    out = {}
    for number, group in enumerate(_groups(DESELECTED_FILE)):
        ids = [*group["ids"], *group.get("only", {}).get(version, [])]
        for test_id in ids:
            out[test_id] = Deselection(test_id, number, group["reason"], group.get("fails_with"))
    return out


def judgements() -> list[Judgement]:
    """Every entry of ``judged.toml``, in file order."""
    out = []
    for group in _groups(JUDGED_FILE):
        for entry in group["test"]:
            judgement = Judgement(
                test_id=entry["id"],
                versions=tuple(entry["versions"]),
                cause=group["cause"],
                asserts=entry["asserts"],
                peek=entry["peek"],
                verdict=group["verdict"],
            )
            if judgement.verdict not in VERDICTS:
                raise ValueError(f"{JUDGED_FILE}: verdict must be one of {VERDICTS}")
            out.append(judgement)
    return out


def judged(version: str) -> dict[str, Judgement]:
    """The judged PEEK-on failures of ``version``, by id."""
    return {j.test_id: j for j in judgements() if version in j.versions}


def _short(test_id: str) -> str:
    return test_id.removeprefix("tests/v1/core/")


def render_markdown() -> str:
    """The deselected and judged tests as Markdown (without the markers)."""
    lines = ["### Deselected: cannot run on a CPU-only machine, or time the machine", ""]
    for group in _groups(DESELECTED_FILE):
        lines += [group["reason"], ""]
        for label, ids in [("All releases", group["ids"]), *group.get("only", {}).items()]:
            if ids:
                lines += [f"{label if label == 'All releases' else 'Only ' + label}:", ""]
                lines += [f"- `{_short(i)}`" for i in ids]
                lines.append("")
    lines += ["### PEEK on: every difference from stock, judged", ""]
    groups = _groups(JUDGED_FILE)
    if not groups:
        lines += ["None.", ""]
    for group in groups:
        lines += [f"**{group['cause']}** (verdict: {group['verdict']}). {group['why']}", ""]
        for entry in group["test"]:
            versions = ", ".join(entry["versions"])
            lines.append(
                f"- `{_short(entry['id'])}` ({versions}): {entry['asserts']} {entry['peek']}"
            )
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def replace_section(text: str, body: str) -> str:
    """``text`` with everything between :data:`BEGIN` and :data:`END` replaced by ``body``."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:start] + "\n" + body + text[end:]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllm_contract.lists")
    parser.add_argument("--write", type=Path, help="rewrite the generated section of this file")
    args = parser.parse_args(argv)
    body = render_markdown()
    if args.write is None:
        print(body, end="")
    else:
        args.write.write_text(replace_section(args.write.read_text(), body))
    return 0


if __name__ == "__main__":
    sys.exit(main())
