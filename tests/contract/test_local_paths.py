"""`mnist_common.local_paths`: deletes and moves that never go through a
symbolic link on local disk, and other schemes handed to the caller's store."""

from __future__ import annotations

import os

import pytest

from mnist_common import local_paths


@pytest.fixture
def outside(tmp_path):
    """A folder no program owns, with a file in it."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "NOTE.txt").write_text("mine\n")
    return folder


def test_remove_tree_removes_links_inside_it_as_links(tmp_path, outside):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    (tree / "sub" / "file").write_bytes(b"x")
    os.symlink(outside, tree / "sub" / "to_folder")
    os.symlink(outside / "NOTE.txt", tree / "to_file")
    local_paths.remove_tree(str(tree))
    assert not tree.exists()
    assert (outside / "NOTE.txt").read_text() == "mine\n"


def test_remove_tree_on_a_link_removes_the_link_with_a_warning(tmp_path, outside, caplog):
    link = tmp_path / "export"
    os.symlink(outside, link)
    local_paths.remove_tree(str(link))
    assert not os.path.lexists(link)
    assert (outside / "NOTE.txt").read_text() == "mine\n"
    assert f"{link}: a symbolic link (to {outside}) where a folder was expected" in caplog.text


def test_remove_tree_on_nothing_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        local_paths.remove_tree(str(tmp_path / "none"))


def test_remove_files_removes_a_link_not_its_target(tmp_path, outside):
    link = tmp_path / "metrics.json"
    os.symlink(outside / "NOTE.txt", link)
    dangling = tmp_path / "dangling"
    os.symlink(tmp_path / "nowhere", dangling)
    local_paths.remove_files([str(link), str(dangling)])
    assert not os.path.lexists(link) and not os.path.lexists(dangling)
    assert (outside / "NOTE.txt").read_text() == "mine\n"


def test_remove_files_refuses_a_folder(outside):
    with pytest.raises(IsADirectoryError):
        local_paths.remove_file(str(outside))
    assert (outside / "NOTE.txt").exists()


def test_move_refuses_a_link_as_its_source(tmp_path, outside):
    link = tmp_path / ".incomplete-r1"
    os.symlink(outside, link)
    with pytest.raises(local_paths.SymlinkRefused) as refused:
        local_paths.move(str(link), str(tmp_path / "moved"), overwrite=True)
    assert refused.value.filename == str(link)
    assert "a symbolic link (to " in refused.value.strerror
    assert os.path.islink(link) and not os.path.lexists(tmp_path / "moved")


def test_move_replaces_a_link_at_the_target_as_a_link(tmp_path, outside):
    source, target = tmp_path / "new", tmp_path / "metrics.json"
    source.write_text("new\n")
    os.symlink(outside / "NOTE.txt", target)
    with pytest.raises(FileExistsError):
        local_paths.move(str(source), str(target), overwrite=False)
    local_paths.move(str(source), str(target), overwrite=True)
    assert not os.path.islink(target) and target.read_text() == "new\n"
    assert (outside / "NOTE.txt").read_text() == "mine\n"


def test_check_is_file_refuses_a_fifo_and_a_folder(tmp_path, outside):
    fifo = tmp_path / "manifest.json"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (outside, "a directory")):
        with pytest.raises(local_paths.NotAFile) as refused:
            local_paths.check_is_file(str(path))
        assert refused.value.strerror == f"is {kind}, not a file"
    local_paths.check_is_file(str(outside / "NOTE.txt"))
    local_paths.check_is_file("gs://bucket/manifest.json")  # no local check there


class Recording:
    """A store for other schemes that records what it is asked."""

    def __init__(self):
        self.calls = []

    def delete(self, paths):
        self.calls.append(("delete", list(paths)))

    def delete_tree(self, path):
        self.calls.append(("delete_tree", path))

    def rename(self, sources, targets, overwrite):
        self.calls.append(("rename", list(sources), list(targets), overwrite))


def test_other_schemes_go_to_the_callers_store(tmp_path):
    store = Recording()
    local = tmp_path / "local"
    local.write_bytes(b"x")
    local_paths.remove_files([str(local), "ram://a/b"], via=store)
    local_paths.remove_tree("gs://bucket/dir", via=store)
    local_paths.move_all(["gs://b/x", "gs://b/y"], ["gs://b/z", "gs://b/w"],
                         overwrite=True, via=store)
    assert not local.exists()
    assert store.calls == [("delete", ["ram://a/b"]), ("delete_tree", "gs://bucket/dir"),
                           ("rename", ["gs://b/x", "gs://b/y"], ["gs://b/z", "gs://b/w"],
                            True)]
    assert not local_paths.is_link("gs://bucket/dir")
