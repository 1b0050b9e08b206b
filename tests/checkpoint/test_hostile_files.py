"""Raw checkpoint files crafted to hurt the machine that reads them are refused before torch reads them."""

from __future__ import annotations

import zipfile

import pytest
import torch
from typer.testing import CliRunner

from seedance_tasks import checkpoint
from seedance_tasks.checkpoint import _settings, ingest
from seedance_tasks.checkpoint.files import read_checkpoint
from seedance_tasks.cli import app
from seedance_tasks.errors import RefusedError


def _zip_bomb(path, elements=4_000_000):
    """A real torch.save file repacked with its members deflated: 16 MB of zeros in a few KB (a
    crafted file of a few MB the same way inflates to GBs in torch.load)."""
    plain = path.with_name("plain.pt")
    torch.save({"w": torch.zeros(elements)}, plain)
    with zipfile.ZipFile(plain) as source, zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as packed:
        for info in source.infolist():
            packed.writestr(info.filename, source.read(info.filename))
    plain.unlink()
    assert path.stat().st_size < elements * 4 // 100
    return path


def test_a_zip_bomb_pt_is_refused_and_the_inbox_goes_on(tmp_path):
    inbox, store = tmp_path / "inbox", tmp_path / "store"
    (inbox / "r").mkdir(parents=True)
    bomb = _zip_bomb(inbox / "r" / "step-2.pt")
    torch.save({"w": torch.ones(8)}, inbox / "r" / "step-1.pt")

    with pytest.raises(RefusedError, match="compressed member"):
        read_checkpoint(bomb)
    out = CliRunner().invoke(app, ["ckpt", "put", str(bomb), "--store", str(store), "--run", "x", "--step", "1"])
    assert out.exit_code == 3 and "compressed member" in out.output and "hint:" in out.output
    assert "Traceback" not in out.output

    results = [ingest.ingest_one(item, str(inbox), str(store), _settings()) for item in ingest.scan(str(inbox), 0)["ready"]]
    assert [(r["step"], r["status"]) for r in results] == [(1, "stored"), (2, "quarantined")]
    assert "compressed member" in results[1]["reason"]
    assert list((inbox / "_seedance" / "quarantine").rglob("step-2.pt"))  # kept, not deleted
    assert checkpoint.latest_step(str(store), "r") == 1


def test_an_ordinary_torch_save_file_still_reads(tmp_path):
    path = tmp_path / "ok.pt"
    torch.save({"w": torch.arange(5)}, path)
    assert torch.equal(read_checkpoint(path)["w"], torch.arange(5))
