"""The bento as an image: `bentoml build`, `bentoml containerize --backend podman` FROM a double of
NVIDIA's 26.07 trtllm image (tests/image_double: its Python is the venv /opt/venv-tritonserver, its
openai 1.107.3, its tensorrt_llm 1.2.1 imports tensorrt_llm.serve while loading a model and spawns its
worker only under trtllm-llmapi-launch), then the container run as BentoCloud runs it.

Three tests are named for the three ways the bento failed in that image before (issue 34):
the service's Python did not see the image's TensorRT-LLM (test_image_python_is_tensorrt_llms), the
image's openai could not import tensorrt_llm.serve (test_image_openai_imports_tensorrt_llm_serve), and
Triton was not started through trtllm-llmapi-launch (test_llmapi_model_runs_under_trtllm_llmapi_launch).

Where the double is not NVIDIA's image, tests/image_double/double.py says so: Python 3.11.2, not
3.12.3; a CPU torch; the double's LLM answers through our stand-in over the synthetic engine; no C++
backend, so the legacy flavour runs its Python-backend engine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import openai
import psutil
import pytest
import yaml

from tensorrtllm_backend import pinned
from tests.e2e.conftest import REPO_ROOT, pack_demo
from tests.image_double import double
from tests.support import free_ports, http_ok

pytestmark = [pytest.mark.image, pytest.mark.xdist_group("image")]  # one worker builds the images
FLAVORS = ("llmapi",)  # the tests pack their own models; flavours are not the conftest's fixture
BUILT = re.compile(r'Successfully built Bento\(tag="([^"]+)"\)')


RUN_TAG = f"{os.getpid()}-{os.urandom(4).hex()}"
"""In the bento images' names: test runs that share the double's podman store (two checkouts, or CI
and a developer on one machine) build and remove only their own images. With one name for all, a
run's `rmi -f` at its end removed the image another run was serving from, stopping its container."""
TEST_IMAGES = (f"localhost/trtllm-test-llmapi:{RUN_TAG}", f"localhost/trtllm-test-ensemble:{RUN_TAG}")


@pytest.fixture(scope="module")
def podman() -> Iterator[dict[str, str]]:
    """The environment podman runs in, with the double tagged as the pinned image. The bento images
    go again afterwards (the double and its layers stay cached for the next run)."""
    _, env = double.ensure_double()
    remove_images_of_ended_runs(env)
    yield env
    remove_images(TEST_IMAGES, env)


def remove_images(images: Sequence[str], env: dict[str, str]) -> None:
    """`podman rmi` of bento images, --no-prune: their build layers stay, the cache of the next run."""
    for image in images:
        subprocess.run(
            ["podman", "rmi", "-f", "--no-prune", image],
            env=env,
            capture_output=True,
            timeout=120,
            check=False,
        )


