"""The build refuses an include that points up the layers (scripts/check_layers.cmake, run by the
layup_layer_check target before every library): this checkout passes, and a copy of its sources
with one wrong-way include, or a folder the layers do not name, fails naming the file."""
import shutil
import subprocess

import pytest

from paths import REPO

SCRIPT = REPO / "scripts" / "check_layers.cmake"


def check(tree):
    return subprocess.run(["cmake", f"-DSOURCE_DIR={tree}", "-P", str(SCRIPT)],
                          capture_output=True, text=True)


def copy_of_sources(tmp_path):
    shutil.copytree(REPO / "src", tmp_path / "src")
    return tmp_path


def test_this_checkout_keeps_its_layers():
    result = check(REPO)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("header, include, message", [
    ("model/init.h", "schedule/schedule.h",
     "src/model/init.h (model, layer 1) includes schedule/schedule.h"),
    ("backend/cpu/cpu_backend.h", "backend/cuda/cuda_device.h",
     "cpu_backend.h (backend/cpu, layer 6) includes backend/cuda/cuda_device.h"),
    # The CUDA backend's plain C++, built in every build, is a layer 6 file like its kernels.
    ("backend/cuda/cuda_backend_buffers.h", "engine/run_composer.h",
     "cuda_backend_buffers.h (backend/cuda, layer 6) includes engine/run_composer.h"),
])
def test_an_include_up_or_across_the_layers_fails(tmp_path, header, include, message):
    tree = copy_of_sources(tmp_path)
    with open(tree / "src" / header, "a") as written:
        written.write(f'#include "{include}"\n')
    result = check(tree)
    assert result.returncode != 0
    assert message in result.stderr


def test_a_test_may_include_any_layer(tmp_path):
    tree = copy_of_sources(tmp_path)
    with open(tree / "src" / "model" / "init_layers_test.cpp", "w") as test:
        test.write('#include "engine/run_composer.h"\n')
    assert check(tree).returncode == 0


def test_a_folder_without_a_layer_fails(tmp_path):
    tree = copy_of_sources(tmp_path)
    (tree / "src" / "newthing").mkdir()
    (tree / "src" / "newthing" / "thing.h").write_text('#include "core/error.h"\n')
    result = check(tree)
    assert result.returncode != 0
    assert "'newthing' has no layer" in result.stderr
