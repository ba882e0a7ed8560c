"""The ServerApp: the method's server half and the loop's round (fedfrozen.engine.round.play) on Flower's Grid, writing
fedfrozen's History. The records are built and read here and in fedfrozen.flower.records (one declaration of the
round's and the reply's fields)."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict
from flwr.serverapp import Grid, ServerApp

from .. import methods
from ..base.history import History
from ..base.io import follow_threads
from ..engine import loop
from ..engine.config import Config
from ..engine.messages import Reply
from ..engine.round import play
from ..nets import qkv
from . import check_supported, config_from_run, records

__all__ = ["app", "make_server_app", "Federation", "run_server", "round_config", "wait_for_nodes",
           "train_messages", "parse_replies", "flat_update", "Returned"]

TIMEOUT = 3600.0  # seconds a round waits for its replies (Flower's own default)


class Federation:
    """The server's side of one run on a Flower Grid: the loop's start (Setup, the method's server half, Round,
    History; `first` > 0 when the run continues from its checkpoint) and the round's `exchange` for
    fedfrozen.engine.round.play: the instructions as one message per node (`train_messages`), the nodes' records back as
    Replies (`parse_replies`, `flat_update`).

    Every round goes to every node (the partition id of a node is known only to the node); the sampled
    partition ids travel in the ConfigRecord and the others reply at once without training. A client
    that fails is left out of the round (the others' weights are renormalised) and recorded in the
    row's `failures`.
    """

    def __init__(self, cfg: Config, grid: Grid, fail: str = "", checkpoint: str = "", client_state_dir: str = ""):
        check_supported(cfg)
        self.cfg, self.grid, self.fail, self.client_state_dir = cfg, grid, fail, client_state_dir
        self.method = methods.build(cfg)  # the server's half; each node builds its clients' half
        self.s, self.rnd, self.hist, self.first = loop.start_up(
            cfg, self.method, resume_from=checkpoint if checkpoint and os.path.exists(checkpoint) else None)
        self.delta = torch.empty_like(self.s.flat.data)  # a reply's update, as one flat vector
        self.hist.env["runtime"] = "flower"
        self.node_partition: dict[int, int] = {}  # learnt from the replies
        self.received_frozen: set[int] = set()    # nodes holding the current frozen block

    def exchange(self, plan, instructions):
        """Round `plan`'s instructions to the nodes and their replies back: (the Replies of the clients that
        trained, in the sampled order, each made as it is taken; the row's columns: what the records weighed, the
        failures)."""
        if plan.switched:
            self.received_frozen.clear()
        state = {k: v.detach().clone() for k, v in self.s.model.state_dict().items()}  # the global weights
        messages, down_wire = train_messages(
            wait_for_nodes(self.grid, self.cfg.n_clients), state,
            round_config(self.cfg, plan, self.fail, self.client_state_dir),
            qkv.param_names(self.s.model, plan.frozen), {ins.cid: ins.sent for ins in instructions},
            self.node_partition, self.received_frozen)
        results, failures = parse_replies(plan.r, self.grid.send_and_receive(messages=messages, timeout=TIMEOUT),
                                          self.node_partition)
        done = [cid for cid in plan.sampled if cid in results]
        total = sum(results[cid].examples for cid in done)
        replies = (Reply(cid=cid, weight=results[cid].examples / total,
                         update=flat_update(self.s.flat, results[cid].update, self.delta), loss=results[cid].loss,
                         steps=results[cid].steps, extras=results[cid].extras) for cid in done)
        return replies, dict(bytes_down_wire=down_wire, bytes_up_wire=sum(results[cid].wire_bytes for cid in done),
                             failures=failures, client_seconds=sum(results[cid].seconds for cid in done))


# --- the round's messages as Flower records ------------------------------------------------------------------------

def round_config(cfg: Config, plan, fail: str = "", client_state_dir: str = "") -> ConfigRecord:
    """What every node reads of round `plan.r`: the round's fields (fedfrozen.flower.records.ROUND; the client
    rebuilds its Instruction from them) and the run's (the Config as JSON, the failures asked for, the clients'
    state folder)."""
    return ConfigRecord({**records.write_round(plan), "fedfrozen": json.dumps(cfg.to_dict()), "fail": fail,
                         "client-state-dir": client_state_dir})


def wait_for_nodes(grid: Grid, n: int, timeout: float = 300.0) -> list[int]:
    """The federation's node ids, once `n` nodes (one per client) are connected; a clear error after `timeout` s."""
    deadline = time.time() + timeout
    while len(nodes := list(grid.get_node_ids())) < n:
        if time.time() > deadline:
            raise RuntimeError(f"{len(nodes)} nodes connected after {timeout:.0f} s; the config has n_clients={n} "
                               f"(one node per client: num-supernodes / --node-config)")
        time.sleep(0.5)
    return sorted(nodes)