def remove_images_of_ended_runs(env: dict[str, str]) -> None:
    """The bento images a run left behind when it was killed before its teardown (their tags name
    a test process that is gone), so that the store does not grow run after run."""
    listed = subprocess.run(
        ["podman", "images", "--format", "{{.Repository}}:{{.Tag}}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    ended = []
    for image in listed.stdout.split():
        found = re.fullmatch(r"localhost/trtllm-test-\w+:(\d+)-[0-9a-f]+", image)
        if found and not psutil.pid_exists(int(found.group(1))):
            ended.append(image)
    remove_images(ended, env)


def build_bento(home: Path, *options: str) -> str:
    env = {**os.environ, "BENTOML_HOME": str(home), "BENTOML_DO_NOT_TRACK": "true"}
    built = subprocess.run(
        [sys.executable, "-m", "bentoml", "build", ".", *options],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    found = BUILT.search(built.stdout + built.stderr)
    assert found, built.stdout
    return found.group(1)


def containerize(home: Path, bento: str, image: str, podman: dict[str, str]) -> None:
    done = double.containerize(
        bento, image, {**podman, "BENTOML_HOME": str(home), "BENTOML_DO_NOT_TRACK": "true"}
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]


@pytest.fixture(scope="module")
def llmapi_image(podman: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The bento of the tiny demo model, llmapi flavour (engine: tensorrt_llm, as packed for the image)."""
    home = pack_demo(tmp_path_factory.mktemp("image_llmapi"), "llmapi")
    image = TEST_IMAGES[0]
    containerize(home, build_bento(home), image, podman)
    return image


@pytest.fixture(scope="module")
def ensemble_image(podman: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> str:
    """The legacy flavour's bento (its Python-backend engine: the synthetic token source)."""
    home = pack_demo(tmp_path_factory.mktemp("image_ensemble"), "ensemble", "--engine", "synthetic")
    image = TEST_IMAGES[1]
    containerize(home, build_bento(home), image, podman)
    return image


def in_image(image: str, podman: dict[str, str], code: str) -> str:
    done = double.run_image(image, podman, "python", "-c", code)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.fixture
def serving(llmapi_image: str, podman: dict[str, str]) -> Iterator[tuple[double.Container, str]]:
    with run_container(llmapi_image, podman) as running:
        yield running


@contextlib.contextmanager
def run_container(image: str, podman: dict[str, str]) -> Iterator[tuple[double.Container, str]]:
    (port,) = free_ports(1)
    url = f"http://127.0.0.1:{port}"
    with double.Container(image, podman, environ={"PORT": str(port)}) as container:
        deadline = time.monotonic() + 240
        while not http_ok(f"{url}/readyz"):
            assert container.running(), container.logs()[-6000:]
            assert time.monotonic() < deadline, container.logs()[-6000:]
            time.sleep(0.5)
        yield container, url


def stream_generate(url: str) -> str:
    text = ""
    body = {"prompt": "Say hello.", "max_tokens": 16}
    with httpx.stream("POST", f"{url}/generate", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for chunk in response.iter_text():
            text += chunk
    return text


def test_image_python_is_tensorrt_llms(llmapi_image: str, podman: dict[str, str]) -> None:
    """The container's Python (the one BentoML's entrypoint activates) is the image's
    /opt/venv-tritonserver: it imports TensorRT-LLM and torch from there, and the service's
    requirements went there too, not into the base Python below it."""
    found = json.loads(
        in_image(
            llmapi_image,
            podman,
            "import json, sys, tensorrt_llm, torch, bentoml, tritonclient.grpc as g, importlib.metadata as m;"
            "print(json.dumps({'prefix': sys.prefix, 'trt': tensorrt_llm.__file__, 'torch': torch.__file__,"
            "'bentoml': bentoml.__file__, 'tritonclient': g.__file__, 'version': m.version('tensorrt_llm')}))",
        )
    )
    assert found["prefix"] == "/opt/venv-tritonserver", found
    for module in ("trt", "torch", "bentoml", "tritonclient"):
        assert found[module].startswith("/opt/venv-tritonserver/lib/"), found
    assert found["version"] == pinned.TENSORRT_LLM_VERSION


def test_image_keeps_tensorrt_llms_pins(llmapi_image: str, podman: dict[str, str]) -> None:
    """The install moved none of TensorRT-LLM's pins (the image build checked; checked again here
    from the image's own tensorrt_llm metadata), /app/.venv is the image's Python and BentoML
    fetched no Python of its own."""
    out = in_image(
        llmapi_image,
        podman,
        "import os, sys; sys.path.insert(0, 'src'); from trtllm_service import image_env;"
        "moved, already = image_env.broken_pins(); print(moved + already);"
        "print(os.path.realpath('/app/.venv'), os.path.exists('/app/python'))",
    )
    assert out.split("\n")[:2] == ["[]", "/opt/venv-tritonserver False"], out


def test_image_openai_imports_tensorrt_llm_serve(llmapi_image: str, podman: dict[str, str]) -> None:
    """The image's openai 1.107.3 cannot import tensorrt_llm.serve; the bento's can."""
    base = double.run_image(pinned.IMAGE, podman, "python", "-c", "import tensorrt_llm.serve")
    assert base.returncode != 0 and "PartReasoningText" in base.stderr, base.stderr
    version = in_image(llmapi_image, podman, "import tensorrt_llm.serve, openai; print(openai.__version__)")
    assert tuple(int(p) for p in version.strip().split(".")[:2]) >= (1, 109), version


def test_llmapi_model_runs_under_trtllm_llmapi_launch(
    serving: tuple[double.Container, str], podman: dict[str, str]
) -> None:
    """Triton runs as `trtllm-llmapi-launch tritonserver ...` (the double's LLM refuses to start
    otherwise), the model is served by TensorRT-LLM (the double's 1.2.1), and an answer streams."""
    container, url = serving
    text = stream_generate(url)
    assert text.strip(), container.logs()[-4000:]
    tree = container.exec(
        "python",
        "-c",
        "import os\n"
        "for pid in filter(str.isdigit, os.listdir('/proc')):\n"
        "    try:\n"
        "        argv = open(f'/proc/{pid}/cmdline', 'rb').read().split(b'\\0')\n"
        "        ppid = open(f'/proc/{pid}/stat').read().rsplit(')', 1)[1].split()[1]\n"
        "    except OSError:\n"
        "        continue\n"
        "    print(pid, ppid, ' '.join(a.decode() for a in argv[:2]))\n",
    ).stdout
    procs = {line.split()[0]: line.split(maxsplit=2) for line in tree.splitlines()}
    # the script and its subshell (which runs the server) carry the same command line
    launches = [pid for pid, (_, _, argv) in procs.items() if "trtllm-llmapi-launch" in argv]
    assert launches, tree
    servers = [pid for pid, (_, _, argv) in procs.items() if argv.split()[0].endswith("/tritonserver")]
    assert len(servers) == 1, tree

    def ancestors(pid: str) -> list[str]:
        chain = []
        while pid in procs and pid not in chain:
            chain.append(pid)
            pid = procs[pid][1]
        return chain

    assert set(launches) <= set(ancestors(servers[0])), tree
    models = httpx.get(f"{url}/v1/models", timeout=30).json()
    assert models["data"][0]["engine"] == "tensorrt_llm", models  # not a stand-in of ours
    assert f"TensorRT-LLM {pinned.TENSORRT_LLM_VERSION}" in container.logs()
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
    chunks = client.chat.completions.create(
        model=models["data"][0]["id"],
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=8,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()


def test_legacy_flavour_streams_from_the_image(ensemble_image: str, podman: dict[str, str]) -> None:
    with run_container(ensemble_image, podman) as (container, url):
        assert stream_generate(url).strip(), container.logs()[-4000:]


def test_image_build_fails_loudly_without_tensorrt_llm(
    podman: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A base image whose Python has no TensorRT-LLM fails the image build in one clear line."""
    home = pack_demo(tmp_path_factory.mktemp("image_plain"), "llmapi")
    bentofile = home / "bentofile.yaml"
    plain = double.ensure_without_tensorrt_llm(podman)
    build = yaml.safe_load((REPO_ROOT / "bentofile.yaml").read_text())
    build["docker"]["base_image"] = plain  # over service.py's image (api/server/deployment.py)
    bentofile.write_text(yaml.safe_dump(build))
    bento = build_bento(home, "--bentofile", str(bentofile))
    done = double.containerize(
        bento, f"localhost/trtllm-test-plain:{RUN_TAG}", {**podman, "BENTOML_HOME": str(home)}
    )
    assert done.returncode != 0
    assert "cannot see tensorrt_llm" in done.stdout + done.stderr, (done.stdout + done.stderr)[-3000:]
