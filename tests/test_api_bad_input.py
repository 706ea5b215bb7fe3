"""``prefixserving validate`` and ``render`` on broken files, as a new user would feed them:
each gets a short message naming the file, the document, the line or field and the fix, exit
status 1, and ``render`` prints nothing on stdout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner, Result

from prefixserving.api import documents
from prefixserving.api.cli import MAX_DOCUMENTS_SHOWN, MAX_PROBLEMS_SHOWN
from prefixserving.cli import main
from render_examples import EXAMPLES

MINIMAL = (EXAMPLES / "minimal.yaml").read_text()


def nested_block(levels: int) -> str:
    return "".join("  " * i + "a:\n" for i in range(levels))


def laughs(levels: int) -> str:
    """A "billion laughs" file: each level lists the previous one nine times."""
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


# name -> (file content, fragments the message must contain)
CASES: dict[str, tuple[bytes, list[str]]] = {
    "not UTF-8": (b"\xff\xfekind: PrefixServing\n", ["not UTF-8 text: byte 0xff at offset 0"]),
    "UTF-16": ("kind: PrefixServing\n".encode("utf-16"), ["not UTF-8", "iconv -f UTF-16"]),
    "not YAML": (b"spec: [unclosed\n", ["document 1, line 2", "not valid YAML"]),
    "tab indentation": (b"spec:\n\tmodel: x\n", ["line 2", "not valid YAML"]),
    "nested thousands deep (flow)": (
        b"[" * 5000 + b"]" * 5000,
        [f"nested more than {documents.MAX_DEPTH} levels deep"],
    ),
    "nested deep (block)": (
        nested_block(documents.MAX_DEPTH + 10).encode(),
        [f"nested more than {documents.MAX_DEPTH} levels deep at ...a.a"],
    ),
    "huge": (
        b"a: " + b"x" * documents.MAX_BYTES,
        ["larger than 4 MiB, the most this command reads", "split the file"],
    ),
    "empty": (b"", ["no PrefixServing or ScalingPolicy in the file"]),
    "only comments": (b"# nothing here\n\n", ["no PrefixServing or ScalingPolicy"]),
    "only ---": (b"---\n---\n", ["no PrefixServing or ScalingPolicy"]),
    "scalar at the top": (b"42\n", ["document 1 (line 1): invalid", "a number, not a Kubernetes"]),
    "string at the top": (b"hello\n", ["a string, not a Kubernetes object"]),
    "list at the top": (b"- a\n- b\n", ["a list, not a Kubernetes object"]),
    "unknown kind": (
        b"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: web}\n",
        ["Deployment web: invalid", "kind: 'Deployment' is not PrefixServing or ScalingPolicy"],
    ),
    "unknown apiVersion": (
        MINIMAL.replace("prefixserving.io/v1alpha1", "prefixserving.io/v2").encode(),
        ["PrefixServing qwen-chat: invalid", "apiVersion: Input should be"],
    ),
    "metadata not a mapping": (
        b"apiVersion: prefixserving.io/v1alpha1\nkind: PrefixServing\nmetadata: [x]\n",
        ["PrefixServing: invalid", "metadata: Input should be a valid dictionary"],
    ),
    "repeated key": (
        (MINIMAL + "  replicas: 3\n").encode(),
        ["document 1, line 15: spec.replicas is set twice (also on line 14)", "keep one"],
    ),
    "control characters": (b"kind: Prefix\x00Serving\n", ["#x0000", "not allowed in YAML"]),
    "billion laughs": (laughs(9).encode(), [f"more than {documents.MAX_NODES} values"]),
    "alias cycle": (b"a: &x [1, *x]\n", ["alias *x at a[1] is inside the node &x names"]),
    "undefined alias": (b"a: *nowhere\n", ["not valid YAML", "undefined alias"]),
    "list as a key": (b"? [a, b]\n: 1\n", ["not valid YAML", "unhashable key"]),
    "python tag": (b"a: !!python/object/apply:os.system [ls]\n", ["not valid YAML"]),
}


def invoke(*args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(main, list(args), input=stdin)


def assert_refused(result: Result, fragments: list[str]) -> None:
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output
    for fragment in fragments:
        assert fragment in result.stderr, (fragment, result.stderr)
    assert len(result.stderr.splitlines()) <= 30  # one screen


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("command", ["validate", "render"])
def test_broken_file_gets_a_message_and_exit_1(tmp_path: Path, command: str, case: str) -> None:
    content, fragments = CASES[case]
    file = tmp_path / "input.yaml"
    file.write_bytes(content)
    result = invoke(command, "-f", str(file))
    assert_refused(result, [*fragments])
    assert str(file) in result.stderr
    if command == "render":
        assert result.stdout == ""


@pytest.mark.parametrize("case", ["not UTF-8", "billion laughs", "empty", "list at the top"])
def test_stdin_gets_the_same_messages(case: str) -> None:
    content, fragments = CASES[case]
    result = invoke("validate", "-f", "-", stdin=content)
    assert_refused(result, fragments)
    assert "stdin: " in result.stderr


def test_several_documents_each_bad_one_is_reported_and_nothing_rendered(tmp_path: Path) -> None:
    bad_resource = yaml.safe_load(MINIMAL)
    bad_resource["spec"]["engine"] = {"gpus": 0}
    text = "---\n".join(
        [MINIMAL, "- not\n- an object\n", yaml.safe_dump(bad_resource), "kind: Service\n"]
    )
    file = tmp_path / "several.yaml"
    file.write_text(text)

    result = invoke("validate", "-f", str(file))
    assert_refused(result, ["document 2 (line 16): invalid", "spec.engine.gpus"])
    assert "document 1 (line 3): PrefixServing qwen-chat: valid" in result.stdout
    assert "document 3 (line 19): PrefixServing qwen-chat: invalid" in result.stderr
    assert "document 4 (line 34): Service: invalid" in result.stderr

    result = invoke("render", "-f", str(file))
    assert_refused(result, ["document 2", "document 3", "document 4", "nothing rendered"])
    assert result.stdout == ""


def test_a_policy_file_with_a_bad_document_renders_nothing(tmp_path: Path) -> None:
    resource, policy = (EXAMPLES / "autoscaled-hpa.yaml").read_text().split("---\n")[-1], "7\n"
    (tmp_path / "resource.yaml").write_text(resource)
    (tmp_path / "policy.yaml").write_text(policy)
    result = invoke(
        "render", "-f", str(tmp_path / "resource.yaml"), "--policy", str(tmp_path / "policy.yaml")
    )
    assert_refused(result, ["policy.yaml: document 1 (line 1): invalid, nothing rendered"])
    assert result.stdout == ""


def test_a_document_with_hundreds_of_problems_fits_one_screen(tmp_path: Path) -> None:
    body = yaml.safe_load(MINIMAL)
    body["spec"].update({f"typo{i}": i for i in range(300)})
    file = tmp_path / "typos.yaml"
    file.write_text(yaml.safe_dump(body))
    result = invoke("validate", "-f", str(file))
    hidden = 300 - MAX_PROBLEMS_SHOWN
    assert_refused(result, [f"... and {hidden} more problems: fix these and run again"])


def test_a_file_with_thousands_of_bad_documents_fits_one_screen(tmp_path: Path) -> None:
    file = tmp_path / "many.yaml"
    file.write_text("---\n".join(["- 1\n"] * 5000))
    for command in ("validate", "render"):
        result = invoke(command, "-f", str(file))
        hidden = 5000 - MAX_DOCUMENTS_SHOWN
        assert_refused(result, [f"... and {hidden} more invalid documents: fix these"])


def test_keys_repeated_in_different_mappings_are_fine(tmp_path: Path) -> None:
    file = tmp_path / "ok.yaml"
    file.write_text(MINIMAL + "---\n" + MINIMAL.replace("qwen-chat", "other"))
    result = invoke("validate", "-f", str(file))
    assert result.exit_code == 0, result.output
    assert result.stdout.count(": valid") == 2


def test_aliases_within_the_limits_still_work(tmp_path: Path) -> None:
    body = yaml.safe_load(MINIMAL)
    text = yaml.safe_dump(body).replace(
        "servedName: qwen2.5-7b-instruct", "servedName: &name qwen2.5-7b-instruct"
    )
    text += "  warmup:\n    enabled: true\n    prompts:\n    - prompt: *name\n"
    file = tmp_path / "aliases.yaml"
    file.write_text(text)
    result = invoke("validate", "-f", str(file))
    assert result.exit_code == 0, result.output


def test_characters_beyond_the_bmp_and_line_separators_render(tmp_path: Path) -> None:
    """Valid input that once broke the renderer: JSON escapes an emoji as a surrogate pair,
    which YAML refuses; NEL and LS are line breaks to YAML."""
    prompt = "Answer kindly 🙂, line\u2028separator, next\x85line, bom\ufeff"
    body = yaml.safe_load((EXAMPLES / "warmup.yaml").read_text())
    body["spec"]["warmup"]["prompts"] = [{"prompt": prompt}]
    file = tmp_path / "emoji.yaml"
    file.write_text(yaml.safe_dump(body, allow_unicode=True))
    result = invoke("render", "-f", str(file))
    assert result.exit_code == 0, result.output
    (config,) = [o for o in yaml.safe_load_all(result.stdout) if o["kind"] == "ConfigMap"]
    assert json.loads(config["data"]["prompts.json"]) == [{"prompt": prompt}]
