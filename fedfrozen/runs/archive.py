"""Run archives: finished cache entries packed into one file that travels (a commit, a colleague, a new machine).

The run cache (`results/`) lives on one machine; a grid longer than one sitting on a machine that does not last (a
cloud instance, a CI runner, a laptop that is wiped) loses its finished runs with it. An archive holds cached
entries as they are, every file of each (config.json, env.json, history.json, digest.json), so that:

    fedfrozen archive pack archives/13_p4.tar.xz --configs figures/13_configs.jsonl   # what a notebook committed
    fedfrozen archive unpack archives/13_p4.tar.xz                                    # on the next machine

puts them back where `run_or_load` finds them, and the grid goes on from there. A grid that spans several sittings
packs each batch once: `fedfrozen archive pack archives/13_b.tar.xz --experiment fashion_mnist --skip archives/*.tar.xz`
leaves out the runs that earlier archives already hold (`held`). Unpacking checks each entry as the
cache does when it loads one (its digest, its History's config and rounds) and that its key is the key this version
of the package gives its config: an entry of another package version, a damaged or an edited one is refused, naming
it, and nothing of it is written. An entry already in the cache is left as it is (the cache's run is this machine's;
`unpack` reports when the archive's differs). Each History keeps its env.json, so a table built from unpacked runs
still says on which machine each row was trained (the per-seed tables' `machine` column).

An archive is deterministic (entries in key order, no owner or time stamps): packing the same entries twice gives
the same bytes.
"""

from __future__ import annotations

import io
import json
import lzma
import re
import tarfile
from pathlib import Path

from ..base.io import atomic_dir, atomic_write
from .experiments import _FILES, _problem, config_key, results_root

__all__ = ["pack", "unpack", "configs_of", "finished", "held", "ENTRY_FILES"]

ENTRY_FILES = (*_FILES, "digest.json")
_KEY = re.compile(r"[0-9a-f]{12}")
_EXPERIMENT = re.compile(r"[A-Za-z0-9_.-]+")


def configs_of(jsonl) -> list[tuple[str, str]]:
    """(experiment, key) of every line of a notebook's NN_configs.jsonl (`ff.plots.save_per_seed`), in its order."""
    out = []
    for i, line in enumerate(Path(jsonl).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            out.append((str(row["experiment"]), str(row["key"])))
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"configs {jsonl}: line {i} is not a {{'key', 'experiment', 'config'}} object "
                             f"({e})") from None
    return out


def finished(experiment: str, root=None) -> list[tuple[str, str]]:
    """(experiment, key) of every finished entry of `experiment` in the cache under `root` (default results/): a
    grid's runs so far, to carry an unfinished grid to the next machine (its partial runs stay behind)."""
    _check_name(experiment, "0" * 12)
    folder = results_root(root) / experiment
    if not folder.is_dir():
        raise ValueError(f"experiment {experiment!r} has no folder under {results_root(root)}")
    return [(experiment, p.name) for p in sorted(folder.iterdir()) if p.is_dir() and _KEY.fullmatch(p.name)]


def held(path) -> list[tuple[str, str]]:
    """(experiment, key) of every entry of the archive `path`, sorted (its members checked as `unpack` reads them):
    the runs an earlier batch already carries, to leave out of the next (`fedfrozen archive pack --skip`)."""
    return sorted(_read(Path(path)))


def _check_name(experiment: str, key: str) -> None:
    if not _EXPERIMENT.fullmatch(experiment) or experiment in (".", ".."):
        raise ValueError(f"experiment {experiment!r} is not a folder name (letters, digits, _ . -)")
    if not _KEY.fullmatch(key):
        raise ValueError(f"key {key!r} is not a cache key (12 hex digits)")


