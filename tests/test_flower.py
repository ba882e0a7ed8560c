"""The Flower apps (fedfrozen.flower) run the same federation as fedfrozen.run."""

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from conftest import tiny_config

import fedfrozen as ff

pytest.importorskip("flwr")
pytest.importorskip("ray")
fl = pytest.importorskip("fedfrozen.flower")
from fedfrozen.flower.client import failing  # noqa: E402


def flower_history(cfg, tmp_path, **kw) -> ff.History:
    out = tmp_path / "history.json"
    fl.simulate(cfg, out, **kw)
    return ff.History.load(out)


_NAMES = ("raylet", "ray::", "gcs_server", "flower-superlink", "flower-superexec", "flower-supernode",
          "flwr-serverapp", "flwr-clientapp", "flwr-simulation")
_BEFORE: set[int] = set()
_TMP: list[str] = []


def _flower_processes(table=None) -> list[tuple[int, int, str]]:
    from fedfrozen.flower.launch import process_table

    return [(pid, ppid, args) for pid, ppid, state, args in (table or process_table())
            if state != "Z" and any(k in args for k in _NAMES)]


@pytest.fixture(autouse=True)
def _own_processes_only(tmp_path, monkeypatch):
    """What a test answers for: the Ray/Flower processes it started. The launcher's homes go under the test's
    tmp_path (tempfile's folder), so its processes carry that path; the in-process simulation's Ray runtime are
    this process's descendants. Processes running before the test (another job's, a CI run beside this one) and
    unrelated ones started meanwhile (another user's Flower run) are not counted."""
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _BEFORE.clear()
    _BEFORE.update(pid for pid, _, _ in _flower_processes())
    _TMP[:] = [str(tmp_path)]


def _descendants(table, root: int) -> set[int]:
    """Pids in the process `table` whose chain of parents reaches `root`."""
    parent = {pid: ppid for pid, ppid, _, _ in table}
    out = set()
    for pid in parent:
        p, seen = pid, set()
        while p in parent and p not in seen and p > 1:
            seen.add(p)
            if parent[p] == root:
                out.add(pid)
                break
            p = parent[p]
    return out


def leftover_processes(wait: float = 20.0) -> list[str]:
    """Ray or Flower processes this test started that still run `wait` seconds after the run (they take a
    moment to exit); exited ones waiting to be reaped by their parent (state Z) do not count."""
    deadline = time.time() + wait
    while True:
        from fedfrozen.flower.launch import process_table

        table = process_table()  # one read of /proc per look
        rows = [r for r in _flower_processes(table) if r[0] not in _BEFORE]
        mine = _descendants(table, os.getpid())
        left = [f"{pid} {args}" for pid, _, args in rows if pid in mine or any(t in args for t in _TMP)]
        if not left or time.time() > deadline:
            return left
        time.sleep(0.5)


def test_only_the_launchs_own_processes_are_found_and_stopped(tmp_path):
    """An unrelated Flower process on the same machine (another user's SuperLink) is neither found nor stopped;
    the launch's own (its home in the command line) and their children are, and the check after is empty."""
    import subprocess
    import sys

    from fedfrozen.flower import launch

    home = tmp_path / "home"
    home.mkdir()
    sleeper = ("import subprocess, sys, time; "
               "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); time.sleep(300)")
    # the unrelated one is not this test's child: started through a process that exits at once (as another
    # user's run would be, it has a parent of its own)
    spawn = ("import subprocess, sys; print(subprocess.Popen([sys.executable, '-c', sys.argv[1], 'flower-superlink', "
             "'--insecure', '--simulation'], start_new_session=True, stdout=subprocess.DEVNULL, "
             "stderr=subprocess.DEVNULL).pid)")
    other = int(subprocess.run([sys.executable, "-c", spawn, sleeper], capture_output=True, text=True,
                               check=True).stdout)
    own = subprocess.Popen([sys.executable, "-c", sleeper, "flower-superlink", "--database", str(home / "state.db")],
                           start_new_session=True)
    try:
        deadline = time.time() + 60
        while len(launch.processes_of(home)) < 2 and time.time() < deadline:  # the parent and its child
            time.sleep(0.1)
        found = launch.processes_of(home)
        assert own.pid in found and len(found) == 2 and other not in found
        assert set(launch.stop(home)) == set(found)
        assert own.wait(timeout=60) is not None and launch.processes_of(home) == []
        assert launch._alive(other)  # the unrelated one still runs, and is not this test's leftover
        assert leftover_processes(wait=0) == []
    finally:
        for pid in (own.pid, other):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
        own.wait()


