"""The jinja2 environment over the top-level ``templates/`` folder.

``templates`` beside this module is a link to the repository's ``templates/``: the editable
install and ``PYTHONPATH=operator`` read the files through it, and a wheel built where the link
resolves (a checkout, or an image build stage that copies ``templates/`` beside ``operator/``)
carries the files themselves. ``PREFIXSERVING_TEMPLATES`` overrides the folder.

The folder is loaded when this module is imported, that is when the operator or
``prefixserving render`` starts: every ``*.j2`` in it is parsed and compiled once, and a folder
that is missing or holds no template raises :class:`TemplatesMissingError` naming the folder and
the fix, instead of every reconcile failing later. Cost: one parse and compile per template
(14 templates: about 20 ms), once per folder.

Templates pass every value through ``tojson`` (JSON is YAML), and ``StrictUndefined`` turns a
missing value into an error instead of an empty string; the text is then ``yaml.safe_load``-ed.

``tojson`` writes characters as they are and escapes only those YAML does not allow unescaped
(:func:`yaml_json_dumps`): JSON's escapes of characters beyond U+FFFF are surrogate pairs
(``\\ud83d\\ude42``), which YAML refuses, so a single emoji in a warm-up prompt would make
the resource impossible to render.
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import jinja2
import yaml

TEMPLATES_ENV = "PREFIXSERVING_TEMPLATES"
TEMPLATE_GLOB = "*.j2"


class TemplatesMissingError(RuntimeError):
    """The templates folder does not exist or holds no template."""


# Resolved once: every render asks for the folder, and resolving walks the path's links.
PACKAGE_TEMPLATES = Path(__file__).resolve().parent / "templates"


def templates_dir() -> Path:
    """Folder the templates are read from."""
    override = os.environ.get(TEMPLATES_ENV)
    return Path(override) if override else PACKAGE_TEMPLATES


# Characters a YAML scalar may not hold as they are: outside YAML's printable set (YAML 1.1,
# 5.1), line breaks other than JSON's (NEL, LS, PS: a quoted scalar would fold them) and the
# byte-order mark.
_YAML_ESCAPE = re.compile(
    "[^\t\n\r\x20-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd\U00010000-\U0010ffff]"
)


def yaml_json_dumps(obj: Any, **kwargs: Any) -> str:
    """JSON that is also valid YAML for any string: characters written as they are, except
    those YAML needs escaped (all in the BMP, so one ``\\uXXXX`` each). Cost: one dump plus
    one regex pass over its output."""
    text = json.dumps(obj, ensure_ascii=False, **kwargs)
    return _YAML_ESCAPE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


@functools.lru_cache(maxsize=4)
def load_templates(folder: str) -> jinja2.Environment:
    """The environment over ``folder``, with every template in it already compiled.

    Raises TemplatesMissingError when ``folder`` is not a directory or has no ``*.j2`` file
    (a package built without ``templates/``), and jinja2's TemplateSyntaxError for a template
    that does not parse.
    """
    path = Path(folder)
    names = sorted(p.name for p in path.glob(TEMPLATE_GLOB)) if path.is_dir() else []
    if not names:
        raise TemplatesMissingError(
            f"prefixserving's templates are missing: no {TEMPLATE_GLOB} file in {path}. "
            f"If {TEMPLATES_ENV} is set, point it at a folder of templates; otherwise this "
            "package was built without the repository's templates/ folder: reinstall it from "
            "a checkout (pip install .) or rebuild the image (make images)."
        )
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        # Compiled once here; no file's modification time is checked again at each render.
        auto_reload=False,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.policies["json.dumps_function"] = yaml_json_dumps
    for name in names:
        environment.get_template(name)
    return environment


def render_template(name: str, context: dict[str, Any]) -> dict[str, Any]:
    """Render one template into one Kubernetes object (a dict)."""
    text = load_templates(str(templates_dir())).get_template(name).render(**context)
    # libyaml's safe loader when available: ~10x faster than pure Python, same result.
    obj = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if not isinstance(obj, dict):
        raise ValueError(f"template {name} did not produce one object")
    return obj


# At start (the operator imports the renderer before kopf runs), not at the first reconcile.
load_templates(str(templates_dir()))
