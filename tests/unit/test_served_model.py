"""What `bentoml serve .` / `bentoml build` serve (served_model.choose_served_model) and what packing
records (cli.settle_served), against a fake model store: packing a second model never changes it."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import bentoml
import pytest

from trtllm_service import served_model
from trtllm_service.packing import cli

pytestmark = pytest.mark.unit


class FakeStore:
    """bentoml.models.list / get over a list of models, oldest first."""

    def __init__(self) -> None:
        self.models: list[Any] = []

    def pack(self, tag: str, packed_by: str = "pack_model") -> str:
        name, version = tag.split(":")
        self.models.append(
            SimpleNamespace(
                tag=bentoml.Tag(name, version),
                info=SimpleNamespace(labels={"packed_by": packed_by}, creation_time=len(self.models)),
            )
        )
        return tag

    def list(self) -> list[Any]:
        return list(self.models)

    def get(self, tag: str) -> Any:
        name, _, version = str(tag).partition(":")
        found = [m for m in self.models if m.tag.name == name and version in ("", "latest", m.tag.version)]
        if not found:
            raise bentoml.exceptions.NotFound(f"no model {tag}")
        return found[-1]


@pytest.fixture
def fake_store(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeStore:
    """BentoML's model store replaced by a `FakeStore` (and the served-model record kept in tmp_path)."""
    fake = FakeStore()
    models = importlib.import_module("bentoml.models")  # bentoml.models is a lazy loader: patch the module
    monkeypatch.setattr(models, "list", fake.list)
    monkeypatch.setattr(models, "get", fake.get)
    monkeypatch.setattr(
        served_model, "served_model_file", lambda: tmp_path / "trtllm-service" / "served-model"
    )
    return fake


def packed(fake_store: FakeStore, tag: str, serve: bool = False) -> tuple[str | None, str, Path]:
    """What pack_model.py does after saving `tag`."""
    fake_store.pack(tag)
    return cli.settle_served(tag, serve)


def test_a_second_pack_does_not_change_what_is_served(fake_store: FakeStore) -> None:
    assert packed(fake_store, "first:v1")[:2] == ("first:v1", "the first model packed into this store")
    assert served_model.default_model_tag(None) == "first:v1"
    served, _, _ = packed(fake_store, "second:v2")
    assert served == "first:v1"
    assert served_model.default_model_tag(None) == "first:v1"  # the old rule: the newest, second:v2
    assert "recorded in" in served_model.CHOSEN["first:v1"]


def test_trtllm_model_always_wins(fake_store: FakeStore) -> None:
    packed(fake_store, "first:v1")
    packed(fake_store, "second:v2")
    assert served_model.choose_served_model("second") == ("second:v2", "TRTLLM_MODEL=second")
    assert served_model.choose_served_model("second:v2")[0] == "second:v2"
    with pytest.raises(served_model.ModelNotFoundError, match="TRTLLM_MODEL='third' is not in the BentoML"):
        served_model.choose_served_model("third")


def test_serve_and_set_served_change_it(fake_store: FakeStore) -> None:
    packed(fake_store, "first:v1")
    assert packed(fake_store, "second:v2", serve=True)[:2] == ("second:v2", "--serve")
    assert served_model.default_model_tag(None) == "second:v2"
    assert cli.set_served("first") == 0
    assert served_model.served_model_file().read_text() == "first:v1\n"
    assert served_model.default_model_tag(None) == "first:v1"
    assert cli.set_served("nothing") == 1


def test_without_a_record_the_only_packed_model(fake_store: FakeStore) -> None:
    """A built bento's container holds one model and no record."""
    fake_store.pack("other:v0", packed_by="someone-else")
    with pytest.raises(served_model.ModelNotFoundError, match=r"pack_model.py --demo"):
        served_model.choose_served_model(None)
    fake_store.pack("only:v1")
    assert served_model.choose_served_model(None) == (
        "only:v1",
        "the only model pack_model.py packed into the model store",
    )


def test_several_and_none_recorded_is_an_error_naming_them(fake_store: FakeStore) -> None:
    fake_store.pack("first:v1")
    fake_store.pack("second:v2")
    with pytest.raises(served_model.ModelNotFoundError) as error:
        served_model.choose_served_model(None)
    message = str(error.value)
    assert "first:v1, second:v2" in message and "TRTLLM_MODEL=TAG" in message and "--set-served" in message
    # a pack into such a store records nothing unless told to
    assert packed(fake_store, "third:v3")[0] is None
    assert packed(fake_store, "fourth:v4", serve=True)[0] == "fourth:v4"


def test_a_store_from_before_records_keeps_its_model(fake_store: FakeStore) -> None:
    """One model packed before the record existed was served: packing another records that one."""
    fake_store.pack("old:v1")
    served, why, record = packed(fake_store, "new:v2")
    assert (served, why) == ("old:v1", "the model served before this pack")
    assert record.read_text() == "old:v1\n"


def test_a_deleted_served_model_is_no_record(fake_store: FakeStore) -> None:
    packed(fake_store, "first:v1")
    fake_store.models.clear()
    fake_store.pack("second:v2")
    assert served_model.recorded_model() is None
    assert served_model.choose_served_model(None)[0] == "second:v2"


def test_the_closing_lines_say_how_to_serve_and_build(
    fake_store: FakeStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(cli.REPO_ROOT)
    record = Path("/home/u/bentoml/trtllm-service/served-model")
    served = cli.how_to_serve("a:v1", "a:v1", "the first model packed into this store", record)
    assert served[1:] == ["  serve it:  bentoml serve .", "  build it:  bentoml build ."]
    assert "a:v1 is the served model" in served[0] and str(record) in served[0]
    other = cli.how_to_serve("b:v2", "a:v1", "packing never changes it", record)
    assert "a:v1 stays the served model" in other[0]
    assert other[1:] == [
        "  serve it:  TRTLLM_MODEL=b:v2 bentoml serve .",
        "  build it:  TRTLLM_MODEL=b:v2 bentoml build .",
        "  serve it by default from now on:  python pack_model.py --set-served b:v2",
    ]
    monkeypatch.chdir(tmp_path)  # elsewhere: the repository by its path
    away = cli.how_to_serve("b:v2", None, "2 models packed before and none recorded", record)
    assert away[1] == f"  serve it:  TRTLLM_MODEL=b:v2 bentoml serve {cli.REPO_ROOT}"


def test_one_announcement_outside_the_workers(
    fake_store: FakeStore, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bentoml._internal.context import server_context

    packed(fake_store, "first:v1")
    capsys.readouterr()
    monkeypatch.setattr(server_context, "worker_index", None)  # bentoml build, bentoml serve's main process
    served_model.default_model_tag(None, announce=True)
    line = capsys.readouterr().err
    assert (
        line.startswith("trtllm_service: model first:v1 (the served model recorded in ")
        and line.count("\n") == 1
    )
    monkeypatch.setattr(server_context, "worker_index", 1)  # a worker: the main process said it
    served_model.default_model_tag(None, announce=True)
    served_model.default_model_tag(None)
    assert capsys.readouterr().err == ""
