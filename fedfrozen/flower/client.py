"""The ClientApp: one client's local training, as fedfrozen.loop trains it."""

from __future__ import annotations

import json

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from .. import local, loop, qkv
from ..config import Config
from ..rng import seed_for

__all__ = ["app", "train_client", "failing"]

app = ClientApp()
FROZEN_KEY = "fedfrozen-frozen-block"  # Context.state: the frozen arrays of the current stage
_SETUP: dict = {}  # the Setup (data, partitions, resident model) of the last config, built once per process


def _setup(cfg: Config):
    key = json.dumps(cfg.to_dict(), sort_keys=True)
    if key not in _SETUP:
        _SETUP.clear()
        _SETUP[key] = loop.prepare(cfg)
    return _SETUP[key]


def failing(spec: str, r: int, cid: int) -> bool:
    """Whether `spec` ("round:partition,...", rounds from 0) asks client `cid` to fail in round r."""
    pairs = {tuple(int(v) for v in item.split(":")) for item in spec.split(",") if item.strip()}
    return (r, cid) in pairs


def train_client(cfg: Config, cid: int, r: int, state: dict, conf) -> tuple[dict, dict]:
    """Client `cid`'s round r from the global `state` (parameter name -> tensor): (trainable arrays, metrics)."""
    s = _setup(cfg)
    flat = s.flat
    for name, (a, b) in flat.param_range.items():
        flat.data[a:b].copy_(state[name].reshape(-1))
    x_global = flat.data.clone()
    frozen = tuple(g for g in str(conf["frozen"]).split(",") if g)
    qkv.unfreeze(s.model, *qkv.GROUPS)
    if frozen:
        qkv.freeze(s.model, *frozen)
    trainable = [g for g in qkv.GROUPS if g not in frozen]
    opt = local.make_optimizer(cfg, flat, trainable)
    opt.lr = float(conf["lr"])
    seed = seed_for("local_batches", cfg.seed, r, cid)
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    loss_sum, steps = local.train(s, opt, s.client_train[cid], gen, epochs=cfg.local_epochs, steps=cfg.local_steps,
                                  anchor=x_global, anchor_coeff=float(conf["proximal-mu"]),
                                  value_l2=float(conf["value-l2"]), value_mode=cfg.value_l2_mode)
    keep = {name for g in trainable for name in qkv.param_groups(s.model)[g]}
    arrays = {name: p.detach().clone() for name, p in s.model.named_parameters() if name in keep}
    metrics = {"num-examples": len(s.client_train[cid]), "train-loss": (loss_sum / steps).item(), "steps": steps,
               "partition-id": cid}
    return arrays, metrics


@app.train()
def train(msg: Message, context: Context) -> Message:
    conf = msg.content["config"]
    cfg = Config.from_dict(json.loads(conf["fedfrozen"]))
    cid = int(context.node_config["partition-id"])
    n = int(context.node_config["num-partitions"])
    if n != cfg.n_clients:
        raise ValueError(f"the federation has {n} partitions but the config has n_clients={cfg.n_clients}")
    r = int(conf["server-round"]) - 1
    if failing(str(conf.get("fail", "")), r, cid):
        raise RuntimeError(f"client {cid} failed in round {r} (asked to by the run config's `fail`)")
    if cid not in [int(i) for i in conf["sampled"]]:
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 0, "partition-id": cid})}), reply_to=msg)
    state = msg.content["arrays"].to_torch_state_dict()
    frozen = [g for g in str(conf["frozen"]).split(",") if g]
    if frozen:  # the frozen block comes once per stage: keep it in the node's state, take it from there after
        names = {n for g in frozen for n in qkv.param_groups(_setup(cfg).model)[g]}
        if names <= set(state):
            context.state[FROZEN_KEY] = ArrayRecord(torch_state_dict={n: state[n] for n in names})
        elif FROZEN_KEY in context.state:
            state.update(context.state[FROZEN_KEY].to_torch_state_dict())
        else:
            raise RuntimeError(f"client {cid}: round {r} has frozen groups {frozen} but the node never received them")
    arrays, metrics = train_client(cfg, cid, r, state, conf)
    return Message(RecordDict({"arrays": ArrayRecord(torch_state_dict=arrays), "metrics": MetricRecord(metrics)}),
                   reply_to=msg)
