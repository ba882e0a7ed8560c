"""The ServerApp: fedfrozen's method object inside a Flower strategy, writing fedfrozen's History."""

from __future__ import annotations

import json
import os
import time

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from .. import loop, methods, qkv
from ..config import Config
from ..history import History
from ..io import follow_threads
from ..round import Reply
from . import check_supported, config_from_run

__all__ = ["app", "make_server_app", "FedFrozenStrategy", "run_server"]



class FedFrozenStrategy(FedAvg):
    """Flower's FedAvg with fedfrozen's server-side hooks: participation by partition id, the stage switch,
    the method's aggregation and server step on flat vectors (as in fedfrozen.loop), History rows.

    Every round goes to every node (the partition id of a node is known only to the node); the sampled
    partition ids travel in the ConfigRecord and the others reply at once without training. A client
    that fails is left out of the round (the others' weights are renormalised) and recorded in the
    row's `failures`.
    """

    def __init__(self, cfg: Config, fail: str = "", checkpoint: str = "", client_state_dir: str = ""):
        super().__init__(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=cfg.n_clients,
                         min_available_nodes=cfg.n_clients)
        check_supported(cfg)
        self.cfg, self.fail, self.checkpoint, self.client_state_dir = cfg, fail, checkpoint, client_state_dir
        self.method = methods.build(cfg)
        # the loop's start: setup, method, the round's server side, History; self.first is the round Flower's
        # round 1 is (> 0 when this run continues from its checkpoint)
        self.s, self.rnd, self.hist, self.first = loop.start_up(
            cfg, self.method, resume_from=checkpoint if checkpoint and os.path.exists(checkpoint) else None)
        self.flat = self.s.flat
        self.delta = torch.empty_like(self.flat.data)  # a reply's update, as one flat vector
        self.hist.env["runtime"] = "flower"
        self.node_partition: dict[int, int] = {}
        self.received_frozen: set[int] = set()  # nodes holding the current frozen block
        self.sampled: list[int] = []

    def initial_arrays(self) -> ArrayRecord:
        return ArrayRecord(torch_state_dict={k: v.detach().clone() for k, v in self.s.model.state_dict().items()})

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid):
        """One message per node. What goes down, as the loop counts it: the trainable arrays to every
        sampled client, the frozen block once per node after a stage switch (the node keeps it in its
        Context.state), nothing to a node whose partition is known and not sampled this round."""
        r = self.first + server_round - 1
        self.t0 = time.perf_counter()
        self.plan = plan = self.rnd.open(r)  # stage switch, lr, value penalty, sampling: the loop's opening
        frozen, self.sampled = plan.frozen, plan.sampled
        if plan.switched:
            self.received_frozen.clear()
        conf = ConfigRecord({"server-round": r + 1, "fedfrozen": json.dumps(self.cfg.to_dict()),
                             "frozen": ",".join(frozen), "lr": plan.lr, "value-l2": float(plan.value_l2),
                             "proximal-mu": float(plan.anchor_coeff), "sampled": [int(i) for i in self.sampled],
                             "fail": self.fail, "client-state-dir": self.client_state_dir})
        state = arrays.to_torch_state_dict()
        frozen_names = {n for g in frozen for n in qkv.param_groups(self.s.model)[g]}
        trainable = ArrayRecord(torch_state_dict={k: v for k, v in state.items() if k not in frozen_names})
        full = ArrayRecord(torch_state_dict=state)
        messages, self.bytes_down_wire = [], 0
        sampled = set(self.sampled)
        # the method's server side: what each sampled client's hooks read (SCAFFOLD's c, a layer mask)
        to_client = {cid: self.method.to_client(r, cid) for cid in self.sampled}
        for node in self._nodes(grid):
            part = self.node_partition.get(node)
            if part is not None and part not in sampled:
                record = RecordDict({"config": conf})
            else:
                send = trainable if frozen_names and node in self.received_frozen else full
                if frozen_names:
                    self.received_frozen.add(node)
                record = RecordDict({"arrays": send, "config": conf})
                # a node whose partition is known gets its own; one not yet known, every sampled client's
                tensors = (to_client[part] if part is not None else
                           {f"{cid}/{k}": v for cid, t in to_client.items() for k, v in t.items()})
                if tensors:
                    record["method"] = ArrayRecord(torch_state_dict={k: v.detach().clone() for k, v in tensors.items()})
                self.bytes_down_wire += sum(rec.count_bytes() for key, rec in record.items() if key != "config")
            messages.append(Message(content=record, message_type=MessageType.TRAIN, dst_node_id=node))
        return messages

    def _nodes(self, grid: Grid, timeout: float = 300.0) -> list[int]:
        """The federation's node ids, once n_clients nodes are connected (a clear error after `timeout` s)."""
        deadline = time.time() + timeout
        while len(nodes := list(grid.get_node_ids())) < self.cfg.n_clients:
            if time.time() > deadline:
                raise RuntimeError(f"{len(nodes)} nodes connected after {timeout:.0f} s; the config has n_clients="
                                   f"{self.cfg.n_clients} (one node per client: num-supernodes / --node-config)")
            time.sleep(0.5)
        return sorted(nodes)

    def aggregate_train(self, server_round: int, replies):
        """Parse the replies; fold and take each sampled client's update in the sampled order, as the loop does;
        finish the round (the loop's server step and History row, with what the records weighed)."""
        r, rnd, plan, method = self.first + server_round - 1, self.rnd, self.plan, self.method
        results, failures = self._parse(r, replies)
        done = [cid for cid in self.sampled if cid in results]
        total = sum(results[c][1]["num-examples"] for c in done)
        bytes_up_wire = 0
        for cid in done:
            arrays, m, up = results[cid]
            p = float(m["num-examples"]) / total
            bytes_up_wire += arrays.count_bytes() + (msg_bytes(up) if up else 0)
            method.from_client(r, cid, up, p)  # the server's side of after_client, before the update is folded
            # the client's mask is asked after its reply (a client may choose its own: head pruning)
            rnd.receive(plan, Reply(cid=cid, weight=p, update=self._client_update(arrays.to_torch_state_dict()),
                                    loss=float(m["train-loss"]), steps=int(m["steps"]),
                                    mask=method.client_mask(r, cid)))
        rnd.finish(plan, self.hist, self.t0, joined=done, bytes_down_wire=self.bytes_down_wire,
                   bytes_up_wire=bytes_up_wire, failures=failures)
        if self.checkpoint and r + 1 < self.cfg.rounds:  # the server's side; each client keeps its own state
            loop.save_checkpoint(self.checkpoint, self.cfg, r + 1, rnd.x, method, self.hist, rnd.received_frozen)
        return self.initial_arrays(), MetricRecord({"train-loss": rnd.tally.train_loss if done else 0.0})

    def _parse(self, r: int, replies) -> tuple[dict, list]:
        """{partition id: (update ArrayRecord, metrics, what the method sent up)} of the replies that trained, and
        the failures (node, partition, the client's reason); learns each node's partition id."""
        failures, results = [], {}
        for msg in replies:
            node = msg.metadata.src_node_id
            if msg.has_error():
                failures.append({"round": r, "node": int(node), "partition": self.node_partition.get(node),
                                 "error": _reason(str(msg.error.reason))})
                continue
            m = msg.content["metrics"]
            cid = int(m["partition-id"])
            self.node_partition[node] = cid
            if int(m["num-examples"]) > 0:
                results[cid] = (msg.content["update"], m, msg.content["method"].to_torch_state_dict()
                                if "method" in msg.content else {})
        return results, failures

    def _client_update(self, state: dict) -> torch.Tensor:
        """A client's update (as its Method.upload left it), by parameter name, as one flat vector (the round's
        buffer)."""
        self.delta.zero_()
        for name, t in state.items():
            a, b = self.flat.param_range[name]
            self.delta[a:b] = t.reshape(-1)
        return self.delta


