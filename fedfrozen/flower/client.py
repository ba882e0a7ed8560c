"""The ClientApp: one client's local training, as fedfrozen.engine.loop trains it
(fedfrozen.engine.clients.LocalTraining), with
the clients' half of the method built for the round; what the client keeps across rounds lives in the node's
Context.state. The records are read and written by fedfrozen.flower.records, the one declaration of their fields."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from .. import methods
from ..base.io import atomic_write, follow_threads
from ..engine import loop
from ..engine.clients import LocalTraining
from ..engine.config import Config
from ..engine.messages import Instruction
from ..nets import qkv
from . import records

__all__ = ["app", "train_client", "failing", "kept_state", "keep_state"]

app = ClientApp()
FROZEN_KEY = "fedfrozen-frozen-block"  # Context.state: the frozen arrays of the current stage
FROZEN_STAGE_KEY = "fedfrozen-frozen-stage"  # Context.state: the run and stage they belong to
CLIENT_KEY = "fedfrozen-client-state"  # Context.state: what the method's client keeps (Method.client_state)
STAGE_KEY = "fedfrozen-client-stage"   # Context.state: the stage (frozen groups) that state belongs to
_SETUP: dict = {}  # the Setup (data, partitions, resident model) of the last config, built once per process
_CONFIG: dict = {}  # the Config of the last run's JSON, read (and checked) once per process


def _config(text: str) -> Config:
    """The run's Config from its JSON in the round's ConfigRecord: read and checked once per process (checking
    builds the method: it is built once more per client and round, by train_client, not twice)."""
    if text not in _CONFIG:
        _CONFIG.clear()
        _CONFIG[text] = Config.from_dict(json.loads(text))
    return _CONFIG[text]


def _config_id(cfg: Config) -> str:
    return hashlib.sha256(json.dumps(cfg.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


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


def train_client(cfg: Config, cid: int, r: int, state: dict, conf, sent: dict | None = None,
                 kept: dict | None = None) -> tuple[dict, dict, dict, dict]:
    """Client `cid`'s round r from the global `state` (parameter name -> tensor), as fedfrozen.engine.loop trains it:
    the
    clients' half of the method, built for this round (same Config) and given `kept` (its client_state of its last
    round in this stage), answers the round's Instruction (`conf`, and `sent`: what the server's half's to_client
    gave for this client) with the loop's LocalTraining. Returns (its update per trainable parameter, client -
    global after Method.upload, metrics, what goes to the server (Method.to_server), what the client keeps
    (Method.client_state))."""
    s = _setup(cfg)
    flat = s.flat
    for name, (a, b) in flat.param_range.items():
        flat.data[a:b].copy_(state[name].reshape(-1))
    x_global = flat.data.clone()
    round_fields = records.read_round(conf)
    frozen = round_fields["frozen"]
    method = methods.build(cfg)  # this client's half for the round: what it knows comes from `sent` and `kept`
    method.setup(s)
    method.load_client_state(cid, kept or {})
    trainable = [g for g in qkv.GROUPS if g not in frozen]
    ins = Instruction(r=r, cid=cid, weight=1.0, weights=x_global, frozen=frozen, stage_mask=flat.mask(trainable),
                      lr=round_fields["lr"], value_l2=round_fields["value_l2"],
                      anchor_coeff=round_fields["anchor_coeff"], value_mode=cfg.value_l2_mode, sent=sent or {})
    (reply,) = LocalTraining(s, method, use_batched=False).replies([ins])  # the loop's client, its hooks in order
    delta = reply.update
    keep = qkv.param_names(s.model, trainable)
    # the update as the method's upload left it (FedSLM truncates it), per trainable parameter: the server folds it
    # as it is (no re-subtraction of the global weights, so the same bits as the loop's)
    arrays = {name: delta[a:b].view(p.shape).clone() for name, p in s.model.named_parameters() if name in keep
              for a, b in [flat.param_range[name]]}
    metrics = records.write_reply(cid=cid, examples=len(s.client_train[cid]), loss=reply.loss, steps=reply.steps)
    return arrays, metrics, reply.extras, dict(method.client_state(cid))


@app.train()
def train(msg: Message, context: Context) -> Message:
    started = time.perf_counter()
    follow_threads()  # the thread count of the process that started the federation (its sums are the loop's)
    conf = msg.content["config"]
    cfg = _config(str(conf["fedfrozen"]))
    cid = int(context.node_config["partition-id"])
    n = int(context.node_config["num-partitions"])
    if n != cfg.n_clients:
        raise ValueError(f"the federation has {n} partitions but the config has n_clients={cfg.n_clients}")
    round_fields = records.read_round(conf)
    r, frozen = round_fields["r"], list(round_fields["frozen"])
    if failing(str(conf.get("fail", "")), r, cid):
        raise RuntimeError(f"client {cid} failed in round {r} (asked to by the run config's `fail`)")
    state = msg.content["arrays"].to_torch_state_dict() if "arrays" in msg.content else None
    if frozen and state is not None:  # the frozen block comes once per stage (also to a node not sampled in the
        # round it came: the server counts it delivered): keep it in the node's state, tagged with run and stage
        names = qkv.param_names(_setup(cfg).model, frozen)
        if names <= set(state):
            context.state[FROZEN_KEY] = ArrayRecord(torch_state_dict={n: state[n] for n in names})
            context.state[FROZEN_STAGE_KEY] = ConfigRecord({"stage": _stage(cfg, frozen)})
        elif FROZEN_KEY in context.state and str(context.state[FROZEN_STAGE_KEY]["stage"]) == _stage(cfg, frozen):
            state.update(context.state[FROZEN_KEY].to_torch_state_dict())
        else:
            raise RuntimeError(f"client {cid}: round {r} has frozen groups {frozen} but the node never received them")
    if cid not in round_fields["sampled"]:
        return Message(RecordDict({"metrics": MetricRecord(records.write_reply(cid=cid, examples=0))}), reply_to=msg)
    sent = _tensors(msg.content["method"], cid) if "method" in msg.content else {}
    folder = str(conf.get("client-state-dir", ""))
    arrays, metrics, up, keep = train_client(cfg, cid, r, state, conf, sent,
                                             kept_state(context, cfg, frozen, r, folder))
    keep_state(context, cfg, frozen, keep, r, folder)
    metrics.update(records.write_reply(seconds=time.perf_counter() - started))  # (to the reply's making)
    content = {"update": ArrayRecord(torch_state_dict=arrays), "metrics": MetricRecord(metrics)}
    if up:
        content["method"] = ArrayRecord(torch_state_dict={k: v.detach().clone() for k, v in up.items()})
    return Message(RecordDict(content), reply_to=msg)


def kept_state(context: Context, cfg: Config, frozen, r: int = 0, folder: str = "") -> dict:
    """What this node's client kept (Method.client_state) in its last round before `r` of this run's config and
    stage; {} after a stage switch (as Method.on_stage_switch drops client state) or in another run. From the
    node's Context.state, or (a resumed run starts with an empty one) from its file in `folder`."""
    stage = _stage(cfg, frozen)
    if CLIENT_KEY in context.state:
        same_stage = str(context.state[STAGE_KEY]["stage"]) == stage
        return context.state[CLIENT_KEY].to_torch_state_dict() if same_stage else {}
    if folder:
        cid = int(context.node_config["partition-id"])
        entries = [e for e in _entries(_state_file(folder, cfg, cid)) if e["round"] < r]  # not a round cut short
        if entries and entries[-1]["stage"] == stage:
            return entries[-1]["state"]
    return {}


