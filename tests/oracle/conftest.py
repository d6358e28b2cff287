"""Fixtures shared by the oracle tests: where the build and the data are.

ctest sets LAYUP_BUILD_DIR and LAYUP_DATA_DIR; run by hand, they default to build/ and data/ of
this checkout. Relative paths are taken from the current directory.
"""

import os
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]


def _directory_from_env(variable, default):
    path = pathlib.Path(os.environ.get(variable, default)).resolve()
    if not path.is_dir():
        pytest.fail(f"{variable}={path} is not a directory")
    return path


@pytest.fixture(scope="session")
def build_dir():
    return _directory_from_env("LAYUP_BUILD_DIR", REPO / "build")


@pytest.fixture(scope="session")
def data_dir():
    return _directory_from_env("LAYUP_DATA_DIR", REPO / "data")
