"""Start Flower's own runtimes from Python and stop everything they started: `flwr run` on a local simulation
federation, and a TLS deployment (SuperLink + SuperNodes as separate processes) on 127.0.0.1.

Each launch uses a private Flower home (FLWR_HOME, a temporary folder): its config.toml names the SuperLink
connection, and every process the launch starts carries that folder in its command line, so `stop(home)`
finds and stops exactly those (Flower 1.42's `flwr run` against a `:local:` connection starts a managed
SuperLink that stays up after the run; this stops it). Only those: another Flower run on the same machine
(a second notebook, another user) is never looked at, stopped or counted; `processes_of(home)` is what a
caller checks afterwards (notebook 08, the tests). A launch that cannot stop its own processes raises.
Runtime dependency installation is switched off
(FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1): the apps run in the installed environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..base.history import History
from ..base.io import project_root

__all__ = ["flwr_run", "run_config_arg", "process_table", "processes_of", "stop", "deploy", "check_tls",
           "write_certificates", "write_node_keys", "LeftRunning"]


class LeftRunning(RuntimeError):
    """A launch's own processes still ran after SIGTERM and SIGKILL."""


def run_config_arg(run_config: dict) -> str:
    """`--run-config` text for Flower (TOML values): strings quoted (as TOML literal strings when they hold
    double quotes, e.g. a Config as JSON), numbers as they are."""
    def fmt(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if not isinstance(v, str):
            return repr(v)
        if '"' in v or "\\" in v:
            if "'" in v:
                raise ValueError(f"run-config value holds both quote kinds: {v!r}")
            return f"'{v}'"
        return f'"{v}"'
    return " ".join(f"{k}={fmt(v)}" for k, v in run_config.items())


def _env(home: Path) -> dict:
    env = dict(os.environ)
    env["FLWR_HOME"] = str(home)
    env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
    return env


LOCAL_PORTS_ENV = ("FLWR_LOCAL_SUPERLINK_HTTP_API_PORT", "FLWR_LOCAL_CONTROL_API_PORT")


def _local_ports(home: Path) -> dict:
    """The ports of the managed local SuperLink of Flower home `home`: chosen free once per home and kept in
    it (a later run with the same home finds the SuperLink it left running). Flower's defaults (39091, 39093)
    are the same for every home, so two local runs on one machine would share one SuperLink, or the second
    would fail to start its own; with ports of its own a launch only ever talks to the SuperLink it started."""
    path = home / "local_ports.json"
    if path.exists():
        return json.loads(path.read_text())
    ports = dict(zip(LOCAL_PORTS_ENV, map(str, _free_ports(len(LOCAL_PORTS_ENV)))))
    path.write_text(json.dumps(ports))
    return ports


def _bin(name: str) -> str:
    """A Flower command installed with this Python (beside it, or on PATH)."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if not found:
        raise FileNotFoundError(f"{name!r} not found beside {sys.executable} nor on PATH: pip install -e \".[flower]\"")
    return found


def _flwr() -> str:
    return _bin("flwr")


def process_table() -> list[tuple[int, int, str, str]]:
    """(pid, parent pid, state, full command line) of every process, from /proc (ps truncates long lines
    when its output is not a terminal)."""
    rows = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            args = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            stat = (d / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        rows.append((int(d.name), int(fields[1]), fields[0], args))
    return rows


def processes_of(home) -> list[int]:
    """Pids of the live processes started for the Flower home `home` (its path is in their command line),
    and their children."""
    rows = [r for r in process_table() if r[2] != "Z"]
    mine = {pid for pid, _, _, args in rows if str(home) in args and pid != os.getpid()}
    grew = True
    while grew:
        children = {pid for pid, ppid, _, _ in rows if ppid in mine} - mine
        grew = bool(children)
        mine |= children
    return sorted(mine)


def stop(home, pids=(), timeout: float = 10.0) -> list[int]:
    """Stop `pids` and every process of the Flower home `home` (SIGTERM, then SIGKILL), looking again for
    processes they started meanwhile; the stopped pids. Raises LeftRunning naming any still alive."""
    stopped: set[int] = set()
    for _ in range(3):
        targets = sorted(p for p in set(pids) | set(processes_of(home)) if _alive(p))
        if not targets:
            return sorted(stopped)
        stopped |= set(targets)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in targets:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.time() + timeout
            while time.time() < deadline and any(_alive(p) for p in targets):
                time.sleep(0.2)
            if not any(_alive(p) for p in targets):
                break
    left = sorted(p for p in stopped | set(processes_of(home)) if _alive(p))
    if left:
        raise LeftRunning(f"processes of the Flower home {home} still run after SIGTERM and SIGKILL: {left}")
    return sorted(stopped)


def _alive(pid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # reap our own children
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def flwr_run(run_config: dict, num_supernodes: int, project=None, timeout: float = 900.0,
             home=None, keep: bool = False) -> tuple[History, str]:
    """`flwr run <project> --stream` on a local simulation federation of `num_supernodes` nodes, then stop the
    managed SuperLink it started (`keep=True` leaves it running for another run with the same `home`;
    `stop(home)` stops it). Returns (the run's History, Flower's output)."""
    project = Path(project) if project is not None else project_root()
    own_home = home is None
    home = Path(tempfile.mkdtemp(prefix="fedfrozen-flwr-")) if own_home else Path(home)
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text('[superlink]\ndefault = "local"\n\n[superlink.local]\naddress = ":local:"\n')
    out = home / "history.json"
    rc = {**run_config, "out": str(out)}
    try:
        return _flwr_run([str(project), "--stream", "--run-config", run_config_arg(rc), "--federation-config",
                          f"num-supernodes={int(num_supernodes)}"], {**_env(home), **_local_ports(home)}, out, timeout)
    finally:
        if not keep:
            stop(home)


def _flwr_run(args: list, env: dict, out: Path, timeout) -> tuple:
    """`flwr run ARGS` with `env`; (the History the ServerApp wrote to `out`, the command's output), or a
    RuntimeError with the end of its output when it failed or wrote none."""
    proc = subprocess.run([_flwr(), "run", *args], env=env, capture_output=True, text=True, timeout=timeout)
    log = proc.stdout + proc.stderr
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"flwr run failed (exit {proc.returncode}); its output ends:\n{log[-3000:]}")
    return History.load(out), log


def write_certificates(folder) -> dict:
    """A self-signed CA and a server certificate for 127.0.0.1/localhost (openssl); the file paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, csr, crt = (folder / n for n in ("ca.key", "ca.crt", "server.key", "server.csr", "server.pem"))
    ext = folder / "san.ext"
    ext.write_text("subjectAltName = IP:127.0.0.1, DNS:localhost\n")
    run = lambda *a: subprocess.run(a, check=True, capture_output=True)  # noqa: E731
    run("openssl", "genrsa", "-out", str(ca_key), "2048")
    run("openssl", "req", "-x509", "-new", "-key", str(ca_key), "-sha256", "-days", "2", "-subj", "/CN=fedfrozen-ca",
        "-out", str(ca))
    run("openssl", "genrsa", "-out", str(key), "2048")
    run("openssl", "req", "-new", "-key", str(key), "-subj", "/CN=127.0.0.1", "-out", str(csr))
    run("openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(crt), "-days", "2", "-sha256", "-extfile", str(ext))
    return {"ca": ca, "cert": crt, "key": key}


def write_node_keys(folder, names) -> dict:
    """An EC key pair (NIST P-384, OpenSSH format: what `flower-supernode --auth-supernode-private-key` and
    `flwr supernode register` read) per name; name -> (private key path, public key path)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in names:
        key = ec.generate_private_key(ec.SECP384R1())
        private, public = folder / name, folder / f"{name}.pub"
        private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                              serialization.NoEncryption()))
        private.chmod(0o600)
        public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                         serialization.PublicFormat.OpenSSH))
        out[name] = (private, public)
    return out


def _free_port() -> int:
    return _free_ports(1)[0]


def _free_ports(n: int) -> list[int]:
    """`n` distinct ports free on 127.0.0.1 now (all held open together while chosen, so none repeats)."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


JOINED = "SuperNode ID"  # what a SuperNode logs once the SuperLink accepted it


def _await_joined(nodes: dict, start, logs: Path, timeout: float = 180.0) -> None:
    """Wait until every SuperNode in `nodes` (name -> its args; started already) logs that it joined. One that
    exits before joining (a transient refusal, its port taken meanwhile) is started once more on a fresh port;
    a second exit, or `timeout` s without joining, raises with its log (not the server's later, vaguer timeout)."""
    procs = {name: start(name, args) for name, args in nodes.items()}
    retried: set[str] = set()
    deadline = time.time() + timeout
    while procs:
        for name in list(procs):
            exited = procs[name].poll() is not None  # before reading the log: an exit's last words are in it
            text = (logs / f"{name}.log").read_text(errors="replace")
            if JOINED in text:
                del procs[name]
            elif exited:
                if name in retried:
                    raise RuntimeError(f"SuperNode {name} exited twice ({procs[name].returncode}) before joining; "
                                       f"its log ends:\n{text[-2000:]}")
                retried.add(name)
                args = list(nodes[name])
                args[args.index("--port") + 1] = str(_free_port())
                (logs / f"{name}.log").rename(logs / f"{name}.first.log")
                procs[name] = start(name, args)
        if procs and time.time() > deadline:
            name = sorted(procs)[0]
            raise RuntimeError(f"SuperNode(s) {', '.join(sorted(procs))} did not join within {timeout:.0f} s; "
                               f"{name}'s log ends:\n{(logs / f'{name}.log').read_text(errors='replace')[-2000:]}")
        time.sleep(0.3)


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    import socket

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the SuperLink exited ({proc.returncode}); its log ends:\n{log.read_text()[-2000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.3)
    raise RuntimeError(f"the SuperLink did not listen on 127.0.0.1:{port} within {timeout:.0f} s")


def check_tls(port: int, ca) -> None:
    """A clear error when the SuperLink on 127.0.0.1:`port` does not present a certificate that `ca` trusts
    (Flower itself only says that the connection is unavailable)."""
    import socket
    import ssl

    ctx = ssl.create_default_context(cafile=str(ca))
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            ctx.wrap_socket(raw, server_hostname="127.0.0.1").close()  # the handshake is the check
    except ssl.SSLCertVerificationError as e:
        raise RuntimeError(f"TLS refused: the SuperLink's certificate is not trusted by the root certificates "
                           f"{ca} ({e.verify_message})") from None


def deploy(run_config: dict, num_supernodes: int = 3, project=None, timeout: float = 600.0, home=None,
           root_certificates=None, supernode_auth: bool = False, unregistered: int = 0) -> tuple[History, str]:
    """A real deployment on this machine: self-signed certificates, one SuperLink and `num_supernodes`
    SuperNodes (partition ids 0..n-1) as separate processes on 127.0.0.1 with TLS, the run submitted with
    `flwr run --stream`; every process started is stopped by pid afterwards. `root_certificates` replaces
    the CA that `flwr run` trusts (a wrong one must be refused). Returns (History, the output).

    `supernode_auth=True`: Flower's CLI-managed SuperNode authentication. The SuperLink starts with
    `--enable-supernode-auth`, every SuperNode gets its own EC key pair (write_node_keys), the public keys of
    the `num_supernodes` federation members are registered with `flwr supernode register`, and each SuperNode
    signs its requests with `--auth-supernode-private-key`. `unregistered` more SuperNodes start with keys
    that were never registered: the SuperLink refuses them and the run goes on with the registered ones
    (their logs are in `home/logs/intruder-*.log`)."""
    if unregistered and not supernode_auth:
        raise ValueError("unregistered SuperNodes are only refused with supernode_auth=True")
    project = Path(project) if project is not None else project_root()
    home = Path(tempfile.mkdtemp(prefix="fedfrozen-deploy-")) if home is None else Path(home)
    certs = write_certificates(home / "certs")
    port = _free_port()
    env = _env(home)
    procs: list[subprocess.Popen] = []
    logs = home / "logs"
    logs.mkdir(exist_ok=True)

    def start(name, args):
        f = open(logs / f"{name}.log", "w")
        p = subprocess.Popen([_bin(args[0]), *args[1:]], env=env, stdout=f, stderr=subprocess.STDOUT,
                             start_new_session=True)
        f.close()
        procs.append(p)
        return p

    try:
        link = start("superlink", ["flower-superlink", "--ssl-ca-certfile", str(certs["ca"]), "--ssl-certfile",
                                   str(certs["cert"]), "--ssl-keyfile", str(certs["key"]), "--host", "127.0.0.1",
                                   "--port", str(port), "--database", str(home / "state.db"),
                                   "--disable-runtime-dependency-installation",
                                   *(["--enable-supernode-auth"] if supernode_auth else [])])
        _wait_port(port, link, logs / "superlink.log")
        ca = Path(root_certificates) if root_certificates is not None else certs["ca"]
        check_tls(port, ca)
        (home / "config.toml").write_text(f'[superlink]\ndefault = "deploy"\n\n[superlink.deploy]\n'
                                          f'address = "127.0.0.1:{port}"\nroot-certificates = "{ca}"\n')
        nodes = [(f"supernode-{i}", i) for i in range(num_supernodes)]
        nodes += [(f"intruder-{j}", j % num_supernodes) for j in range(unregistered)]
        keys = write_node_keys(home / "keys", [name for name, _ in nodes]) if supernode_auth else {}
        for name, _ in nodes[:num_supernodes] if supernode_auth else ():  # only the federation's members
            reg = subprocess.run([_flwr(), "supernode", "register", str(keys[name][1]), "deploy"], env=env,
                                 capture_output=True, text=True, timeout=120)
            if reg.returncode != 0:
                raise RuntimeError(f"flwr supernode register {name} failed (exit {reg.returncode}):\n"
                                   f"{(reg.stdout + reg.stderr)[-2000:]}")
        node_ports = _free_ports(len(nodes))
        args = {}
        for (name, part), node_port in zip(nodes, node_ports):
            auth = ["--auth-supernode-private-key", str(keys[name][0])] if supernode_auth else []
            args[name] = ["flower-supernode", "--superlink", f"127.0.0.1:{port}", "--root-certificates",
                          str(certs["ca"]), "--node-config", f"partition-id={part} num-partitions={num_supernodes}",
                          "--port", str(node_port), *auth]
        members = list(args)[:num_supernodes]
        for name in list(args)[num_supernodes:]:  # the unregistered: started, never awaited (they are refused)
            start(name, args[name])
        _await_joined({name: args[name] for name in members}, start, logs)
        out = home / "history.json"
        rc = {**run_config, "out": str(out), "num-clients": num_supernodes}
        return _flwr_run([str(project), "deploy", "--stream", "--run-config", run_config_arg(rc)], env, out, timeout)
    finally:
        stop(home, [p.pid for p in procs])
        for p in procs:
            p.poll()
