"""One hook order: every registered method's hooks, recorded under fedfrozen.run and under the Flower apps, are
called in the same order, on the same half (issue: a method in two halves that talk in records).

The Flower side runs the real ServerApp path (`fedfrozen.flower.server.run_server`: fedfrozen.engine.round.play on the
Grid,
its records) and the real ClientApp function (`fedfrozen.flower.client.train`) on a Grid whose nodes are called in
this process, so every method takes a second here (tests/test_flower.py runs the same apps on a Flower simulation,
and slower).

In the loop the method's two halves are two instances (the server's, the clients'); on Flower the server holds one
and each node builds a clients' half for its round. The server's half is called identically in both, hook for hook;
each client's sequence is identical too, but for what only a Flower node does: its half's own start (setup) and the
state it keeps in its Context (load_client_state, client_state).
"""

import contextlib

import pytest
from conftest import tiny_config

import fedfrozen as ff

pytest.importorskip("flwr")
from flwr.app import Context, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedfrozen.flower import client as flower_client  # noqa: E402
from fedfrozen.flower import server as flower_server  # noqa: E402

ROUND_HOOKS = ("frozen_groups", "on_stage_switch", "value_penalty", "sample_clients", "begin_round", "anchor_coeff",
               "client_mask", "init_client", "client_forward", "correction", "upload", "after_client", "aggregate",
               "client_bytes", "server_update", "on_round_end")
RECORD_HOOKS = ("to_client", "from_server", "client_state", "load_client_state", "to_server", "from_client")
NODE_ONLY = ("setup", "on_stage_switch", "client_state", "load_client_state")  # a Flower node's half, or no client
# where the (r, cid) of a hook call is among its arguments
WHERE = {"client_mask": (0, 1), "init_client": (0, 1), "client_forward": (0, 1), "upload": (0, 1),
         "after_client": (0, 1), "client_bytes": (0, 1), "to_client": (0, 1), "from_server": (0, 1),
         "to_server": (0, 1), "from_client": (0, 1), "correction": (None, 0), "aggregate": (None, 1),
         "client_state": (None, 0), "load_client_state": (None, 0)}
SETTINGS = {"fedsteer": {"core": 2}, "fedtlu": {"k": 2}, "fedfrozen_tlu": {"k": 2}, "fedslm": {"ranks": (4, 8)}}
EVERY = dict(n_clients=3, clients_per_round=2, rounds=3, warmup_rounds=1)


class Recorder:
    """Every call of the hooks above on the method's class: (instance, side, round, hook, client, depth), depth 0 for
    an outermost call (a hook calling another, or super(), is deeper). Under Flower (`flower=True`) a call is the
    client's while the Grid below runs a ClientApp call, else the server's; in the loop the side is the instance's
    (`calls`: the clients' half is the instance that prepares clients)."""

    def __init__(self, flower: bool = False):
        self.flower, self.raw = flower, []
        self.client = None  # (round, cid) while a ClientApp call runs
        self.round = -1

    def wrap(self, name, original):
        rec = self

        def hook(method, *args, **kw):
            depth = method.__dict__.get("_recorder_depth", 0)
            method.__dict__["_recorder_depth"] = depth + 1
            try:
                rec.note(method, name, args, depth)
                return original(method, *args, **kw)
            finally:
                method.__dict__["_recorder_depth"] = depth
        return hook

    def note(self, method, name, args, depth):
        at_r, at_cid = WHERE.get(name, (None, None))
        cid = int(args[at_cid]) if at_cid is not None else None
        if self.client is not None:
            self.raw.append((id(method), "client", self.client[0], name, cid, depth))
            return
        if name == "begin_round":
            self.round = int(args[0])
        self.raw.append((id(method), "server" if self.flower else None, self.round, name, cid, depth))

    @property
    def calls(self):
        """(side, round, hook, client, depth) of every call; in the loop the clients' half is the instance whose
        init_client ran."""
        clients = {m for m, _, _, name, _, _ in self.raw if name == "init_client"}
        return [(side or ("client" if m in clients else "server"), r, name, cid, depth)
                for m, side, r, name, cid, depth in self.raw]


@contextlib.contextmanager
def recording(monkeypatch, cfg, flower: bool = False):
    rec = Recorder(flower)
    mro = type(ff.methods.build(cfg)).__mro__
    for name in (*ROUND_HOOKS, *RECORD_HOOKS, "setup"):
        owner = next(c for c in mro if name in c.__dict__)  # on the class that defines it
        monkeypatch.setattr(owner, name, rec.wrap(name, owner.__dict__[name]))
    yield rec
    monkeypatch.undo()


