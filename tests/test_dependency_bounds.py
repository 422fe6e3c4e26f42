"""The `test` extra resolves, in a fresh venv, to releases the suite ran green with: every entry
has a ceiling (or an exact pin), and this venv's installed releases sit inside every range."""

from __future__ import annotations

import configparser
from importlib import metadata
from pathlib import Path
from typing import List

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]


def extra(name: str) -> List[Requirement]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    lines = config["options.extras_require"][name].splitlines()
    return [Requirement(line.strip()) for line in lines
            if line.strip() and not line.strip().startswith("#")]


def has_ceiling(requirement: Requirement) -> bool:
    return any(spec.operator in ("<", "<=", "==", "~=") for spec in requirement.specifier)


@pytest.mark.parametrize("line, ceiling", [
    ("moto[server,s3]>=5.0,<5.3", True),
    ("ruff==0.17.6", True),
    ("pytest>=7", False),
    ("dask>=2023.1", False),
])
def test_a_ceiling_is_an_upper_bound_or_a_pin(line, ceiling):
    assert has_ceiling(Requirement(line)) is ceiling


def test_every_test_requirement_has_a_ceiling():
    assert [str(r) for r in extra("test") if not has_ceiling(r)] == []


def test_the_installed_releases_are_inside_the_test_extra():
    outside = []
    for requirement in extra("test"):
        installed = metadata.version(requirement.name)
        if not requirement.specifier.contains(installed, prereleases=True):
            outside.append(f"{requirement} (installed {installed})")
    assert outside == []