def test_partial_participation_by_partition_id(tmp_path):
    """2 of 4 clients per round, sampled by the method from the seed: the loop's clients, accuracy and bytes (the
    method's count); on the wire, round 0 sends the model to every node (which node holds which partition is
    known only from the replies), later rounds only to the sampled ones."""
    cfg = tiny_config(method="fedfrozen", n_clients=4, clients_per_round=2, rounds=3, warmup_rounds=1)
    hf, hl = flower_history(cfg, tmp_path), ff.run(cfg, progress=False)
    assert [r["test_acc"] for r in hf.rows] == pytest.approx([r["test_acc"] for r in hl.rows], abs=1e-6)
    assert [(r["bytes_up"], r["bytes_down"]) for r in hf.rows] == [(r["bytes_up"], r["bytes_down"]) for r in hl.rows]
    wire = [r["bytes_down_wire"] for r in hf.rows]
    assert wire[0] > 2 * hl.rows[0]["bytes_down"] and wire[0] > wire[2] > 0


def test_stale_update_methods_run_on_flower(tmp_path):
    """FedSteer keeps its caches on the server only: under partial participation Flower equals the loop."""
    cfg = tiny_config(method="fedsteer", n_clients=4, clients_per_round=2, rounds=4, method_args={"core": 2})
    hf, hl = flower_history(cfg, tmp_path), ff.run(cfg, progress=False)
    assert [r["test_acc"] for r in hf.rows] == pytest.approx([r["test_acc"] for r in hl.rows], abs=1e-6)
    assert [r["server_cache_bytes"] for r in hf.rows] == [r["server_cache_bytes"] for r in hl.rows]
    assert [r["core_set"] for r in hf.rows] == [r["core_set"] for r in hl.rows]


def test_a_failing_client_does_not_stop_the_run(tmp_path):
    cfg = tiny_config(method="fedavg", n_clients=3, rounds=2)
    hist = flower_history(cfg, tmp_path, fail="1:2")  # client 2 raises in round 1
    assert hist.rows[0]["failures"] == []
    (failure,) = hist.rows[1]["failures"]
    assert failure["round"] == 1 and failure["partition"] == 2 and "failed in round 1" in failure["error"]
    assert hist.rows[1]["bytes_up"] == 2 * hist.rows[0]["bytes_up"] // 3   # the other two were aggregated
    assert hist.rows[1]["test_acc"] is not None


class _NotOnFlower(ff.methods.Method):
    """A plugin that says it cannot run on a federation."""

    not_on = {"flower": "it reads every client's data on the server"}


def test_a_method_that_cannot_run_on_flower_is_named_before_any_node_starts(tmp_path):
    ff.methods.register("not_on_flower", _NotOnFlower, summary="a plugin that cannot run on Flower")
    try:
        with pytest.raises(ValueError, match="not_on_flower.*not supported on Flower.*reads every client's data"):
            fl.simulate(tiny_config(method="not_on_flower"), tmp_path / "h.json")
    finally:
        ff.methods.unregister("not_on_flower")
    assert not (tmp_path / "h.json").exists()
    fl.check_supported(tiny_config(method="fedfrozen_plateau", freeze_schedule="progressive"))


# every registered method, 3 rounds, 2 of 3 clients a round, a stage switch after round 0: on one Flower simulation
# (one runtime start for all) and through fedfrozen.run
EVERY = dict(n_clients=3, clients_per_round=2, rounds=3, warmup_rounds=1)
SETTINGS = {"fedsteer": {"core": 2}, "fedtlu": {"k": 2}, "fedfrozen_tlu": {"k": 2}, "fedslm": {"ranks": (4, 8)}}


