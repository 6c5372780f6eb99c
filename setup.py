"""The installed packages, read from the folder layout (metadata is in pyproject.toml).

The design's top-level folders are installed as sub-packages of `qprof`; every
folder below them with an importable name is a package (a data-only folder such
as viewer/vendor/d3 too, as setuptools wants for the files it installs). Deriving the list
here means a new probe group (a folder under probes/) is packaged without
editing a list: its folder and its line in probes/registry.py are all it takes.
"""

from pathlib import Path

from setuptools import setup

ROOT = Path(__file__).resolve().parent
# installed name -> folder in the repository
FOLDERS = {"qprof": "qprof", "qprof.probes": "probes", "qprof.collectors": "collectors",
           "qprof.archive": "archive", "qprof.attribution": "attribution", "qprof.mappings": "mappings", "qprof.viewer": "viewer"}


def packages() -> list[str]:
    found = []
    for name, folder in FOLDERS.items():
        base = ROOT / folder
        for d in sorted([base, *(p for p in base.rglob("*") if p.is_dir())]):
            rel = d.relative_to(base).parts
            # not __pycache__, not d3-flame-graph (its files are its parent's data)
            if all(part.isidentifier() and not part.startswith("__") for part in rel):
                found.append(".".join([name, *rel]))
    return found


if __name__ == "__main__":  # as setuptools runs it; tests import packages()
    setup(packages=packages(), package_dir=FOLDERS)