def keep_state(context: Context, cfg: Config, frozen, state: dict, r: int = 0, folder: str = "") -> None:
    """Keep `state` for the client's next round, tagged with config and stage: in the node's Context.state, and
    in `folder` (atomically; the last two rounds', so a round a crash cut short is never read as done)."""
    context.state[CLIENT_KEY] = ArrayRecord(torch_state_dict={k: v.detach().clone() for k, v in state.items()})
    context.state[STAGE_KEY] = ConfigRecord({"stage": _stage(cfg, frozen)})
    if folder:
        path = _state_file(folder, cfg, int(context.node_config["partition-id"]))
        entries = [e for e in _entries(path) if e["round"] < r][-1:]
        kept = {k: v.detach().cpu() for k, v in state.items()}
        entries.append({"round": r, "stage": _stage(cfg, frozen), "state": kept})
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, lambda tmp: torch.save(entries, tmp))


def _state_file(folder: str, cfg: Config, cid: int) -> Path:
    return Path(folder) / f"{_config_id(cfg)}-client{cid}.pt"


def _entries(path: Path) -> list:
    return torch.load(path, weights_only=True) if path.exists() else []


def _stage(cfg: Config, frozen) -> str:
    return f"{_config_id(cfg)}:{','.join(frozen)}"


def _tensors(record: ArrayRecord, cid: int) -> dict:
    """What the server's Method.to_client gave for client `cid`: its own keys "<cid>/<name>" (the server sends
    every sampled client's while it does not know which partition a node holds), or plain names."""
    state = record.to_torch_state_dict()
    own = {k.split("/", 1)[1]: v for k, v in state.items() if k.startswith(f"{cid}/")}
    return own or {k: v for k, v in state.items() if "/" not in k}