def train_messages(nodes, state: dict, conf: ConfigRecord, frozen: set, to_client: dict, node_partition: dict,
                   received_frozen: set) -> tuple[list, int]:
    """One message per node, and the bytes their arrays weigh. What goes down, as the loop counts it: the trainable
    arrays of `state` to every sampled client, the frozen block once per node after a stage switch (the node keeps
    it in its Context.state; `received_frozen` is updated), nothing to a node whose partition is known and not
    sampled; `to_client` (partition id -> the method's tensors) to each sampled node, or every sampled client's
    ("<cid>/<name>") to a node whose partition is not known yet."""
    trainable = ArrayRecord(torch_state_dict={k: v for k, v in state.items() if k not in frozen})
    full = ArrayRecord(torch_state_dict=state)
    messages, wire = [], 0
    for node in nodes:
        part = node_partition.get(node)
        if part is not None and part not in to_client:
            messages.append(Message(content=RecordDict({"config": conf}), message_type=MessageType.TRAIN,
                                    dst_node_id=node))
            continue
        record = RecordDict({"arrays": trainable if frozen and node in received_frozen else full, "config": conf})
        if frozen:
            received_frozen.add(node)
        tensors = (to_client[part] if part is not None else
                   {f"{cid}/{k}": v for cid, t in to_client.items() for k, v in t.items()})
        if tensors:
            record["method"] = ArrayRecord(torch_state_dict={k: v.detach().clone() for k, v in tensors.items()})
        wire += sum(rec.count_bytes() for key, rec in record.items() if key != "config")
        messages.append(Message(content=record, message_type=MessageType.TRAIN, dst_node_id=node))
    return messages, wire


@dataclass(frozen=True)
class Returned:
    """A node's reply record: the client's update by parameter name, what it counted, what its method sent up."""

    update: dict
    examples: int
    loss: float
    steps: int
    extras: dict      # Method.to_server
    wire_bytes: int   # what the update and the extras weighed
    seconds: float = 0.0  # the ClientApp's own time for the round


def parse_replies(r: int, replies, node_partition: dict) -> tuple[dict, list]:
    """{partition id: Returned} of the replies that trained, and the failures (node, partition, the client's
    reason); learns each node's partition id into `node_partition`."""
    failures, results = [], {}
    for msg in replies:
        node = msg.metadata.src_node_id
        if msg.has_error():
            failures.append({"round": r, "node": int(node), "partition": node_partition.get(node),
                             "error": _reason(str(msg.error.reason))})
            continue
        m = records.read_reply(msg.content["metrics"])
        cid = m["cid"]
        node_partition[node] = cid
        if m["examples"] > 0:
            update = msg.content["update"]
            extras = msg.content["method"].to_torch_state_dict() if "method" in msg.content else {}
            results[cid] = Returned(update.to_torch_state_dict(), m["examples"], m["loss"], m["steps"], extras,
                                    update.count_bytes() + (msg_bytes(extras) if extras else 0),
                                    m.get("seconds", 0.0))
    return results, failures


def flat_update(flat, state: dict, out: torch.Tensor) -> torch.Tensor:
    """A client's update (as its Method.upload left it), by parameter name, as one flat vector in `out` (zero where
    it sent nothing)."""
    out.zero_()
    for name, t in state.items():
        a, b = flat.param_range[name]
        out[a:b] = t.reshape(-1)
    return out


def _reason(text: str) -> str:
    """The client's own message out of Flower's error reason (Ray wraps it in a traceback)."""
    lines = [ln for ln in text.splitlines() if "Message:" in ln]
    return (lines[-1].split("Message:", 1)[1].strip() if lines else text.strip().splitlines()[-1])[:300]


def msg_bytes(tensors: dict) -> int:
    """Bytes an ArrayRecord of `tensors` weighs on the wire."""
    return ArrayRecord(torch_state_dict={k: v.detach().clone() for k, v in tensors.items()}).count_bytes()


def run_server(grid: Grid, cfg: Config, out: str = "", fail: str = "", checkpoint: str = "",
               client_state_dir: str = "", stop_after: int | None = None) -> History:
    """Run `cfg` on the nodes of `grid`, round by round as the loop does (fedfrozen.engine.round.play, with the nodes as
    the exchange); write the History to `out` (atomically) when the run is complete.

    checkpoint: a file the server keeps its state in after every round, and continues from when it exists (a
    resumed run's History equals the uninterrupted one's). client_state_dir: a folder on each node's machine where
    the client also keeps its Method.client_state (a new run's Context.state starts empty: this is what a resumed
    run's clients read). stop_after: stop after this many rounds in all (to interrupt a run on purpose)."""
    follow_threads()  # the thread count of the process that started the federation (its sums are the loop's)
    fed = Federation(cfg, grid, fail=fail, checkpoint=checkpoint, client_state_dir=client_state_dir)
    last = cfg.rounds if stop_after is None else min(stop_after, cfg.rounds)
    for r in range(fed.first, last):
        stop = play(fed.rnd, r, fed.hist, fed.exchange)
        if fed.hist.diverged:
            break
        if checkpoint and r + 1 < cfg.rounds:  # the server's side; each client keeps its own state
            loop.save_checkpoint(checkpoint, cfg, r + 1, fed.rnd.x, fed.method, fed.hist, fed.rnd.received_frozen)
        if stop:
            break
    if out and len(fed.hist.rows) == cfg.rounds:
        fed.hist.save(out)
    return fed.hist


def make_server_app(cfg: Config, out: str = "", fail: str = "", more=(), **resume) -> ServerApp:
    """A ServerApp that runs `cfg` (run_server's checkpoint, client_state_dir, stop_after in `resume`), then each
    (Config, out) of `more` on the same nodes, one after the other (fedfrozen.flower.simulate, simulate_many)."""
    server = ServerApp()

    @server.main()
    def main(grid: Grid, context: Context) -> None:
        run_server(grid, cfg, out, fail, **resume)
        for other, other_out in more:
            run_server(grid, other, str(other_out))

    return server


app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """`flwr run`: the Config from the run config (pyproject [tool.flwr.app.config], --run-config)."""
    rc = dict(context.run_config)
    run_server(grid, config_from_run(rc), str(rc.get("out", "")), str(rc.get("fail", "")),
               checkpoint=str(rc.get("checkpoint", "")), client_state_dir=str(rc.get("client-state-dir", "")))
