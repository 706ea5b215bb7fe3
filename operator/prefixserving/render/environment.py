"""The jinja2 environment over the top-level ``templates/`` folder.

``templates`` beside this module is a link to the repository's ``templates/`` (the wheel
carries the files themselves). ``PREFIXSERVING_TEMPLATES`` overrides the folder.
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


def templates_dir() -> Path:
    """Folder the templates are read from."""
    override = os.environ.get(TEMPLATES_ENV)
    return Path(override) if override else Path(__file__).resolve().parent / "templates"


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
def _environment(folder: str) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(folder),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.policies["json.dumps_function"] = yaml_json_dumps
    return env


def render_template(name: str, context: dict[str, Any]) -> dict[str, Any]:
    """Render one template into one Kubernetes object (a dict)."""
    text = _environment(str(templates_dir())).get_template(name).render(**context)
    # libyaml's safe loader when available: ~10x faster than pure Python, same result.
    obj = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    if not isinstance(obj, dict):
        raise ValueError(f"template {name} did not produce one object")
    return obj
