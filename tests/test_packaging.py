"""The installed package holds every module: pyproject's explicit package list names every package folder."""
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    mapped = {name: ROOT / folder for name, folder in config["package-dir"].items()}
    found = set()
    for init in (ROOT / "edgetrain").rglob("__init__.py"):
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    for name, folder in mapped.items():
        assert (folder / "__init__.py").exists(), name
        found.add(name)
    assert listed == found