def test_every_method_on_flower_equals_the_loop_or_says_why_not(tmp_path):
    runs, refused = [], {}
    for name in ff.methods.names():
        cfg = tiny_config(method=name, method_args=SETTINGS.get(name, {}), **EVERY)
        reason = ff.methods.build(cfg).cannot_run("flower")
        if reason:
            with pytest.raises(ValueError, match="not supported on Flower: " + re.escape(reason)):
                fl.check_supported(cfg)
            refused[name] = reason
        else:
            runs.append((cfg, tmp_path / f"{name}.json"))
    assert refused == {}  # every registered method runs on Flower (a plugin that cannot is named: the test above)
    # full participation too, on the same runtime (one start): fedfrozen's stage 1 is FedAvg
    full = [(tiny_config(method=m, n_clients=3, rounds=3, warmup_rounds=1), tmp_path / f"full-{m}.json")
            for m in ("fedfrozen", "fedprox", "fedadam")]
    fl.simulate_many(runs + full)
    for cfg, out in runs:
        hf, hl = ff.History.load(out), ff.run(cfg, progress=False)
        assert [r["stage"] for r in hf.rows] == [r["stage"] for r in hl.rows], cfg.method
        assert [r["test_acc"] for r in hf.rows] == pytest.approx([r["test_acc"] for r in hl.rows], abs=1e-6), cfg.method
        assert [r["clients"] for r in hf.rows] == [r["clients"] for r in hl.rows], cfg.method
        assert [(r["bytes_down"], r["bytes_up"]) for r in hf.rows] == [(r["bytes_down"], r["bytes_up"])
                                                                      for r in hl.rows], cfg.method
    for cfg, out in full:  # the same accuracy every round (1e-6), losses (1e-5), upload bytes per stage
        hf, hl = ff.History.load(out), ff.run(cfg, progress=False)
        assert len(hf.rows) == len(hl.rows) == 3 and hf.env["runtime"] == "flower"
        for a, b in zip(hf.rows, hl.rows):
            assert a["stage"] == b["stage"] and a["failures"] == [], cfg.method
            assert abs(a["test_acc"] - b["test_acc"]) <= 1e-6, cfg.method
            assert abs(a["test_loss"] - b["test_loss"]) <= 1e-5, cfg.method
            assert abs(a["train_loss"] - b["train_loss"]) <= 1e-5, cfg.method
            assert (a["bytes_up"], a["bytes_down"]) == (b["bytes_up"], b["bytes_down"]), cfg.method  # frozen: once
        if cfg.method == "fedfrozen":
            assert hf.rows[1]["bytes_up"] < hf.rows[0]["bytes_up"]  # from T0 only the trainable arrays travel up
    assert leftover_processes() == []


def test_client_state_lives_in_the_nodes_context_and_a_stage_switch_drops_it():
    """SCAFFOLD's c_i: the ClientApp keeps what Method.client_state returns in the node's Context.state, tagged with
    the run's config and stage; the next round of the same stage starts from it, another stage or run from zero."""
    import torch
    from flwr.app import Context, RecordDict

    from fedfrozen.flower import client, records

    cfg = tiny_config(method="scaffold", n_clients=3, rounds=3)
    s = client._setup(cfg)
    state = {k: v.detach().clone() for k, v in s.model.state_dict().items()}
    context = Context(run_id=1, node_id=1, node_config={"partition-id": 1, "num-partitions": 3}, state=RecordDict(),
                      run_config={})
    sent = {"c": torch.zeros(s.flat.numel)}

    def one_round(r, frozen=()):
        plan = SimpleNamespace(r=r, frozen=frozen, lr=cfg.lr, value_l2=0.0, anchor_coeff=0.0, sampled=[0, 1, 2])
        conf = records.write_round(plan)  # the round's ConfigRecord, as the server writes it
        _, _, up, keep = client.train_client(cfg, 1, r, state, conf, sent, client.kept_state(context, cfg, frozen))
        client.keep_state(context, cfg, frozen, keep)
        return up["dc"], keep["c_i"]

    dc, c_i = one_round(0)
    assert c_i.abs().sum() > 0 and torch.equal(dc, c_i)  # from zero: c_i+ - c_i = c_i+
    dc, c_i = one_round(1)
    assert not torch.equal(dc, c_i)  # the same stage: it started from its kept c_i
    assert client.kept_state(context, cfg, ("qk",)) == {}  # a stage switch drops it
    assert client.kept_state(context, cfg.replace(seed=1), ()) == {}  # so does another run
    dc, c_i = one_round(2, frozen=("qk",))
    assert torch.equal(dc, c_i)


