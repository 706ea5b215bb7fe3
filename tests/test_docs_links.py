"""Every relative link in README.md, docs/ and the chart's README leads somewhere.

A link ``[text](path)`` or ``[text](path#anchor)`` must name a file or folder that exists,
relative to the page; an anchor (``#anchor`` alone: on the same page) must be the slug of a
heading of the target page, as GitHub makes it (:func:`heading_slugs`). External links
(``http``, ``https``, ``mailto``) are not fetched. Links inside code blocks and code spans are
not links.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from docs_support import DOC_FILES, ROOT

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"`[^`]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def outside_fences(text: str) -> Iterator[str]:
    """The page's lines outside fenced code blocks."""
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            yield line


def prose_lines(text: str) -> list[str]:
    """The page's lines outside fenced code blocks, with code spans blanked."""
    return [CODE_SPAN.sub("", line) for line in outside_fences(text)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link targets and emphasis dropped, lower case, every
    character but letters, digits, ``_``, ``-`` and spaces removed, spaces made ``-``."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[*`]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def heading_slugs(page: Path) -> set[str]:
    """Anchors of every heading of ``page``; a repeated slug gets ``-1``, ``-2``... as on
    GitHub."""
    seen: dict[str, int] = {}
    slugs: set[str] = set()
    for line in outside_fences(page.read_text()):
        match = HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        slugs.add(base if count == 0 else f"{base}-{count}")
    return slugs


def relative_links(page: Path) -> list[str]:
    return [
        target
        for line in prose_lines(page.read_text())
        for target in LINK.findall(line)
        if not re.match(r"[a-z]+:", target)
    ]


def broken(page: Path, target: str) -> str | None:
    """Why ``target`` (a link on ``page``) leads nowhere, or None."""
    path_part, _, anchor = target.partition("#")
    destination = (page.parent / path_part).resolve() if path_part else page
    if not destination.exists():
        return f"{destination.relative_to(ROOT)} does not exist"
    if anchor and destination.suffix == ".md" and anchor not in heading_slugs(destination):
        return f"{destination.relative_to(ROOT)} has no heading with the anchor #{anchor}"
    return None


@pytest.mark.parametrize("page", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_lead_somewhere(page: Path) -> None:
    problems = [
        f"({target}): {why}"
        for target in relative_links(page)
        if (why := broken(page, target)) is not None
    ]
    assert not problems, f"{page.relative_to(ROOT)}: " + "; ".join(problems)


def test_the_checks_catch_a_missing_file_and_a_wrong_anchor() -> None:
    page = ROOT / "docs" / "README.md"
    assert broken(page, "architecture.md") is None
    assert broken(page, "no-such-page.md") is not None
    assert broken(ROOT / "README.md", "#quickstart-on-a-cluster") is None
    assert broken(ROOT / "README.md", "#no-such-heading") is not None


def test_slugs_follow_github() -> None:
    assert slug("PEEK at full size") == "peek-at-full-size"
    assert slug("Eviction guard (`peek/guard.py`)") == "eviction-guard-peekguardpy"
    assert slug("The local stack (`make demo`) — [demo.md](bench/results/demo.md)") == (
        "the-local-stack-make-demo--demomd"
    )
