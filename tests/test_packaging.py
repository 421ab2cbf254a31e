"""The run-time data ships with the package: an installed wheel plans the default scenario outside the source tree.

The repository's data/ folder is installed as the subpackage ``model._data`` (pyproject.toml's package-dir),
so the distribution has exactly the top-level packages ``model`` and ``solvers`` and no generic ``data``.
The fast tests check that the default scenario is found through ``importlib.resources`` when installed and
beside ``model/`` in a source tree that is not installed, and that pyproject.toml lists every package folder;
the slow one builds a wheel from a copy of the tree, installs it into a fresh virtual environment (its
dependencies come from this interpreter's site-packages through a .pth line, so nothing is downloaded) and
runs ``python -m model.solve --limit-shapes 8`` from an empty folder, where ``import data`` fails.
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

SHIPPED = ("default/scenario.toml", "default/device.toml", "default/reference.toml", "default/requests_chat.jsonl",
           "default/requests_short.jsonl", "profiles/opt13b-a100-tp1.toml")


def test_default_scenario_is_found_through_importlib_resources():
    if importlib.util.find_spec("model._data") is not None:  # installed: CI's editable install, a wheel
        root = importlib.resources.files("model._data")
    else:  # a source tree run without installing (e.g. this checkout on an interpreter that installed none)
        root = REPO / "data"
    assert pipeline.DEFAULT_SCENARIO == Path(str(root / "default" / "scenario.toml"))
    for name in SHIPPED:  # the same files as the repository's data/ (not another checkout's)
        assert (root / name).read_bytes() == (REPO / "data" / name).read_bytes(), name


def test_a_source_tree_without_install_reads_data_beside_model():
    # -S: no site-packages processing, so no .pth and no editable finder; the dependencies come through
    # PYTHONPATH (whose .pth files are not run either).  model is imported from the tree (cwd), as
    # `python -m model.solve` from the root of a bare clone does.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([sysconfig.get_paths()["purelib"],
                                                       sysconfig.get_paths()["platlib"]]))
    code = ("import importlib.util; from model import pipeline; "
            "print(importlib.util.find_spec('model._data')); print(pipeline.DEFAULT_SCENARIO)")
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    spec, default = done.stdout.split()
    assert spec == "None"
    assert Path(default) == REPO / "data" / "default" / "scenario.toml"


def pyproject() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_pyproject_installs_data_inside_model_and_no_top_level_data():
    setuptools = pyproject()["tool"]["setuptools"]
    packages = setuptools["packages"]
    assert {name.split(".")[0] for name in packages} == {"model", "solvers"}
    assert setuptools["package-dir"] == {"model._data": "data"}
    assert "model._data" in packages
    assert {"default/*.toml", "default/*.jsonl", "profiles/*.toml"} <= set(setuptools["package-data"]["model._data"])
    assert set(setuptools["package-data"]) == {"model._data"}
    assert setuptools["include-package-data"] is False  # only those globs: not data/traces or data/workloads
    # setuptools' editable install finds a remapped subpackage only as a regular package
    assert (REPO / "data" / "__init__.py").is_file()


def test_pyproject_lists_every_package_folder():
    # A package-dir remap needs an explicit package list: a folder moved or added under model/ or solvers/
    # must be added there, or the wheel silently lacks it.
    folders = {".".join(p.parent.relative_to(REPO).parts) for top in ("model", "solvers")
               for p in (REPO / top).rglob("*.py")}
    listed = set(pyproject()["tool"]["setuptools"]["packages"]) - {"model._data"}
    assert sorted(folders - listed) == [], "add these package folders to pyproject.toml [tool.setuptools] packages"
    assert sorted(listed - folders) == [], "these pyproject.toml packages have no folder (moved or removed?)"


def test_pyproject_has_every_console_script():
    scripts = pyproject()["project"]["scripts"]
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
    assert {"model/_data/__init__.py", *(f"model/_data/{name}" for name in SHIPPED)} <= set(names)
    # exactly the two top-level packages: no data/ (nor tests/, scripts/), and no traces or workloads anywhere
    assert {n.split("/")[0] for n in names} == {"model", "solvers", "shapeplan-0.1.0.dist-info"}
    assert not [n for n in names if "/traces/" in n or "/workloads/" in n]
    top_level = zipfile.ZipFile(wheel).read("shapeplan-0.1.0.dist-info/top_level.txt").decode().split()
    assert sorted(top_level) == ["model", "solvers"]

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
    where = subprocess.run([str(python), "-c", "import model.pipeline as p; print(p.__file__); print(p.DEFAULT_SCENARIO)"],
                           cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.split()
    assert where == [str(site / "model" / "pipeline.py"), str(site / "model" / "_data" / "default" / "scenario.toml")]
    no_data = subprocess.run([str(python), "-c", "import data"], cwd=cwd, env=env, capture_output=True, text=True)
    assert no_data.returncode == 1 and "ModuleNotFoundError: No module named 'data'" in no_data.stderr
    done = subprocess.run([str(python), "-m", "model.solve", "--limit-shapes", "8", "--out", "OUT", "--quiet"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in (cwd / "OUT").iterdir()) == ["plan_chat.jsonl", "plan_short.jsonl"]
    script = subprocess.run([str(env_dir / "bin" / "shapeplan-sweep"), "--help"], cwd=cwd, env=env,
                            capture_output=True, text=True)
    assert script.returncode == 0 and "model.sweep" in script.stdout
