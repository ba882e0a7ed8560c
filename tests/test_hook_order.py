"""One hook order: every registered method's hooks, recorded under fedfrozen.run and under the Flower apps, are
called in the same order (issue: client and server speak in messages).

The Flower side runs the real ServerApp path (`fedfrozen.flower.server.run_server`: the strategy, its records) and
the real ClientApp function (`fedfrozen.flower.client.train`) on a Grid whose nodes are called in this process, so
every method takes a second here (tests/test_flower.py runs the same apps on a Flower simulation, and slower).

What only a federation does is left out of the comparison, by name: the split hooks that carry state across
(to_client, from_server, client_state, load_client_state, to_server, from_client), each client replica's own
start (setup, begin_round), and the server asking the mask a reply trained by (to count its bytes). The mask itself
is asked once per client before it trains on both: by the client's `client_mask`, or, where the server sends it, by
the server's inside `to_client`.
"""

import contextlib

import pytest
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen.methods.base import CLIENT_HOOKS

pytest.importorskip("flwr")
from flwr.app import Context, RecordDict  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedfrozen.flower import client as flower_client  # noqa: E402
from fedfrozen.flower import server as flower_server  # noqa: E402

ROUND_HOOKS = ("frozen_groups", "on_stage_switch", "value_penalty", "sample_clients", "begin_round", "anchor_coeff",
               "client_mask", "init_client", "client_forward", "correction", "upload", "after_client", "aggregate",
               "client_bytes", "server_update", "on_round_end")
SPLIT_HOOKS = ("to_client", "from_server", "client_state", "load_client_state", "to_server", "from_client")
CLIENT_SIDE = (*CLIENT_HOOKS, "correction")  # what runs where the client trains (fedfrozen.round.LocalTraining)
REPLICA_START = ("setup", "begin_round")     # a Flower client's replica of the method, built for its round
# where the (r, cid) of a hook call is among its arguments
WHERE = {"client_mask": (0, 1), "init_client": (0, 1), "client_forward": (0, 1), "upload": (0, 1),
         "after_client": (0, 1), "client_bytes": (0, 1), "to_client": (0, 1), "from_server": (0, 1),
         "to_server": (0, 1), "from_client": (0, 1), "correction": (None, 0), "aggregate": (None, 1),
         "client_state": (None, 0), "load_client_state": (None, 0)}
SETTINGS = {"fedsteer": {"core": 2}, "fedtlu": {"k": 2}, "fedfrozen_tlu": {"k": 2}, "fedslm": {"ranks": (4, 8)}}
EVERY = dict(n_clients=3, clients_per_round=2, rounds=3, warmup_rounds=1)


class Recorder:
    """Every call of the hooks above on the method's class: (side, round, hook, client, depth), depth 0 for an
    outermost call (a hook calling another, or super(), is deeper). Under the loop the side follows from the hook;
    under Flower (`flower=True`) a call is the client's while the Grid below runs a ClientApp call, else the
    server's."""

    def __init__(self, flower: bool = False):
        self.flower, self.calls = flower, []
        self.client = None  # (round, cid) while a ClientApp call runs
        self.round = -1

    def wrap(self, name, original):
        rec = self

        def hook(method, *args, **kw):
            depth = method.__dict__.get("_recorder_depth", 0)
            method.__dict__["_recorder_depth"] = depth + 1
            try:
                rec.note(name, args, depth)
                return original(method, *args, **kw)
            finally:
                method.__dict__["_recorder_depth"] = depth
        return hook

    def note(self, name, args, depth):
        at_r, at_cid = WHERE.get(name, (None, None))
        cid = int(args[at_cid]) if at_cid is not None else None
        if name == "begin_round" and self.client is None:
            self.round = int(args[0])
        if self.client is not None:
            side, r = "client", self.client[0]
        else:
            side = "server" if self.flower or name not in CLIENT_SIDE else "client"
            r = self.round
        self.calls.append((side, r, name, cid, depth))


@contextlib.contextmanager
def recording(monkeypatch, cfg, flower: bool = False):
    rec = Recorder(flower)
    mro = type(ff.methods.build(cfg)).__mro__
    for name in (*ROUND_HOOKS, *SPLIT_HOOKS, *REPLICA_START):
        # on the class that defines it: which hooks a method overrides (Method.cannot_run) stays as it was
        owner = next(c for c in mro if name in c.__dict__)
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


def client_side(calls, drop=()):
    """Per (round, client): the outermost hook calls on its side, in order."""
    out = {}
    for side, r, name, cid, depth in calls:
        if side == "client" and not depth and name not in drop:
            out.setdefault((r, cid), []).append(name)
    return out


def mask_asked(calls) -> dict:
    """(round, client) -> the sides that asked its mask before it trained: the client's client_mask before its
    init_client, the server's inside its to_client."""
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
        if name == "init_client" and depth == 0:
            out.setdefault((r, cid), set()).add("trained")
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

    # the server's side, whole: the same hooks on the same clients in the same order
    opening = ["setup", "frozen_groups", "value_penalty", "sample_clients", "begin_round", "anchor_coeff"]
    assert server_side(ours.calls, drop=("on_stage_switch",))[:7] == [
        *((h, None) for h in opening), ("aggregate", loop.rows[0]["clients"][0])]
    assert server_side(theirs.calls, drop=(*SPLIT_HOOKS, "client_mask")) == server_side(ours.calls)
    # each client's side, round by round: the same hooks in the same order
    mine = client_side(ours.calls, drop=("client_mask",))
    assert set(mine) == sampled
    assert all(seq == ["init_client", "client_forward", "correction", "upload", "after_client"]
               for seq in mine.values())
    assert client_side(theirs.calls, drop=(*SPLIT_HOOKS, *REPLICA_START, "client_mask")) == mine
    # the mask: in the loop the client asks it, once, before it trains; on Flower the client or, where the server
    # sends it, the server (in to_client) has asked it before the client trains
    assert mask_asked(ours.calls) == {k: {"client", "trained"} for k in sampled}
    assert all(client_side(ours.calls)[k][0] == "client_mask" for k in sampled)
    asked = mask_asked(theirs.calls)
    assert set(asked) == sampled and all(len(asked[k] - {"trained"}) >= 1 for k in sampled)