class InProcessGrid:
    """A Flower Grid whose nodes are the ClientApp's train function called here, one Context per node (node i+1
    holds partition i), in node order; it tells the recorder which client a call belongs to."""

    def __init__(self, n: int, rec: Recorder):
        self.rec = rec
        self.contexts = {i + 1: Context(run_id=1, node_id=i + 1, node_config={"partition-id": i, "num-partitions": n},
                                        state=RecordDict(), run_config={}) for i in range(n)}

    def get_node_ids(self):
        return list(self.contexts)

    def send_and_receive(self, messages, timeout=None):
        replies = []
        for msg in messages:
            context = self.contexts[msg.metadata.dst_node_id]
            self.rec.client = (int(msg.content["config"]["server-round"]) - 1, context.node_config["partition-id"])
            try:
                replies.append(flower_client.train(msg, context))
            finally:
                self.rec.client = None
        return replies


@contextlib.contextmanager
def task_identity():
    """What a ServerApp process has set before a strategy creates Messages (Flower's TaskIdentity), then as it was."""
    kept = TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 0
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = kept


def flower_in_process(cfg, rec: Recorder) -> ff.History:
    with task_identity():
        return flower_server.run_server(InProcessGrid(cfg.n_clients, rec), cfg)


def server_side(calls, drop=()):
    """The outermost hook calls on the server's side, in order."""
    return [(name, cid) for side, _, name, cid, depth in calls if side == "server" and not depth and name not in drop]


def client_side(calls, drop=NODE_ONLY):
    """Per (round, client): the outermost hook calls on its side, in order."""
    out = {}
    for side, r, name, cid, depth in calls:
        if side == "client" and not depth and name not in drop:
            out.setdefault((r, cid), []).append(name)
    return out


def mask_asked(calls) -> dict:
    """(round, client) -> who asked its mask before it trained: the client's half ("client") before its
    init_client, or the server's inside its to_client ("server", which sends it)."""
    out, inside = {}, None
    for side, r, name, cid, depth in calls:
        if name == "to_client":
            inside = (r, cid) if depth == 0 else inside
        elif depth == 0:
            inside = None
        if name == "client_mask" and side == "client" and depth == 0:
            out.setdefault((r, cid), set()).add("client")
        elif name == "client_mask" and side == "server" and inside == (r, cid):
            out.setdefault((r, cid), set()).add("server")
    return out


@pytest.mark.parametrize("name", ff.methods.names())
def test_every_method_calls_its_hooks_in_one_order_in_the_loop_and_on_flower(name, monkeypatch):
    cfg = tiny_config(method=name, method_args=SETTINGS.get(name, {}), **EVERY)
    if ff.methods.build(cfg).cannot_run("flower"):
        pytest.skip(f"{name} does not run on Flower (tests/test_flower.py checks that it says why)")
    with recording(monkeypatch, cfg) as ours:
        loop = ff.run(cfg, progress=False)
    with recording(monkeypatch, cfg, flower=True) as theirs:
        fl = flower_in_process(cfg, theirs)
    assert [r["clients"] for r in fl.rows] == [r["clients"] for r in loop.rows]
    assert [r["test_acc"] for r in fl.rows] == pytest.approx([r["test_acc"] for r in loop.rows], abs=1e-6)
    assert [(r["bytes_down"], r["bytes_up"]) for r in fl.rows] == [(r["bytes_down"], r["bytes_up"]) for r in loop.rows]
    sampled = {(r["round"], c) for r in loop.rows for c in r["clients"]}
    assert all(r["client_seconds"] > 0 for r in fl.rows)  # the ClientApps' own time, as their replies said

    # the server's half, whole: the same hooks on the same clients in the same order
    opening = ["setup", "frozen_groups", "value_penalty", "sample_clients", "begin_round", "anchor_coeff"]
    assert server_side(ours.calls, drop=("on_stage_switch",))[:7] == [
        *((h, None) for h in opening), ("to_client", loop.rows[0]["clients"][0])]
    assert server_side(theirs.calls) == server_side(ours.calls)
    first = loop.rows[0]["clients"][0]
    assert server_side(ours.calls).index(("from_client", first)) + 1 == server_side(ours.calls).index(
        ("aggregate", first))  # what the client sent is taken before its update is folded
    # each client's half, round by round: the same hooks in the same order (no server hook runs there)
    mine = client_side(ours.calls, drop=(*NODE_ONLY, "client_mask"))
    assert set(mine) == sampled
    assert all(seq == ["from_server", "init_client", "client_forward", "correction", "upload", "after_client",
                       "to_server"] for seq in mine.values())
    assert client_side(theirs.calls) == client_side(ours.calls)
    server_only = {"frozen_groups", "value_penalty", "sample_clients", "begin_round", "anchor_coeff", "to_client",
                   "from_client", "aggregate", "client_bytes", "server_update", "on_round_end"}
    assert not server_only & {name for side, _, name, _, _ in ours.calls + theirs.calls if side == "client"}
    # the mask: asked for every client before it trains, by the server's half (which sends it, when it has one)
    # and/or by the client's own
    asked = mask_asked(ours.calls)
    assert set(asked) == sampled and all(v <= {"server", "client"} and v for v in asked.values())
    assert mask_asked(theirs.calls) == asked
