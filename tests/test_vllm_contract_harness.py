"""The harness that runs vLLM's scheduler tests against PEEK (``tests/vllm_contract/``): what the
download step keeps, the Hugging Face home it builds, and the plugin's scheduler swap, run on a
small test tree laid out like vLLM's."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest
from huggingface_hub import try_to_load_from_cache

from vllm_contract import fetch
from vllm_contract.fetch import Artifact, FetchError, Release
from vllm_contract.runner import (
    HF_CONFIGS,
    MODES,
    build_hf_home,
    command,
    environment,
)

ELF_HEADER = b"\x7fELF\x02\x01\x01" + bytes(9)


def _artifact(path: Path) -> Artifact:
    return Artifact(url=path.as_uri(), sha256=hashlib.sha256(path.read_bytes()).hexdigest())


def _sdist(path: Path, members: dict[str, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"vllm-9.9.9/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as whl:
        for name, data in members.items():
            whl.writestr(name, data)
    return path


SDIST = {
    "setup.py": b"",
    "tests/__init__.py": b"",
    "tests/conftest.py": b"import heavy_test_dependency\n",
    "tests/v1/__init__.py": b"",
    "tests/v1/core/__init__.py": b"",
    "tests/v1/core/utils.py": b"",
    "tests/v1/core/prefix_cache/helper.py": b"",
    "tests/v1/engine/test_engine.py": b"",
    "tests/v1/kv_connector/__init__.py": b"",
    "tests/v1/kv_connector/unit/__init__.py": b"",
    "tests/v1/kv_connector/unit/utils.py": b"",
    "tests/v1/kv_connector/unit/test_connector.py": b"",
}


def test_download_checks_the_pinned_sha256(tmp_path: Path) -> None:
    source = tmp_path / "vllm-9.9.9.tar.gz"
    source.write_bytes(b"release")
    (tmp_path / "out").mkdir()
    got = fetch.download(_artifact(source), tmp_path / "out")
    assert got.read_bytes() == b"release"
    wrong = Artifact(url=source.as_uri(), sha256="0" * 64)
    with pytest.raises(FetchError, match=r"sha256 is .* releases.toml pins 0{64}"):
        fetch.download(wrong, tmp_path / "out")


def test_download_failure_names_the_url(tmp_path: Path) -> None:
    missing = Artifact(url=(tmp_path / "absent.tar.gz").as_uri(), sha256="0" * 64)
    with pytest.raises(FetchError, match=r"could not download file://.*absent\.tar\.gz"):
        fetch.download(missing, tmp_path)


def test_sdist_unpacks_only_the_scheduler_tests_and_their_helpers(tmp_path: Path) -> None:
    archive = _sdist(tmp_path / "vllm-9.9.9.tar.gz", SDIST)
    fetch.unpack_sdist(archive, tmp_path / "out")
    unpacked = sorted(
        p.relative_to(tmp_path / "out").as_posix() for p in tmp_path.rglob("out/**/*.py")
    )
    assert unpacked == [
        "tests/__init__.py",
        "tests/v1/__init__.py",
        "tests/v1/core/__init__.py",
        "tests/v1/core/prefix_cache/helper.py",
        "tests/v1/core/utils.py",
        "tests/v1/kv_connector/__init__.py",
        "tests/v1/kv_connector/unit/__init__.py",
        "tests/v1/kv_connector/unit/utils.py",
    ]


def test_sdist_without_a_needed_file_is_refused(tmp_path: Path) -> None:
    members = {k: v for k, v in SDIST.items() if k != "tests/v1/kv_connector/unit/utils.py"}
    archive = _sdist(tmp_path / "vllm-9.9.9.tar.gz", members)
    with pytest.raises(FetchError, match=r"lacks tests/v1/kv_connector/unit/utils\.py"):
        fetch.unpack_sdist(archive, tmp_path / "out")


def test_archive_member_outside_its_folder_is_refused(tmp_path: Path) -> None:
    archive = _wheel(tmp_path / "vllm.whl", {"../escape.py": b""})
    with pytest.raises(FetchError, match="outside its folder"):
        fetch.unpack_wheel_python(archive, tmp_path / "out")
    assert not (tmp_path / "escape.py").exists()


def test_wheel_unpacks_python_code_and_data_but_no_native_code(tmp_path: Path) -> None:
    archive = _wheel(
        tmp_path / "vllm-9.9.9-cp38-abi3-manylinux_2_28_x86_64.whl",
        {
            "vllm/__init__.py": b"__version__ = '9.9.9'\n",
            "vllm/model_executor/configs/moe.json": b"{}",
            "vllm/_C.abi3.so": ELF_HEADER + b"code",
            "vllm/vllm-rs": ELF_HEADER + b"binary",
            "vllm/csrc/attention.cuh": b"// CUDA",
            "vllm/csrc/ops.h": b"// C++",
            "vllm-9.9.9.dist-info/METADATA": b"Name: vllm\n",
        },
    )
    fetch.unpack_wheel_python(archive, tmp_path / "site")
    unpacked = sorted(
        p.relative_to(tmp_path / "site").as_posix()
        for p in tmp_path.rglob("site/**/*")
        if p.is_file()
    )
    assert unpacked == [
        "vllm-9.9.9.dist-info/METADATA",
        "vllm/__init__.py",
        "vllm/model_executor/configs/moe.json",
    ]


def test_fetch_unpacks_once_and_records_the_hashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(fetch.ENV_CONTRACT_DIR, str(tmp_path / "contract"))
    sdist = _sdist(tmp_path / "vllm-9.9.9.tar.gz", SDIST)
    wheel = _wheel(tmp_path / "vllm-9.9.9-py3-none-any.whl", {"vllm/__init__.py": b""})
    rel = Release(version="9.9.9", sdist=_artifact(sdist), wheel=_artifact(wheel))
    assert not fetch.is_ready(rel)
    target = fetch.fetch(rel)
    assert target == tmp_path / "contract" / "9.9.9"
    assert (target / "tests/v1/core/utils.py").is_file()
    assert (target / "site/vllm/__init__.py").is_file()
    assert fetch.is_ready(rel)
    # Ready: nothing is downloaded again (the sources are gone).
    sdist.unlink()
    wheel.unlink()
    assert fetch.fetch(rel) == target
    # Other pins: unpacked again, and the missing source is reported.
    changed = Release(version="9.9.9", sdist=Artifact(sdist.as_uri(), "1" * 64))
    assert not fetch.is_ready(changed)
    with pytest.raises(FetchError, match="could not download"):
        fetch.fetch(changed)
    assert fetch.is_ready(rel), "a failed fetch leaves the unpacked release as it was"


def test_hf_home_serves_each_config_offline(tmp_path: Path) -> None:
    home = build_hf_home(tmp_path / "hf")
    configs = sorted(HF_CONFIGS.glob("*/*/config.json"))
    assert configs
    for config in configs:
        repo_id = f"{config.parent.parent.name}/{config.parent.name}"
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=home / "hub")
        assert isinstance(found, str), repo_id
        assert json.loads(Path(found).read_text()) == json.loads(config.read_text())


# A tree laid out like vLLM's tests: helpers that name the schedulers, tests that build them.
FAKE_TREE = {
    "tests/__init__.py": "",
    "tests/v1/__init__.py": "",
    "tests/v1/core/__init__.py": "",
    "tests/v1/core/utils.py": """
        from vllm.v1.core.sched.async_scheduler import AsyncScheduler
        from vllm.v1.core.sched.scheduler import Scheduler


        def scheduler_class(async_scheduling):
            return AsyncScheduler if async_scheduling else Scheduler
    """,
    "tests/v1/core/test_swap.py": """
        from vllm.v1.core.sched.scheduler import Scheduler

        from .utils import scheduler_class


        def test_helper_picks_peek():
            assert scheduler_class(False).__name__ == "PeekScheduler"
            assert scheduler_class(True).__name__ == "PeekAsyncScheduler"


        def test_direct_name_is_peek():
            assert Scheduler.__name__ == "PeekScheduler"
    """,
    "tests/v1/core/test_cold.py": """
        def test_builds_no_scheduler():
            assert True
    """,
    "tests/v1/core/test_captured.py": """
        import pytest
        from vllm.v1.core.sched.scheduler import Scheduler


        @pytest.mark.parametrize("cls", [Scheduler])
        def test_holds_the_class_from_import_time(cls):
            assert cls
    """,
}


def _run_fake_tree(tmp_path: Path, mode: str, targets: list[str]) -> tuple[int, str, dict]:
    for name, text in FAKE_TREE.items():
        path = tmp_path / "tree" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    report = tmp_path / f"{mode}.json"
    argv = command(MODES[mode], report, targets=targets)
    rel = next(r for r in fetch.releases() if r.installed is not None)
    env = environment(rel, MODES[mode], build_hf_home(tmp_path / "hf"))
    proc = subprocess.run(
        argv, cwd=tmp_path / "tree", env=env, capture_output=True, text=True, timeout=300
    )
    data = json.loads(report.read_text()) if report.exists() else {}
    return proc.returncode, proc.stdout + proc.stderr, data


@pytest.mark.slow
def test_plugin_rebinds_the_schedulers_the_tests_name(tmp_path: Path) -> None:
    targets = ["tests/v1/core/test_swap.py", "tests/v1/core/test_cold.py"]
    code, output, report = _run_fake_tree(tmp_path, "peek-on", targets)
    assert code == 0, output
    assert report["rebound"] == [
        "tests.v1.core.test_swap.Scheduler",
        "tests.v1.core.utils.AsyncScheduler",
        "tests.v1.core.utils.Scheduler",
    ]
    assert report["not_reaching"] == ["tests/v1/core/test_cold.py::test_builds_no_scheduler"]
    assert {o["outcome"] for o in report["outcomes"].values()} == {"passed"}
    # On stock, the same tests see vLLM's classes.
    code, output, report = _run_fake_tree(tmp_path, "stock", targets)
    assert code == 1, output
    assert (
        report["outcomes"]["tests/v1/core/test_swap.py::test_direct_name_is_peek"]["outcome"]
        == "failed"
    )


@pytest.mark.slow
def test_plugin_refuses_a_class_captured_at_import_time(tmp_path: Path) -> None:
    code, output, _ = _run_fake_tree(tmp_path, "peek-on", ["tests/v1/core/test_captured.py"])
    assert code == pytest.ExitCode.USAGE_ERROR, output
    assert "test_holds_the_class_from_import_time[Scheduler]: parameter cls" in output
