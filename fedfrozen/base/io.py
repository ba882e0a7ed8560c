"""The ground floor: atomic writes, provenance and the project root. Imports nothing of the package
but its version.

`atomic_write(path, write)` is the one way files are written: `write(tmp)` fills a temporary
file next to `path`, which is then renamed over it, so a reader never sees a half-written file.
`atomic_dir(folder, fill)` does the same for a whole folder (a cached run appears only once
complete).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["atomic_write", "atomic_dir", "file_lock", "environment", "cpu_model", "cpu_flags", "cpu_capability",
           "cpu_numerics", "blas", "NUMERIC_FLAGS", "machine", "legacy_signature", "machine_id",
           "project_root", "notebooks", "DRY_RUN_ENV",
           "dry_run_settings", "THREADS_ENV", "threads_setting", "use_threads", "follow_threads", "RUN_LOG_ENV",
           "log_run", "FIGURES_ENV"]

THREADS_ENV = "FEDFROZEN_THREADS"  # CPU threads for torch in every run of this process and the kernels it starts
DRY_RUN_ENV = "FEDFROZEN_DRY_RUN"  # JSON settings of `fedfrozen dry-run`, set only in the kernels it starts
RUN_LOG_ENV = "FEDFROZEN_RUN_LOG"  # a JSON-lines file: one line per run a process loads or trains (`fedfrozen budget`)
# a folder that takes every figure and table instead of figures/ (`fedfrozen budget` executes the notebooks into a
# temp dir: a timing leaves the committed figures as they are)
FIGURES_ENV = "FEDFROZEN_FIGURES"
# Arguments of every notebook kernel the project starts (reproduce, dry-run, tools/refresh_outputs.py): the kernel's
# own log (not the notebook's outputs, and not Python warnings of its cells) shows errors only, so its start-up line
# "Kernel is running over TCP without encryption" (the kernel and its client both listen on 127.0.0.1 here) is not
# printed to users.
KERNEL_ARGS = ["--IPKernelApp.log_level=ERROR"]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _share(path: Path) -> None:
    """Permissions by the user's umask (mkstemp/mkdtemp make 0600/0700: a group sharing results could not read)."""
    mask = _umask()
    if path.is_dir():
        os.chmod(path, 0o777 & ~mask)
        for sub in path.rglob("*"):
            os.chmod(sub, (0o777 if sub.is_dir() else 0o666) & ~mask)
    else:
        os.chmod(path, 0o666 & ~mask)


def atomic_write(path, write) -> Path:
    """Call `write(tmp_path)` on a temporary file beside `path`, then rename it to `path`.

    Parent folders are created; on any error the temporary file is removed and `path` is left as it was.
    The file gets the permissions the user's umask gives a new file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=f"{path.suffix}.tmp")
    os.close(fd)
    try:
        write(tmp)
        _share(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_dir(folder, fill, tries: int = 100) -> Path:
    """Call `fill(tmp_folder)` on a fresh temporary folder beside `folder`, then put it in `folder`'s place
    (replacing an existing one, also while other processes do the same). On any error the temporary folder
    is removed. Permissions follow the user's umask."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        fill(tmp)
        _share(tmp)
        for _ in range(tries):
            try:
                os.replace(tmp, folder)  # atomic where folder is absent (or an empty folder)
                return folder
            except OSError as e:
                if e.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                    raise
            old = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}.old."))
            with contextlib.suppress(FileNotFoundError):  # move what is there aside (another writer may
                os.replace(folder, old / "entry")               # just have done so), then try again
            shutil.rmtree(old, ignore_errors=True)
        raise OSError(f"could not put {folder} in place after {tries} tries: other processes keep replacing it")
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


class file_lock:
    """An exclusive advisory lock on `path` (created; flock, so the kernel releases it when a process dies).

    `with file_lock(p, wait=True)`: blocks while another process holds it (calling `on_wait()` first, once);
    with wait=False raises BlockingIOError instead. Where fcntl is missing (Windows) it locks nothing.
    `remove=True` deletes the lock file when the block ends without an error (a process still waiting on the
    old file then gets it and finds the work done, as does one that makes a new file).
    """

    def __init__(self, path, wait: bool = True, on_wait=None, remove: bool = False):
        self.path, self.wait, self.on_wait, self.remove = Path(path), wait, on_wait, remove
        self.fd = None

    def __enter__(self):
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not on Linux/macOS
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not self.wait:
                os.close(self.fd)
                self.fd = None
                raise
            if self.on_wait is not None:
                self.on_wait()
            fcntl.flock(self.fd, fcntl.LOCK_EX)
        return self

    def __exit__(self, exc_type, *exc):
        if self.fd is not None:
            if self.remove and exc_type is None:
                self.path.unlink(missing_ok=True)  # still holding the lock
            os.close(self.fd)  # closing releases the lock
            self.fd = None
        return False


