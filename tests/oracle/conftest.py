"""Fixtures shared by the oracle tests: where the build and the data are (see paths.py)."""

import pytest

from paths import BUILD_DIR, DATA_DIR


def _directory(variable, path):
    if not path.is_dir():
        pytest.fail(f"{variable}={path} is not a directory")
    return path


@pytest.fixture(scope="session")
def build_dir():
    return _directory("LAYUP_BUILD_DIR", BUILD_DIR)


@pytest.fixture(scope="session")
def data_dir():
    return _directory("LAYUP_DATA_DIR", DATA_DIR)
