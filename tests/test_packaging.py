"""The built wheel installs `hermes` with its sub-packages and presets, and nothing else at top level."""

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, str]:
    """The wheel, and what the build printed (verbose, so setuptools' warnings show)."""
    out = tmp_path_factory.mktemp("wheel")
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                             "-w", str(out), str(ROOT)], check=True, capture_output=True, text=True)
    (path,) = out.glob("hermes_video-*.whl")
    return path, result.stdout + result.stderr


@pytest.fixture(scope="module")
def wheel(built) -> Path:
    return built[0]


def test_the_build_does_not_warn_and_the_metadata_is_complete(built):
    path, log = built
    assert "BuildBackendWarning" not in log and "absent from the `packages`" not in log, log[-2000:]
    with zipfile.ZipFile(path) as z:
        (metadata,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        text = z.read(metadata).decode()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in z.namelist())
    assert "License-Expression: Apache-2.0" in text and "Author: " in text
    assert "Classifier: Programming Language :: Python :: 3" in text and "Project-URL: " in text
    assert (ROOT / "LICENSE").read_text().startswith("                                 Apache License")


def test_wheel_holds_only_the_hermes_package(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"hermes"}
    for sub in ("models", "pipelines", "datasets", "tiers"):
        assert f"hermes/{sub}/__init__.py" in names
    assert "hermes/configs/models/llava-onevision-0.5b.yaml" in names
    assert "hermes/configs/memory/full.yaml" in names
    assert "hermes/configs/paper/paper-llava-onevision-7b.yaml" in names
    assert "hermes/models/weights/micro-llava-ov.safetensors" in names  # `hermes-video demo` needs them
    assert {"hermes/pipelines/serve/app.py", "hermes/pipelines/serve/static/index.html",
            "hermes/pipelines/serve/static/app.js"} <= set(names)  # `serve`'s page


@pytest.mark.slow
def test_wheel_installs_and_runs_in_a_fresh_venv(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bin_dir = venv / ("Scripts" if sys.platform == "win32" else "bin")
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, capture_output=True)
    # Dependencies (torch, transformers, ...) come from this environment; `hermes` only from the wheel:
    # a .pth line adds the path without running this environment's editable-install hooks.
    site = Path(subprocess.check_output([str(bin_dir / "python"), "-c",
                                         "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    assert not (site / "models").exists() and not (site / "datasets").exists() and not (site / "pipelines").exists()
    check = ("import hermes, hermes.models, hermes.pipelines, hermes.datasets, importlib.util; "
             f"assert hermes.__file__.startswith({str(site)!r}), hermes.__file__; "
             "assert importlib.util.find_spec('models') is None; "
             "from hermes.config import build_config; "
             "assert build_config(overrides=['model.device=cpu']).model.family == 'smolvlm'; "
             "from hermes.models.micro import load_micro; load_micro()")  # shipped weights found, checksum holds
    subprocess.run([str(bin_dir / "python"), "-c", check], check=True, cwd=tmp_path)
    info = subprocess.run([str(bin_dir / "hermes-video"), "info"], capture_output=True, text=True, cwd=tmp_path)
    assert info.returncode == 0, info.stderr
    assert "tiny-llava-onevision" in info.stdout
