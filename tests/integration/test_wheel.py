"""What the wheel ships: the engine, the proof (``ductwork_proof``) and the model as
``ductwork_model`` (the repository's ``model/``), importable without the engine.

Built with setup.py's ``build_py`` (what ``pip wheel`` runs) from a copy of the tracked
files into a scratch directory, and imported from a directory that is no checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packages as a fresh clone builds them: from a copy of the files git tracks (as
    they are in the working tree), so that no ``*.egg-info`` of an earlier install lists
    data files the package-data patterns leave out."""
    scratch = tmp_path_factory.mktemp("wheel")
    source, lib = scratch / "source", scratch / "lib"
    for path in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout.splitlines():
        if (ROOT / path).is_file():
            (source / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / path, source / path)
    subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(lib)], cwd=source,
                   capture_output=True, text=True, timeout=120, check=True)
    return lib


def test_the_listed_packages_are_every_package_directory():
    """pyproject.toml lists the packages (find cannot rename model/): a new subpackage
    missing from the list would be missing from the wheel."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for top in ("ductwork", "ductwork_proof")
               for p in (ROOT / top).rglob("__init__.py")}
    on_disk |= {"ductwork_model"}
    assert listed == on_disk


def test_every_file_of_the_packages_is_in_the_wheel(built):
    """Every file git tracks under the packages is built (package-data names the data files
    by pattern): the lane routine's earlier versions, which migrations 0012 and 0013 read
    from ``db/migrations/routines/``, were missing from the wheel, so ``ductwork db
    upgrade`` from an installed wheel failed on PostgreSQL and MySQL-family."""
    tracked = subprocess.run(["git", "ls-files", "ductwork", "ductwork_proof", "model"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout.split()
    shipped = {path.replace("model/", "ductwork_model/", 1) if path.startswith("model/") else path
               for path in tracked}
    missing = sorted(path for path in shipped if not (built / path).is_file())
    assert not missing, f"tracked but not in the wheel: {missing}"


def test_the_wheel_ships_the_model_and_the_proof_and_the_model_imports_alone(built, tmp_path):
    assert sorted(p.name for p in (built / "ductwork_model").glob("*.py")) == sorted(
        p.name for p in (ROOT / "model").glob("*.py"))
    assert (built / "ductwork_proof" / "verify.py").exists()
    assert not (built / "model").exists()  # no bare top-level `model` in site-packages
    done = _probe(built, tmp_path, "import sys, ductwork_model; "
                  "assert not any(m == 'ductwork' or m.startswith('ductwork.') for m in sys.modules), "
                  "sorted(sys.modules); print(ductwork_model.__file__, ductwork_model.LimitsModel.__module__)")
    assert done.stdout.split() == [str(built / "ductwork_model" / "__init__.py"), "ductwork_model.limits"]


def test_the_shipped_proof_imports_from_the_wheel_alone(built, tmp_path):
    """Nothing in ductwork_proof reaches for the repository's tests/ or model/."""
    done = _probe(built, tmp_path, "import ductwork_proof.verify, ductwork_proof.harness, ductwork_proof.checkers, "
                  "ductwork_proof.conformance, ductwork_proof.report, ductwork_proof.pytest_plugin, sys; "
                  "print(sorted({m.split('.')[0] for m in sys.modules} & {'tests', 'model'}))")
    assert done.stdout.strip() == "[]"


def _probe(built: Path, cwd: Path, code: str) -> subprocess.CompletedProcess[str]:
    """``python -c code`` in ``cwd`` (no checkout) with only the built packages added."""
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(built)})
    assert done.returncode == 0, done.stderr
    return done
