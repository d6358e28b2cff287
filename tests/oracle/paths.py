"""Where the build and the data are, for every oracle test.

ctest sets LAYUP_BUILD_DIR and LAYUP_DATA_DIR; run by hand, they default to build/ and data/ of
this checkout. Relative paths are taken from the current directory.
"""
import os
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]
BUILD_DIR = pathlib.Path(os.environ.get("LAYUP_BUILD_DIR", REPO / "build")).resolve()
DATA_DIR = pathlib.Path(os.environ.get("LAYUP_DATA_DIR", REPO / "data")).resolve()