def test_run_config_keys_map_to_config_fields():
    cfg = fl.config_from_run({"method": "fedfrozen", "warmup-rounds": 10, "value-l2": 0.05, "num-clients": 4,
                              "local-steps": 3, "clients-per-round": 0, "fedfrozen-config": ""})
    assert (cfg.method, cfg.warmup_rounds, cfg.value_l2, cfg.n_clients) == ("fedfrozen", 10, 0.05, 4)
    assert cfg.local_steps == 3 and cfg.local_epochs is None and cfg.clients_per_round is None
    whole = ff.Config(method="fedprox", rounds=7, model_kwargs={"depth": 1})
    got = fl.config_from_run({"method": "fedfrozen", "rounds": 3, "fedfrozen-config": json.dumps(whole.to_dict())})
    assert got == whole  # a whole Config wins over the named keys (which Flower fills from the defaults)
    with pytest.raises(ValueError, match="method must be one of"):
        fl.config_from_run({"method": "fedsomething"})
    # the keys are generated from Config's fields and the components' settings: every scalar one has one, by its
    # dashed name
    later = fl.config_from_run({"lr-schedule": "cosine", "eval-window": 5, "train-subset": 0, "amp": False})
    assert (later.lr_schedule, later.eval_window, later.train_subset) == ("cosine", 5, None)  # 0: an unset count
    scalar = {name for name, _, _ in ff.config.settings() if ff.config.field_type(name)[0] in (bool, int, float, str)}
    assert set(fl.RUN_CONFIG_FIELDS.values()) == scalar and fl.RUN_CONFIG_FIELDS["num-clients"] == "n_clients"


def test_failure_spec():
    assert failing("1:2, 3:0", 1, 2) and failing("1:2, 3:0", 3, 0)
    assert not failing("1:2", 2, 1) and not failing("", 0, 0)


LAUNCH = {"method": "fedfrozen", "rounds": 2, "warmup-rounds": 1, "num-clients": 3, "local-steps": 2}


def loop_history(run_config):
    return ff.run(fl.config_from_run(run_config), progress=False)


# `flwr run . --stream` on a local simulation federation (launch.flwr_run) == fedfrozen.run, with its managed SuperLink
# stopped: notebook 08 checks exactly this at the smoke profile (nbval, in the same test command), so it is not run
# twice.


def test_tls_deployment_with_supernode_auth_refuses_an_unregistered_node(tmp_path):
    """SuperLink + 3 registered SuperNodes as processes with TLS and Flower's CLI-managed SuperNode authentication,
    and one more SuperNode whose key was never registered: the SuperLink refuses it, the run goes on with the
    registered ones and its 2 rounds == fedfrozen.run; nothing left running."""
    from fedfrozen.flower import launch

    home = tmp_path / "deploy"
    hist, _ = launch.deploy(LAUNCH, num_supernodes=3, home=home, supernode_auth=True, unregistered=1)
    ref = loop_history(LAUNCH)
    assert [r["test_acc"] for r in hist.rows] == pytest.approx([r["test_acc"] for r in ref.rows], abs=1e-6)
    assert hist.rows[1]["bytes_up"] == ref.rows[1]["bytes_up"] < hist.rows[0]["bytes_up"]
    logs = {f.stem: f.read_text() for f in (home / "logs").glob("*.log")}
    assert all("SuperNode ID" in logs[f"supernode-{i}"] for i in range(3))  # the registered ones joined
    assert "SuperNode ID" not in logs["intruder-0"] and "Failed to activate SuperNode" in logs["intruder-0"]
    assert launch.processes_of(home) == [] and leftover_processes() == []
    with pytest.raises(ValueError, match="only refused with supernode_auth=True"):
        launch.deploy(LAUNCH, unregistered=1)


