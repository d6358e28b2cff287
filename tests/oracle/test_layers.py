"""The build refuses an include that points up the layers (scripts/check_layers.cmake, run by the
layup_layer_check target before every library): this checkout passes, and a copy of its sources
with one wrong-way include (in any of the include forms), an include of a lower folder that the
table's row (its library's links) does not name, or a folder the layers do not name, fails naming
the file; a table whose row links up or across fails too."""
import shutil
import subprocess

import pytest

from paths import REPO

SCRIPT = REPO / "scripts" / "check_layers.cmake"


def check(tree, script=SCRIPT):
    return subprocess.run(["cmake", f"-DSOURCE_DIR={tree}", "-P", str(script)],
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


# Every form the compiler reads: quoted or angle, any spacing around the #, and a quoted path
# found beside the including file (as the compiler looks there first).
@pytest.mark.parametrize("line, message", [
    ('#include <schedule/schedule.h>',
     "src/model/init.h (model, layer 1) includes schedule/schedule.h (schedule, layer 7) "
     "as #include <schedule/schedule.h>"),
    ('  #  include "schedule/schedule.h"',
     "src/model/init.h (model, layer 1) includes schedule/schedule.h (schedule, layer 7)"),
    ('\t#include\t<schedule/schedule.h>',
     "src/model/init.h (model, layer 1) includes schedule/schedule.h (schedule, layer 7)"),
    ('#include "../schedule/schedule.h"',
     "src/model/init.h (model, layer 1) includes schedule/schedule.h (schedule, layer 7) "
     'as #include "../schedule/schedule.h"'),
    # Across, to a folder of the same rank.
    ('#include "tokenizer/tokenizer.h"',
     "src/model/init.h (model, layer 1) includes tokenizer/tokenizer.h (tokenizer, layer 1)"),
])
def test_every_include_form_is_read(tmp_path, line, message):
    tree = copy_of_sources(tmp_path)
    with open(tree / "src" / "model" / "init.h", "a") as written:
        written.write(line + "\n")
    result = check(tree)
    assert result.returncode != 0
    assert message in result.stderr


def test_a_path_beside_the_file_is_its_own_folder(tmp_path):
    # "ops/matmul.h" in backend/cpu/ is backend/cpu/ops/matmul.h, not a folder ops/; a slash-less
    # name is the file's own folder; angle includes of system and third-party headers, and the
    # generated build_commit.h (in no src/ folder), are not layup's layers.
    tree = copy_of_sources(tmp_path)
    with open(tree / "src" / "backend" / "cpu" / "cpu_backend.h", "a") as written:
        written.write('#include "ops/matmul.h"\n#include "cpu_backend.h"\n'
                      '#include <vector>\n#include <nlohmann/json.hpp>\n#include "build_commit.h"\n')
    result = check(tree)
    assert result.returncode == 0, result.stderr


def test_a_lower_folder_its_row_does_not_name_fails(tmp_path):
    # comm (layer 5) may not include model (layer 1) until its row names it: its library would
    # not link layup_model.
    tree = copy_of_sources(tmp_path)
    with open(tree / "src" / "comm" / "communicator.h", "a") as written:
        written.write('#include "model/model_config.h"\n')
    result = check(tree)
    assert result.returncode != 0
    assert ("src/comm/communicator.h (comm) includes model/model_config.h (model)" in
            result.stderr)
    assert "the row of 'comm' in scripts/check_layers.cmake does not name 'model'" in result.stderr


def test_a_row_that_links_up_or_names_an_unused_folder_fails(tmp_path):
    table = SCRIPT.read_text()
    row = "layup_define_layer(model           1  core)"
    assert row in table
    script = tmp_path / "check_layers.cmake"
    script.write_text(table.replace(row, row[:-1] + " schedule tokenizer)"))
    result = check(REPO, script)
    assert result.returncode != 0
    assert "the row of 'model' (layer 1) names 'schedule' (layer 7): a link up" in result.stderr
    assert "the row of 'model' (layer 1) names 'tokenizer' (layer 1)" in result.stderr

    script.write_text(table.replace("layup_define_layer(tier            5  core memory)",
                                    "layup_define_layer(tier            5  core memory io)"))
    result = check(REPO, script)
    assert result.returncode != 0
    assert ("the row of 'tier' in scripts/check_layers.cmake names 'io', which no source of "
            "src/tier/ includes" in result.stderr)