def _reason(text: str) -> str:
    """The client's own message out of Flower's error reason (Ray wraps it in a traceback)."""
    lines = [ln for ln in text.splitlines() if "Message:" in ln]
    return (lines[-1].split("Message:", 1)[1].strip() if lines else text.strip().splitlines()[-1])[:300]


def msg_bytes(tensors: dict) -> int:
    """Bytes an ArrayRecord of `tensors` weighs on the wire."""
    return ArrayRecord(torch_state_dict={k: v.detach().clone() for k, v in tensors.items()}).count_bytes()


def run_server(grid: Grid, cfg: Config, out: str = "", fail: str = "", checkpoint: str = "",
               client_state_dir: str = "", stop_after: int | None = None) -> History:
    """Run `cfg` on the nodes of `grid`; write the History to `out` (atomically) when the run is complete.

    checkpoint: a file the server keeps its state in after every round, and continues from when it exists (a
    resumed run's History equals the uninterrupted one's). client_state_dir: a folder on each node's machine where
    the client also keeps its Method.client_state (a new run's Context.state starts empty: this is what a resumed
    run's clients read). stop_after: stop after this many rounds in all (to interrupt a run on purpose)."""
    follow_threads()  # the thread count of the process that started the federation (its sums are the loop's)
    strategy = FedFrozenStrategy(cfg, fail=fail, checkpoint=checkpoint, client_state_dir=client_state_dir)
    last = cfg.rounds if stop_after is None else min(stop_after, cfg.rounds)
    if last > strategy.first:
        strategy.start(grid=grid, initial_arrays=strategy.initial_arrays(), num_rounds=last - strategy.first)
    if out and len(strategy.hist.rows) == cfg.rounds:
        strategy.hist.save(out)
    return strategy.hist


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
