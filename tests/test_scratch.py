"""``keras_preact.scratch``: the one atomic writer and the clean-up of dead writers' temporaries."""

import os
import subprocess
import sys

import pytest

from keras_preact import scratch

pytestmark = [pytest.mark.notf]


def test_atomic_path_renames_a_complete_file_into_place(tmp_path):
    target = tmp_path / "sub" / "data.json"
    with scratch.atomic_path(target) as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(f".tmp-data.json-pid{os.getpid()}")
        assert tmp.suffix == ".json"  # writers that pick a format by suffix (savefig) still work
        tmp.write_text("complete")
        assert not target.exists()
    assert target.read_text() == "complete"
    assert sorted(p.name for p in target.parent.iterdir()) == ["data.json"]


@pytest.mark.parametrize("make", ["file", "folder"])
def test_atomic_path_keeps_the_old_target_and_no_temporary_when_the_block_fails(tmp_path, make):
    target = tmp_path / "state"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="interrupted"):
        with scratch.atomic_path(target) as tmp:
            if make == "file":
                tmp.write_text("half")
            else:
                (tmp / "inner").mkdir(parents=True)
            raise RuntimeError("interrupted")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]


def test_remove_stale_deletes_only_dead_processes_temporaries(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True)
    dead_pid = int(dead.stdout)
    (tmp_path / f".tmp-model.keras-pid{dead_pid}.keras").write_text("x")
    (tmp_path / f".tmp-1-pid{dead_pid}-abc").mkdir()
    live = tmp_path / f".tmp-model.keras-pid{os.getpid()}.keras"
    live.write_text("x")
    mine_not = tmp_path / ".tmp-notours"
    mine_not.write_text("x")
    removed = scratch.remove_stale(tmp_path)
    assert sorted(removed) == sorted([f".tmp-model.keras-pid{dead_pid}.keras", f".tmp-1-pid{dead_pid}-abc"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, mine_not.name])
    assert scratch.remove_stale(tmp_path / "missing") == []


def test_save_figure_writes_a_png_atomically(tmp_path):
    pytest.importorskip("matplotlib")
    from keras_preact.analysis.plots import _pyplot, save_figure

    fig = _pyplot().figure()
    path = save_figure(fig, tmp_path / "curves.png")
    assert path == str(tmp_path / "curves.png")
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.png"]