def test_a_wrong_certificate_is_refused(tmp_path):
    from fedfrozen.flower import launch

    other = launch.write_certificates(tmp_path / "other")["ca"]
    with pytest.raises(RuntimeError, match="TLS refused.*not trusted by the root certificates"):
        launch.deploy(LAUNCH, num_supernodes=1, root_certificates=other, timeout=120)
    assert leftover_processes() == []


def test_run_config_text_quotes_json():
    from fedfrozen.flower.launch import run_config_arg

    cfg = tiny_config(method="fedprox")
    text = run_config_arg({"rounds": 3, "method": "fedavg", "fedfrozen-config": json.dumps(cfg.to_dict())})
    assert text.startswith('rounds=3 method="fedavg" fedfrozen-config=\'{')
    with pytest.raises(ValueError, match="both quote kinds"):
        run_config_arg({"x": "it's \"odd\""})


def test_free_ports_are_distinct():
    from fedfrozen.flower.launch import _free_ports

    ports = _free_ports(8)
    assert len(set(ports)) == 8


def _fake_node(log, script):
    """A stand-in SuperNode: a Python process writing `script`'s lines to its log."""
    f = open(log, "w")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=f, stderr=subprocess.STDOUT)
    f.close()
    return p


def test_a_supernode_that_exits_before_joining_is_started_once_more(tmp_path):
    """_await_joined: a node whose first start exits (a transient refusal) is restarted on a fresh port and
    joins; one that exits twice is a clear error naming it, with its log; the wait ends on the log line."""
    from fedfrozen.flower import launch

    marker, starts, procs = tmp_path / "first-start-done", [], []

    def start(name, args):
        starts.append((name, list(args)))
        if name == "flaky" and not marker.exists():
            marker.touch()
            p = _fake_node(tmp_path / f"{name}.log", "print('Failed to activate SuperNode'); raise SystemExit(3)")
        elif name == "broken":
            p = _fake_node(tmp_path / f"{name}.log", "print('Failed to activate SuperNode'); raise SystemExit(3)")
        else:
            p = _fake_node(tmp_path / f"{name}.log", f"print('{launch.JOINED}: 1', flush=True)")
        procs.append(p)
        return p

    args = ["flower-supernode", "--port", "1"]
    launch._await_joined({"steady": args, "flaky": args}, start, tmp_path, timeout=60)
    assert [n for n, _ in starts].count("flaky") == 2 and [n for n, _ in starts].count("steady") == 1
    second = [a for n, a in starts if n == "flaky"][1]
    assert second[second.index("--port") + 1] != "1"  # a fresh port
    assert "Failed to activate" in (tmp_path / "flaky.first.log").read_text()
    with pytest.raises(RuntimeError, match=r"(?s)SuperNode broken exited twice .*Failed to activate"):
        launch._await_joined({"broken": args}, start, tmp_path, timeout=60)
    for p in procs:
        p.wait(timeout=30)