def _git_commit() -> str | None:
    try:
        here = Path(__file__).resolve().parent
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def _cpuinfo_lines() -> list[str]:
    info = Path("/proc/cpuinfo")
    return info.read_text(errors="replace").splitlines() if info.exists() else []


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it ("AMD EPYC", "Intel(R) Xeon(R) Processor @ 2.80GHz"); where
    there is no /proc/cpuinfo (macOS, Windows), what `platform.processor()` says. A name, not the arithmetic: two
    CPUs of one name can sum floats differently (`cpu_numerics`)."""
    for line in _cpuinfo_lines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


# The instruction-set extensions that select other float kernels in torch's build (its own dispatch, oneDNN's and
# MKL's choose by them): fused multiply-add, the vector widths, the dot-product and reduced-precision units; on Arm,
# NEON/SVE. An EPYC with AVX-512 and one without both read "AMD EPYC" and give other digits (issue: the golden
# record's key).
NUMERIC_FLAGS = ("fma", "avx2", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                 "asimd", "sve", "sve2", "bf16", "i8mm")


def cpu_flags() -> list[str]:
    """Which of NUMERIC_FLAGS the CPU has (/proc/cpuinfo's `flags`, on Arm `Features`), in NUMERIC_FLAGS' order;
    empty where there is no /proc/cpuinfo."""
    for line in _cpuinfo_lines():
        if line.startswith(("flags", "Features")):
            have = set(line.split(":", 1)[1].split())
            return [f for f in NUMERIC_FLAGS if f in have]
    return []


def cpu_capability() -> str:
    """The vector kernels torch dispatches to on this CPU (`torch.backends.cpu.get_cpu_capability()`: "AVX512",
    "AVX2", "DEFAULT", ...; ATEN_CPU_CAPABILITY lowers it)."""
    import torch

    get = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    return str(get()) if get is not None else "unknown"


def blas() -> str:
    """The BLAS torch was built with (`BLAS_INFO` of `torch.__config__.show()`: "mkl", "open", ...)."""
    import re

    import torch

    found = re.search(r"BLAS_INFO=([^,\s]+)", torch.__config__.show())
    return found.group(1) if found else "unknown"


def cpu_numerics() -> str:
    """What the CPU adds to a run's float results beyond its name: torch's dispatched capability and the
    instruction-set flags that matter ("AVX512 (fma avx2 avx512f avx512_vnni avx512_bf16)")."""
    flags = " ".join(cpu_flags())
    return f"{cpu_capability()} ({flags})" if flags else cpu_capability()


def machine(threads: int | None = None, device: str = "cpu") -> str:
    """The machine signature of a run: what its float results depend on besides its config, seed and code (torch's
    build and BLAS, the CPU model, torch's CPU capability and the instruction-set flags that matter (`cpu_numerics`),
    the architecture, torch's thread count; on a GPU the GPU's name too). Two runs of one config with one signature
    give the same History bit for bit ("the same machine" wherever the docs say so); another signature gives other
    digits (about a point of late accuracy after 120 non-IID rounds) and, the project's promise, the same paired
    verdicts (docs/claims.md#reproducing-on-your-machine). `threads` defaults to torch's current count.

        torch 2.14.1+cu130, blas mkl | AMD EPYC | cpu capability AVX512 (fma avx2 avx512f ...) | x86_64 | 1 thread

    Histories written before the capability was part of it (issue: the golden record's key) carry the shorter
    "torch ... | CPU name | arch | n threads": `legacy_signature` tells them apart."""
    import torch

    n = torch.get_num_threads() if threads is None else int(threads)
    where = f"{cpu_model()} | cpu capability {cpu_numerics()}"
    if device.startswith("cuda") and torch.cuda.is_available():
        where = f"{where} | {torch.cuda.get_device_name()}"
    return (f"torch {torch.__version__}, blas {blas()} | {where} | {platform.machine()} | "
            f"{n} thread{'s' if n != 1 else ''}")


def legacy_signature(signature: str) -> bool:
    """Whether a machine signature was written before it named the CPU's capability: it names the CPU only, so
    two machines of one name but other arithmetic cannot be told apart by it."""
    return "cpu capability" not in signature


def machine_id(signature: str | None = None) -> str:
    """The short form of a machine signature (8 hex digits of its SHA-256), the `machine` column of the per-seed
    tables; of this process's signature (`machine()`) when none is given."""
    import hashlib

    return hashlib.sha256((signature if signature is not None else machine()).encode()).hexdigest()[:8]


def environment(device: str | None = None) -> dict:
    """Versions and machine facts stored with every result: the package versions, the device, the CPU model, torch's
    CPU capability, the instruction-set flags that matter, the BLAS and torch's thread count (what a run's floats
    depend on), the machine signature built from them (`machine`) and the git commit."""
    import numpy
    import timm
    import torch

    from .._version import __version__

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    return {"fedfrozen": __version__, "python": platform.python_version(), "torch": torch.__version__,
            "timm": timm.__version__, "numpy": numpy.__version__, "platform": platform.platform(),
            "device": device, "cpu": cpu_model(), "cpu_capability": cpu_capability(), "cpu_flags": cpu_flags(),
            "blas": blas(), "threads": torch.get_num_threads(),
            "machine": machine(device=device), "git_commit": _git_commit()}


def project_root() -> Path:
    """The repository root: the folder holding notebooks/ and pyproject.toml above the cwd or the
    package; the cwd when there is none (an installed package, e.g. on Colab)."""
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            if (folder / "notebooks").is_dir() and (folder / "pyproject.toml").is_file():
                return folder
    return Path.cwd()


def notebooks(only: str | None = None) -> list[Path]:
    """The project's numbered notebooks (notebooks/NN_*.ipynb), optionally only those numbered in
    `only` ("02,03"); a ValueError names an unknown number."""
    books = sorted((project_root() / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    if only:
        wanted = {w.strip() for w in only.split(",") if w.strip()}
        unknown = wanted - {b.name[:2] for b in books}
        if unknown:
            raise ValueError(f"--only: no notebook numbered {sorted(unknown)}; have {[b.name[:2] for b in books]}")
        books = [b for b in books if b.name[:2] in wanted]
    return books


def dry_run_settings() -> dict | None:
    """The settings of a running `fedfrozen dry-run` in this process (log, rounds, model_kwargs, one_seed,
    notebook), or None. Only fedfrozen.runs.dryrun sets them, in the notebook kernels it starts."""
    text = os.environ.get(DRY_RUN_ENV)
    return json.loads(text) if text else None


def threads_setting() -> int | None:
    """The CPU thread count FEDFROZEN_THREADS asks for (None: unset, torch's default); a ValueError naming it."""
    text = os.environ.get(THREADS_ENV, "").strip()
    if not text:
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"{THREADS_ENV} must be an integer >= 1; got {text!r}")
    return n


def use_threads(default: int = 1) -> int:
    """Set torch's CPU threads for this process to FEDFROZEN_THREADS, else `default`, and return the count.

    One thread is the default for the project's small models: a second one gains little on them and, when another
    process is busy on the machine, torch's threads spin against each other and a notebook's own work (notebook
    01's simulator, single runs, plotting) slows by an order of magnitude (measured: docs/engines.md). Every
    notebook calls it where it starts; `fedfrozen reproduce` sets FEDFROZEN_THREADS for the kernels it starts,
    and `ff.run_many` runs each of its workers on one thread. The count is also put in FEDFROZEN_THREADS, so that
    the processes this one starts (a Flower federation's apps: `follow_threads`) compute as it does: a run's
    floating-point sums, and so its History, depend on the thread count."""
    import torch

    n = threads_setting() or default
    os.environ[THREADS_ENV] = str(n)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)
    return n


def follow_threads() -> None:
    """Set torch's CPU threads to FEDFROZEN_THREADS if it is set (fedfrozen.run and the Flower apps: the same
    count as the process that started them); else leave them."""
    import torch

    n = threads_setting()
    if n is not None and torch.get_num_threads() != n:
        torch.set_num_threads(n)


def log_run(key: str, experiment: str, hist) -> None:
    """Append one line {key, experiment, cached, seconds} for History `hist` to the file named by FEDFROZEN_RUN_LOG,
    if it is set: which runs a notebook uses and how long each took to train (the sum of its rounds' seconds,
    measured when it was trained), read by `fedfrozen budget`. Nothing, not even the sum, when the variable is unset."""
    path = os.environ.get(RUN_LOG_ENV)
    if not path:
        return
    seconds = sum(row.get("seconds") or 0.0 for row in hist.rows)
    line = json.dumps({"key": key, "experiment": experiment, "cached": bool(hist.cached), "seconds": float(seconds)})
    with open(path, "a") as f:  # one short append per run: whole lines even from several processes
        f.write(line + "\n")
