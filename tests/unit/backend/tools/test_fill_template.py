"""fill_template: parsing, filling, the CLI's error contract and in-place writes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tensorrtllm_backend.tools import fill_template as ft
from tensorrtllm_backend.tools.fill_template import (
    TemplateError,
    fill_file,
    fill_text,
    parse_substitutions,
    placeholders,
)

pytestmark = pytest.mark.unit

SCRIPT = Path(ft.__file__).resolve()

TEMPLATE = """name: "tensorrt_llm"
backend: "${triton_backend}"
max_batch_size: ${triton_max_batch_size}
model_transaction_policy { decoupled: ${decoupled_mode} }
parameters: { key: "engine_dir" value: { string_value: "${engine_dir}" } }
parameters: { key: "stop_words" value: { string_value: "${stop_words}" } }
"""


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture
def template(tmp_path: Path) -> Path:
    path = tmp_path / "config.pbtxt"
    path.write_text(TEMPLATE, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- placeholders


def test_placeholders_finds_braced_names_only():
    text = "a ${x} b ${y_1} ${x} $z ${} ${1bad} $${w}"
    assert placeholders(text) == {"x", "y_1", "w"}


def test_placeholders_of_template():
    assert placeholders(TEMPLATE) == {
        "triton_backend",
        "triton_max_batch_size",
        "decoupled_mode",
        "engine_dir",
        "stop_words",
    }


# --------------------------------------------------------------------------- parse_substitutions


def test_parse_simple():
    assert parse_substitutions("a:1,b:two") == {"a": "1", "b": "two"}


def test_parse_splits_on_first_colon_only():
    assert parse_substitutions("url:http://host:8000/x") == {"url": "http://host:8000/x"}


def test_parse_escapes():
    spec = r"words:a\,b\,c,sep:x\:y,path:/a/b"
    assert parse_substitutions(spec) == {"words": "a,b,c", "sep": "x:y", "path": "/a/b"}


def test_parse_escaped_colon_in_key():
    assert parse_substitutions(r"we\:ird:v") == {"we:ird": "v"}


def test_parse_other_backslashes_kept():
    assert parse_substitutions(r"p:C:\dir\n") == {"p": r"C:\dir\n"}


def test_parse_empty_value_allowed():
    assert parse_substitutions("lora_dir:") == {"lora_dir": ""}


def test_parse_empty_items_ignored_and_key_stripped():
    assert parse_substitutions("a:1,, b:2,") == {"a": "1", "b": "2"}
    assert parse_substitutions("") == {}


@pytest.mark.parametrize(
    ("spec", "bad"),
    [("a:1,novalue,b:2", "novalue"), (r"a\:1", r"a\:1"), (":v", ":v"), ("  :v", "  :v")],
)
def test_parse_errors_name_the_item(spec: str, bad: str):
    with pytest.raises(TemplateError) as info:
        parse_substitutions(spec)
    assert repr(bad) in str(info.value)


def test_parse_conflicting_duplicate_rejected():
    assert parse_substitutions("a:1,a:1") == {"a": "1"}
    with pytest.raises(TemplateError, match="'a' given twice"):
        parse_substitutions("a:1,a:2")


def test_template_error_is_value_error():
    assert issubclass(TemplateError, ValueError)


# --------------------------------------------------------------------------- fill_text


def test_fill_replaces_all_occurrences():
    assert fill_text("${a}-${a}-${b}", {"a": "x", "b": "y"}) == "x-x-y"


def test_fill_leaves_missing_placeholders():
    out = fill_text(TEMPLATE, {"triton_max_batch_size": "8"})
    assert "max_batch_size: 8\n" in out
    assert "${triton_backend}" in out and "${engine_dir}" in out


def test_fill_is_single_pass():
    assert fill_text("${a} ${b}", {"a": "${b}", "b": "2"}) == "${b} 2"


def test_fill_value_with_special_chars():
    out = fill_text("${w}", parse_substitutions(r"w:a\,b\:c \1 $x"))
    assert out == r"a,b:c \1 $x"


def test_fill_unknown_key_lists_known():
    with pytest.raises(TemplateError) as info:
        fill_text("${b} ${a}", {"a": "1", "zz": "2"}, source="cfg.pbtxt")
    msg = str(info.value)
    assert "cfg.pbtxt" in msg
    assert "unknown key 'zz'" in msg
    assert "(known: a, b)" in msg


def test_fill_several_unknown_keys():
    with pytest.raises(TemplateError, match=r"unknown keys 'x', 'y' \(known: none\)"):
        fill_text("no placeholders", {"y": "1", "x": "2"})


# --------------------------------------------------------------------------- fill_file


def test_fill_file_stdout_mode_does_not_touch(template: Path):
    before = template.read_bytes()
    out = fill_file(template, {"triton_backend": "tensorrtllm"}, in_place=False)
    assert 'backend: "tensorrtllm"' in out
    assert template.read_bytes() == before


def test_fill_file_in_place_keeps_mode_and_crlf(tmp_path: Path):
    path = tmp_path / "c.pbtxt"
    path.write_bytes(b"a: ${a}\r\nb: ${b}\r\n")
    path.chmod(0o640)
    fill_file(path, {"a": "1"}, in_place=True)
    assert path.read_bytes() == b"a: 1\r\nb: ${b}\r\n"
    assert (path.stat().st_mode & 0o777) == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["c.pbtxt"]  # no temp file left


def test_fill_file_in_place_is_atomic_rename(template: Path, monkeypatch: pytest.MonkeyPatch):
    """The original inode is never written: a new file is renamed over it."""
    inode = template.stat().st_ino
    calls: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src, dst):
        calls.append((str(src), str(dst)))
        assert Path(src).parent == template.parent
        assert "${engine_dir}" in template.read_text()  # target untouched until the rename
        real_replace(src, dst)

    monkeypatch.setattr(ft.os, "replace", spy)
    fill_file(template, {"engine_dir": "/engines/x"}, in_place=True)
    assert len(calls) == 1 and calls[0][1] == str(template)
    assert template.stat().st_ino != inode
    assert 'string_value: "/engines/x"' in template.read_text()


def test_fill_file_in_place_failure_leaves_file(template: Path, monkeypatch: pytest.MonkeyPatch):
    before = template.read_bytes()

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(ft.os, "replace", boom)
    with pytest.raises(OSError):
        fill_file(template, {"engine_dir": "/e"}, in_place=True)
    assert template.read_bytes() == before
    assert [p.name for p in template.parent.iterdir()] == [template.name]


def test_fill_file_through_symlink_keeps_link(tmp_path: Path, template: Path):
    link = tmp_path / "link.pbtxt"
    link.symlink_to(template)
    fill_file(link, {"triton_max_batch_size": "4"}, in_place=True)
    assert link.is_symlink()
    assert "max_batch_size: 4" in template.read_text()


# --------------------------------------------------------------------------- CLI


def test_cli_prints_to_stdout(template: Path):
    before = template.read_bytes()
    proc = run_cli(str(template), r"triton_backend:tensorrtllm,stop_words:a\,b")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert 'backend: "tensorrtllm"' in proc.stdout
    assert 'string_value: "a,b"' in proc.stdout
    assert "${engine_dir}" in proc.stdout
    assert template.read_bytes() == before


def test_cli_in_place(template: Path):
    for flag, spec in (("-i", "decoupled_mode:true"), ("--in_place", "engine_dir:/e")):
        proc = run_cli(flag, str(template), spec)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout == ""
    text = template.read_text()
    assert "decoupled: true" in text and 'string_value: "/e"' in text


def test_cli_in_place_twice_is_an_error(template: Path):
    """A filled placeholder is gone: filling it again is an unknown key, not a silent no-op."""
    assert run_cli("-i", str(template), "decoupled_mode:true").returncode == 0
    after = template.read_bytes()
    _assert_one_line_error(
        run_cli("-i", str(template), "decoupled_mode:true"), "unknown key 'decoupled_mode'"
    )
    assert template.read_bytes() == after


def _assert_one_line_error(proc: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert proc.returncode == 2
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("fill_template: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.mark.parametrize("in_place", [False, True])
def test_cli_unknown_key(template: Path, in_place: bool):
    before = template.read_bytes()
    args = ["-i"] if in_place else []
    proc = run_cli(*args, str(template), "triton_backend:x,engin_dir:/e")
    _assert_one_line_error(proc, "unknown key 'engin_dir'", "known: decoupled_mode, engine_dir")
    assert template.read_bytes() == before


def test_cli_bad_spec(template: Path):
    before = template.read_bytes()
    proc = run_cli("-i", str(template), "triton_backend:x,oops")
    _assert_one_line_error(proc, "'oops'")
    assert template.read_bytes() == before


def test_cli_missing_file(tmp_path: Path):
    missing = tmp_path / "nope.pbtxt"
    proc = run_cli("-i", str(missing), "a:1")
    _assert_one_line_error(proc, str(missing), "No such file")
    assert not missing.exists()


def test_cli_usage_error_is_one_line():
    _assert_one_line_error(run_cli(), "required")
    _assert_one_line_error(run_cli("--bogus", "f", "a:1"), "--bogus")


def test_main_api(template: Path, capsys: pytest.CaptureFixture[str]):
    assert ft.main([str(template), "triton_max_batch_size:2"]) == 0
    assert "max_batch_size: 2" in capsys.readouterr().out
    assert ft.main([str(template), "nope:2"]) == 2
    assert capsys.readouterr().err.startswith("fill_template: error: ")
