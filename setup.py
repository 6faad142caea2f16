"""The build's one step beyond pyproject.toml: a wheel (or an sdist) records the git commit
it is built from in ``ductwork/_build.py`` (``COMMIT = "1a2b3c4"``, ``-dirty`` when the
checkout had changes), so that ``ductwork --version`` of an installed copy, which has no
checkout, can name it. Built where git cannot tell (no checkout, no git), nothing is
written and the installed copy says ``commit unknown``. An editable install writes
nothing: it imports the checkout, whose commit git gives (``ductwork/version.py``).
"""

import runpy
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

ROOT = Path(__file__).resolve().parent
#: ductwork/version.py run on its own: the build environment has none of ductwork's dependencies
_version = runpy.run_path(str(ROOT / "ductwork" / "version.py"))


def _write_commit(commit, package_dir: Path) -> None:
    if commit is not None:
        (package_dir / "_build.py").write_text(f'"""Written by setup.py at build time."""\n\nCOMMIT = {commit!r}\n')


# Each reads the commit before it builds: what it creates in the checkout (the sdist's
# release tree) would read as a change.
class BuildPy(build_py):
    def run(self):
        commit = None if self.editable_mode else _version["checkout_commit"](ROOT)
        super().run()
        _write_commit(commit, Path(self.build_lib) / "ductwork")


class Sdist(sdist):
    def make_release_tree(self, base_dir, files):
        commit = _version["checkout_commit"](ROOT)
        super().make_release_tree(base_dir, files)
        _write_commit(commit, Path(base_dir) / "ductwork")


setup(cmdclass={"build_py": BuildPy, "sdist": Sdist})
