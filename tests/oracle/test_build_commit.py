"""scripts/build_commit.cmake names the commit only of a checkout whose top level is the source
folder: a source tree unpacked inside another repository records "unknown", not that one's commit."""
import os
import shutil
import subprocess

import pytest

from paths import REPO

pytestmark = pytest.mark.skipif(not shutil.which("git") or not shutil.which("cmake"),
                                reason="needs git and cmake")


def git(folder, *args):
    return subprocess.run(["git", "-C", str(folder), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def inside_a_repository(folder):
    return subprocess.run(["git", "-C", str(folder), "rev-parse"],
                          capture_output=True).returncode == 0


def new_repository(folder):
    """A repository at folder with everything in it committed; returns the commit."""
    folder.mkdir(parents=True, exist_ok=True)
    git(folder, "init", "-q")
    (folder / "README").write_text("a project\n")
    git(folder, "add", "-A")
    git(folder, "-c", "user.name=test", "-c", "user.email=test@example.com", "commit", "-q",
        "-m", "a commit")
    return git(folder, "rev-parse", "HEAD")


def unpacked_source(folder):
    """A source tree as an archive unpacks it: the script, and no .git of its own."""
    (folder / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "build_commit.cmake", folder / "scripts")
    return folder


def recorded_commit(source_dir, tmp_path):
    """The commit in the header the script writes for source_dir."""
    header = tmp_path / "build_commit.h"
    subprocess.run(["cmake", f"-DSOURCE_DIR={source_dir}", f"-DOUTPUT={header}", "-P",
                    str(source_dir / "scripts" / "build_commit.cmake")],
                   check=True, capture_output=True, text=True)
    return header.read_text().split('#define LAYUP_BUILD_COMMIT "')[1].split('"')[0]


def test_a_source_tree_inside_another_repository_records_unknown(tmp_path):
    new_repository(tmp_path / "other")
    source = unpacked_source(tmp_path / "other" / "vendor" / "layup")
    assert recorded_commit(source, tmp_path) == "unknown"


def test_a_source_tree_outside_any_repository_records_unknown(tmp_path):
    if inside_a_repository(tmp_path):
        pytest.skip(f"{tmp_path} lies inside a git repository")
    assert recorded_commit(unpacked_source(tmp_path / "layup"), tmp_path) == "unknown"


def test_a_checkout_records_its_commit_also_through_a_symbolic_link(tmp_path):
    checkout = unpacked_source(tmp_path / "layup")
    commit = new_repository(checkout)
    assert recorded_commit(checkout, tmp_path) == commit
    os.symlink(checkout, tmp_path / "link")
    assert recorded_commit(tmp_path / "link", tmp_path) == commit
    (checkout / "README").write_text("changed\n")
    assert recorded_commit(checkout, tmp_path) == commit + "-dirty"


def test_this_checkout_records_its_own_commit(tmp_path):
    if not inside_a_repository(REPO):
        pytest.skip(f"{REPO} is not a git checkout")
    assert recorded_commit(REPO, tmp_path).startswith(git(REPO, "rev-parse", "HEAD"))
