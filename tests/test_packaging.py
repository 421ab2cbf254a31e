"""The run-time data ships with the package: an installed wheel plans the default scenario outside the source tree.

The fast test checks that the default scenario is found through ``importlib.resources``; the slow one
builds a wheel from a copy of the tree, installs it into a fresh virtual environment (its dependencies
come from this interpreter's site-packages through a .pth line, so nothing is downloaded) and runs
``python -m model.solve --limit-shapes 8`` from an empty folder.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest
from helpers import REPO

from model import pipeline


def test_default_scenario_resolves_through_importlib_resources():
    resource = importlib.resources.files("data") / "default" / "scenario.toml"
    assert pipeline.DEFAULT_SCENARIO == Path(str(resource))
    assert pipeline.DEFAULT_SCENARIO.is_file()
    for name in ("requests_chat.jsonl", "requests_short.jsonl"):
        assert (importlib.resources.files("data") / "default" / name).is_file()
    assert (importlib.resources.files("data") / "profiles" / "opt13b-a100-tp1.toml").is_file()


def test_pyproject_ships_the_default_scenario_and_every_console_script():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    setuptools = project["tool"]["setuptools"]
    assert "data" in setuptools["packages"]["find"]["include"]
    assert {"default/*.toml", "default/*.jsonl", "profiles/*.toml"} <= set(setuptools["package-data"]["data"])
    scripts = project["project"]["scripts"]
    assert {"shapeplan-solve": "model.solve:entry", "shapeplan-evaluate": "model.evaluate:entry",
            "shapeplan-sweep": "model.sweep:entry"}.items() <= scripts.items()


IGNORE = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", "out", "traces",
                                "workloads", ".pytest_cache", ".ruff_cache", ".hypothesis")


def can_build_wheels() -> bool:
    """Whether this interpreter's setuptools meets pyproject's build requirement and has bdist_wheel."""
    try:
        from importlib.metadata import version

        major, minor = (int(x) for x in version("setuptools").split(".")[:2])
    except Exception:
        return False
    return (major, minor) >= (70, 1) or (major >= 68 and importlib.util.find_spec("wheel") is not None)


@pytest.mark.slow
def test_installed_wheel_plans_the_default_scenario_from_an_empty_folder(tmp_path: Path):
    source = tmp_path / "src"
    shutil.copytree(REPO, source, ignore=IGNORE)
    wheels = tmp_path / "wheels"
    # Build as `pip install .` does; offline when this interpreter can build the wheel itself.
    isolation = ["--no-build-isolation"] if can_build_wheels() else []
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(wheels),
                            str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stdout + built.stderr
    (wheel,) = wheels.glob("shapeplan-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {"data/__init__.py", "data/default/scenario.toml", "data/default/requests_chat.jsonl",
            "data/profiles/opt13b-a100-tp1.toml"} <= set(names)
    assert not [n for n in names if n.startswith(("data/traces", "data/workloads", "tests/"))]

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True, text=True)
    # Dependencies (numpy, highspy, ...) from this interpreter: a .pth line adds its site-packages AFTER the
    # fresh one, and .pth files inside it are not run, so an editable install of the source tree stays out.
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    cwd = tmp_path / "empty"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    where = subprocess.run([str(python), "-c", "import model, data; print(model.__file__); print(data.__file__)"],
                           cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.split()
    assert all(Path(w).is_relative_to(site) for w in where), where
    done = subprocess.run([str(python), "-m", "model.solve", "--limit-shapes", "8", "--out", "OUT", "--quiet"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (cwd / "OUT").iterdir()) == ["plan_chat.jsonl", "plan_short.jsonl"]
    script = subprocess.run([str(env_dir / "bin" / "shapeplan-sweep"), "--help"], cwd=cwd, env=env,
                            capture_output=True, text=True)
    assert script.returncode == 0 and "model.sweep" in script.stdout