def pack(path, entries, root=None) -> dict:
    """Write the cached entries `entries` ((experiment, key) pairs, e.g. `configs_of(...)`) under `root` (default
    results/) to the xz-compressed tar file `path`, atomically. Every entry must be in the cache and sound (else a
    ValueError names the first that is not, and nothing is written). Returns {"entries": n, "bytes": size}."""
    root = results_root(root)
    entries = sorted(dict.fromkeys((str(e), str(k)) for e, k in entries))
    if not entries:
        raise ValueError("entries is empty: nothing to pack")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for experiment, key in entries:
            _check_name(experiment, key)
            folder = root / experiment / key
            why = _sound(folder, key)
            if why:
                raise ValueError(f"entry {experiment}/{key} under {root} cannot be packed: {why}")
            for name in ENTRY_FILES:
                data = (folder / name).read_bytes()
                info = tarfile.TarInfo(f"{experiment}/{key}/{name}")
                info.size, info.mtime, info.mode = len(data), 0, 0o644
                tar.addfile(info, io.BytesIO(data))
    packed = lzma.compress(buf.getvalue(), preset=9)
    atomic_write(Path(path), lambda tmp: Path(tmp).write_bytes(packed))
    return {"entries": len(entries), "bytes": len(packed)}


def _sound(folder: Path, key: str) -> str | None:
    """What is wrong with the entry in `folder` (a complete cache entry whose config's key is `key`), or None."""
    from ..engine.config import Config

    try:
        stored = json.loads((folder / "config.json").read_text())
        cfg = Config.from_dict(stored)
    except (OSError, ValueError, TypeError) as e:
        return f"no readable config.json ({type(e).__name__}: {e})"
    if config_key(cfg) != key:
        return (f"its config's key in this version of fedfrozen is {config_key(cfg)}, not {key} (an entry of "
                f"another version, or an edited config)")
    why, _ = _problem(folder, cfg)
    return why


def _read(path: Path) -> dict[tuple[str, str], dict[str, bytes]]:
    """The archive's entries {(experiment, key): {file name: bytes}}, its member names checked first."""
    try:
        raw = lzma.decompress(Path(path).read_bytes())
    except (OSError, lzma.LZMAError) as e:
        raise ValueError(f"archive {path} is not a readable .tar.xz ({type(e).__name__}: {e})") from None
    entries: dict[tuple[str, str], dict[str, bytes]] = {}
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tar:
        for member in tar.getmembers():
            parts = member.name.split("/")
            if (not member.isfile() or len(parts) != 3 or parts[2] not in ENTRY_FILES):
                raise ValueError(f"archive {path}: member {member.name!r} is not EXPERIMENT/KEY/FILE of a cache entry")
            _check_name(parts[0], parts[1])
            entries.setdefault((parts[0], parts[1]), {})[parts[2]] = tar.extractfile(member).read()
    for (experiment, key), files in entries.items():
        missing = sorted(set(ENTRY_FILES) - set(files))
        if missing:
            raise ValueError(f"archive {path}: entry {experiment}/{key} lacks {', '.join(missing)}")
    return entries


def unpack(path, root=None) -> dict:
    """Put the archive's entries into the cache under `root` (default results/), each one atomically and only where
    the cache has none. Every entry is checked before anything is written (its files' digest, its History's config
    and rounds, its key under this version): a ValueError names the first that fails. Returns {"added": [...],
    "present": [...], "differs": [...]} of "experiment/key" names: added now, already cached with the same History,
    already cached with another (kept: that one is this machine's)."""
    root = results_root(root)
    entries = _read(Path(path))
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:  # check each entry as the cache will load it, before any is written
        for (experiment, key), files in entries.items():
            folder = Path(tmp) / experiment / key
            folder.mkdir(parents=True)
            for name, data in files.items():
                (folder / name).write_bytes(data)
            why = _sound(folder, key)
            if why:
                raise ValueError(f"archive {path}: entry {experiment}/{key} is refused: {why}")
    report: dict[str, list[str]] = {"added": [], "present": [], "differs": []}
    for (experiment, key), files in sorted(entries.items()):
        folder = root / experiment / key
        name = f"{experiment}/{key}"
        if folder.exists():
            mine = folder / "history.json"
            same = mine.exists() and mine.read_bytes() == files["history.json"]
            report["present" if same else "differs"].append(name)
            continue
        atomic_dir(folder, lambda tmp, files=files: [(Path(tmp) / n).write_bytes(d) for n, d in files.items()])
        report["added"].append(name)
    return report