def test_a_resumed_flower_run_equals_an_uninterrupted_one(tmp_path):
    """SCAFFOLD on Flower, stopped after 2 of 4 rounds and run again: the server continues from its checkpoint,
    each client from the c_i it kept in its folder (the new run's Context.state starts empty); every round equals
    the uninterrupted run's and the loop's, across the stage switch."""
    cfg = tiny_config(method="fedfrozen_scaffold", n_clients=3, clients_per_round=2, rounds=4, warmup_rounds=3)
    keep = dict(checkpoint=tmp_path / "server.pt", client_state_dir=tmp_path / "clients")
    fl.simulate(cfg, tmp_path / "cut.json", stop_after=2, **keep)
    assert (tmp_path / "server.pt").exists() and not (tmp_path / "cut.json").exists()  # no History until it is done
    kept = sorted(p.name.split("-")[1] for p in (tmp_path / "clients").iterdir())
    assert kept and set(kept) <= {"client0.pt", "client1.pt", "client2.pt"}  # the clients that trained so far
    shutil.copy(tmp_path / "server.pt", tmp_path / "server_only.pt")
    fl.simulate(cfg, tmp_path / "resumed.json", **keep)
    fl.simulate(cfg, tmp_path / "forgot.json", checkpoint=tmp_path / "server_only.pt")  # the clients' c_i lost
    (tmp_path / "whole").mkdir()
    resumed, whole = ff.History.load(tmp_path / "resumed.json"), flower_history(cfg, tmp_path / "whole")
    loop = ff.run(cfg, progress=False)
    assert [r["round"] for r in resumed.rows] == [0, 1, 2, 3]
    def evaluations(hist):
        return [(r["test_acc"], r["test_loss"]) for r in hist.rows]

    assert evaluations(resumed) == evaluations(whole)
    forgot = ff.History.load(tmp_path / "forgot.json")  # a control: without the clients' state the run differs
    assert forgot.rows[:2] == resumed.rows[:2] and forgot.rows[2]["test_loss"] != whole.rows[2]["test_loss"]
    assert [r["test_acc"] for r in resumed.rows] == pytest.approx([r["test_acc"] for r in loop.rows], abs=1e-6)
    assert [r["stage"] for r in resumed.rows] == [1, 1, 1, 2]


def test_each_flower_home_gets_local_superlink_ports_of_its_own(tmp_path):
    """Flower's managed local SuperLink listens on fixed ports (39091, 39093) whatever the home, so two local runs
    on one machine would meet on one SuperLink; flwr_run gives each home free ports of its own, kept in the home
    so that a run with keep=True is found again by the next one."""
    from fedfrozen.flower import launch

    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    pa, pb = launch._local_ports(a), launch._local_ports(b)
    assert set(pa) == set(pb) == set(launch.LOCAL_PORTS_ENV)
    assert len({*pa.values(), *pb.values()}) == 4 and all(1024 < int(p) < 65536 for p in pa.values())
    assert launch._local_ports(a) == pa  # the same home: the same ports


def test_the_round_and_reply_records_read_back_what_was_written_from_one_declaration():
    """fedfrozen.flower.records: each message's fields declared once; what the server writes the client reads back
    (Flower's round counted from 1, the frozen groups as text), and a reply names only its declared fields."""
    from fedfrozen.flower import records

    plan = SimpleNamespace(r=4, frozen=("qk",), lr=0.003, value_l2=0.05, anchor_coeff=0.01, sampled=[2, 7])
    conf = records.write_round(plan)
    assert conf["server-round"] == 5 and conf["proximal-mu"] == 0.01 and conf["frozen"] == "qk"
    assert records.read_round(conf) == {k: getattr(plan, k) for k in ("r", "frozen", "lr", "value_l2", "anchor_coeff",
                                                                      "sampled")}
    assert records.read_round(records.write_round(SimpleNamespace(**{**vars(plan), "frozen": ()})))["frozen"] == ()
    sent = records.write_reply(cid=3, examples=40, loss=0.5, steps=6)
    assert records.read_reply(sent) == {"cid": 3, "examples": 40, "loss": 0.5, "steps": 6}
    assert records.read_reply(records.write_reply(cid=3, examples=0)) == {"cid": 3, "examples": 0}
    assert records.read_reply(records.write_reply(seconds=0.25)) == {"seconds": 0.25}  # the ClientApp's own time
    with pytest.raises(ValueError, match="no field.*'weight'"):
        records.write_reply(cid=3, examples=1, weight=0.5)
