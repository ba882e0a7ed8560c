"""Run archives: cached runs packed on one machine and unpacked on another serve run_or_load as the originals did."""

import io
import json
import lzma
import tarfile

import pytest
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen import cli, experiments
from fedfrozen.runs import archive


@pytest.fixture(scope="module")
def cached(tmp_path_factory):
    """Two finished tiny runs in a cache of their own: (root, configs, their Histories)."""
    root = tmp_path_factory.mktemp("cache")
    cfgs = [tiny_config(rounds=2, seed=s) for s in (0, 1)]
    hists = ff.run_many(cfgs, root=root, experiment="t", workers=1, progress=False)
    return root, cfgs, hists


def _entries(cfgs):
    return [("t", experiments.config_key(c)) for c in cfgs]


def test_unpacked_runs_are_served_by_the_cache_as_the_originals(cached, tmp_path):
    root, cfgs, hists = cached
    done = archive.pack(tmp_path / "a.tar.xz", _entries(cfgs), root=root)
    assert done["entries"] == 2 and done["bytes"] == (tmp_path / "a.tar.xz").stat().st_size
    fresh = tmp_path / "elsewhere"
    report = archive.unpack(tmp_path / "a.tar.xz", root=fresh)
    assert sorted(report["added"]) == sorted(f"t/{k}" for _, k in _entries(cfgs)) and not report["differs"]
    for cfg, hist in zip(cfgs, hists):
        again = ff.run_or_load(cfg, root=fresh, experiment="t", progress=False)
        assert again.cached and again.same_as(hist) and again.env == hist.env  # its machine travels with it
    assert archive.unpack(tmp_path / "a.tar.xz", root=fresh)["present"] == report["added"]  # a second time: a no-op


def test_packing_twice_gives_the_same_bytes(cached, tmp_path):
    root, cfgs, _ = cached
    archive.pack(tmp_path / "a.tar.xz", _entries(cfgs), root=root)
    archive.pack(tmp_path / "b.tar.xz", list(reversed(_entries(cfgs))), root=root)
    assert (tmp_path / "a.tar.xz").read_bytes() == (tmp_path / "b.tar.xz").read_bytes()


def test_pack_refuses_a_run_not_in_the_cache_and_writes_nothing(cached, tmp_path):
    root, cfgs, _ = cached
    missing = experiments.config_key(tiny_config(rounds=2, seed=7))
    with pytest.raises(ValueError, match=f"entry t/{missing} .*cannot be packed"):
        archive.pack(tmp_path / "a.tar.xz", [*_entries(cfgs), ("t", missing)], root=root)
    assert not (tmp_path / "a.tar.xz").exists()
    with pytest.raises(ValueError, match="entries is empty"):
        archive.pack(tmp_path / "a.tar.xz", [], root=root)


def _rewrite(src, dst, change):
    """A copy of archive `src` with `change(name, data) -> data` applied to each member."""
    raw = lzma.decompress(src.read_bytes())
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tin, tarfile.open(fileobj=out, mode="w") as tout:
        for m in tin.getmembers():
            data = change(m.name, tin.extractfile(m).read())
            m.size = len(data)
            tout.addfile(m, io.BytesIO(data))
    dst.write_bytes(lzma.compress(out.getvalue()))


def test_unpack_refuses_an_edited_history_and_writes_nothing(cached, tmp_path):
    root, cfgs, _ = cached
    archive.pack(tmp_path / "a.tar.xz", _entries(cfgs), root=root)
    last = sorted(_entries(cfgs))[-1][1]  # the second entry: the first, sound one must not be written either

    def edit(name, data):
        if name == f"t/{last}/history.json":
            return data + b" "  # one byte more: its digest no longer matches
        return data

    _rewrite(tmp_path / "a.tar.xz", tmp_path / "bad.tar.xz", edit)
    fresh = tmp_path / "elsewhere"
    with pytest.raises(ValueError, match=f"entry t/{last} is refused: history.json changed since the digest"):
        archive.unpack(tmp_path / "bad.tar.xz", root=fresh)
    assert not fresh.exists() or not any(fresh.rglob("history.json"))


def test_unpack_refuses_an_entry_whose_key_is_not_its_configs(cached, tmp_path):
    """An entry of another package version (its key hashes the version) or a renamed folder is not served."""
    root, cfgs, _ = cached
    archive.pack(tmp_path / "a.tar.xz", _entries(cfgs)[:1], root=root)
    key = _entries(cfgs)[0][1]
    raw = lzma.decompress((tmp_path / "a.tar.xz").read_bytes())
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as tin, tarfile.open(fileobj=out, mode="w") as tout:
        for m in tin.getmembers():
            data = tin.extractfile(m).read()
            m.name = m.name.replace(key, "0" * 12)
            tout.addfile(m, io.BytesIO(data))
    (tmp_path / "moved.tar.xz").write_bytes(lzma.compress(out.getvalue()))
    with pytest.raises(ValueError, match=f"its config's key in this version of fedfrozen is {key}, not 000000000000"):
        archive.unpack(tmp_path / "moved.tar.xz", root=tmp_path / "elsewhere")


def test_unpack_refuses_a_member_outside_an_entry(tmp_path):
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        info = tarfile.TarInfo("../escape.json")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"{}"))
    (tmp_path / "evil.tar.xz").write_bytes(lzma.compress(out.getvalue()))
    with pytest.raises(ValueError, match="member '../escape.json' is not EXPERIMENT/KEY/FILE"):
        archive.unpack(tmp_path / "evil.tar.xz", root=tmp_path / "r")
    (tmp_path / "junk.tar.xz").write_bytes(b"not xz")
    with pytest.raises(ValueError, match="is not a readable .tar.xz"):
        archive.unpack(tmp_path / "junk.tar.xz", root=tmp_path / "r")


def test_unpack_keeps_the_cached_run_where_the_archive_holds_another(cached, tmp_path):
    root, cfgs, _ = cached
    archive.pack(tmp_path / "a.tar.xz", _entries(cfgs), root=root)
    fresh = tmp_path / "elsewhere"
    archive.unpack(tmp_path / "a.tar.xz", root=fresh)
    key = _entries(cfgs)[0][1]
    mine = fresh / "t" / key / "history.json"
    mine.write_bytes(mine.read_bytes() + b" ")  # another History where the cache has this run (kept as it is)
    report = archive.unpack(tmp_path / "a.tar.xz", root=fresh)
    assert report["differs"] == [f"t/{key}"] and mine.read_bytes().endswith(b" ")


def test_the_command_line_packs_a_notebooks_configs_and_unpacks_them(cached, tmp_path, capsys):
    root, cfgs, _ = cached
    lines = [json.dumps({"key": k, "experiment": e, "config": {}}) for e, k in _entries(cfgs)]
    (tmp_path / "99_configs.jsonl").write_text("\n".join(lines) + "\n")
    out = tmp_path / "99.tar.xz"
    assert cli.main(["archive", "pack", str(out), "--configs", str(tmp_path / "99_configs.jsonl"),
                     "--out", str(root)]) == 0
    assert "2 runs" in capsys.readouterr().out
    assert cli.main(["archive", "unpack", str(out), "--out", str(tmp_path / "r")]) == 0
    assert "2 runs added, 0 already cached" in capsys.readouterr().out
    assert cli.main(["archive", "pack", str(out), "--out", str(root)]) == 2
    assert "give --configs" in capsys.readouterr().err


def test_an_unfinished_grid_is_packed_by_its_experiment_without_its_partial_runs(cached, tmp_path):
    root, cfgs, _ = cached
    partial = root / "t" / ".0123456789ab.partial"  # a run still training: its checkpoint stays behind
    partial.mkdir(exist_ok=True)
    assert archive.finished("t", root=root) == sorted(_entries(cfgs))
    with pytest.raises(ValueError, match="experiment 'nope' has no folder"):
        archive.finished("nope", root=root)
    with pytest.raises(ValueError, match=r"experiment '\.\./x' is not a folder name"):
        archive.finished("../x", root=root)


def test_a_later_batch_leaves_out_the_runs_earlier_archives_hold(cached, tmp_path, capsys):
    root, cfgs, _ = cached
    first = _entries(cfgs)[:1]
    archive.pack(tmp_path / "a.tar.xz", first, root=root)
    assert archive.held(tmp_path / "a.tar.xz") == first
    b = tmp_path / "b.tar.xz"
    assert cli.main(["archive", "pack", str(b), "--experiment", "t", "--skip", str(tmp_path / "a.tar.xz"),
                     "--out", str(root)]) == 0
    assert "1 runs" in capsys.readouterr().out and archive.held(b) == sorted(set(archive.finished("t", root=root))
                                                                             - set(first))
    assert cli.main(["archive", "pack", str(tmp_path / "c.tar.xz"), "--experiment", "t", "--skip",
                     str(tmp_path / "a.tar.xz"), str(b), "--out", str(root)]) == 2
    assert "nothing new to pack" in capsys.readouterr().err and not (tmp_path / "c.tar.xz").exists()
