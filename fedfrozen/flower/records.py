"""The round's messages as Flower records, from one declaration of each message's fields.

A round's scalars go down in a ConfigRecord (`ROUND`: each record key, the Plan's or Instruction's attribute it
carries, and how it is written and read); what a client counted comes up in a MetricRecord (`REPLY`). The server
writes with `write_round`, the client reads with `read_round`; the client writes with `write_reply`, the server
reads with `read_reply`: one table per message, so the two halves cannot disagree on a key or a type (the
prox weight travels under Flower's usual "proximal-mu"). The tensors go in ArrayRecords (fedfrozen.flower.server's
train_messages, parse_replies: the global arrays, each update, the method's `sent` and `extras`).
"""

from __future__ import annotations

__all__ = ["ROUND", "REPLY", "write_round", "read_round", "write_reply", "read_reply"]


def _groups(text) -> tuple:
    return tuple(g for g in str(text).split(",") if g)


def _ids(values) -> list:
    return [int(i) for i in values]


# record key -> (attribute, write, read)
ROUND = {
    "server-round": ("r", lambda r: int(r) + 1, lambda v: int(v) - 1),  # Flower counts rounds from 1
    "frozen": ("frozen", ",".join, _groups),
    "lr": ("lr", float, float),
    "value-l2": ("value_l2", float, float),
    "proximal-mu": ("anchor_coeff", float, float),
    "sampled": ("sampled", _ids, _ids),
}
# record key -> (name, write, read); a client not sampled sends only the first two
REPLY = {
    "partition-id": ("cid", int, int),
    "num-examples": ("examples", int, int),
    "train-loss": ("loss", float, float),
    "steps": ("steps", int, int),
    "seconds": ("seconds", float, float),  # the ClientApp's own time for the round (its share of a round's cost)
}


def write_round(plan) -> dict:
    """The ConfigRecord entries of round `plan` (a fedfrozen.engine.messages.Plan)."""
    return {key: write(getattr(plan, attr)) for key, (attr, write, _) in ROUND.items()}


def read_round(conf) -> dict:
    """{attribute: value} of a round's ConfigRecord (what write_round wrote)."""
    return {attr: read(conf[key]) for key, (attr, _, read) in ROUND.items()}


def write_reply(**values) -> dict:
    """The MetricRecord entries of a client's reply from {name: value} (cid and examples always; loss, steps and
    seconds when it trained)."""
    unknown = set(values) - {name for name, _, _ in REPLY.values()}
    if unknown:
        raise ValueError(f"a reply has no field(s) {sorted(unknown)}; its fields: "
                         f"{', '.join(name for name, _, _ in REPLY.values())}")
    return {key: write(values[name]) for key, (name, write, _) in REPLY.items() if values.get(name) is not None}


def read_reply(metrics) -> dict:
    """{name: value} of a reply's MetricRecord (the fields it holds)."""
    return {name: read(metrics[key]) for key, (name, _, read) in REPLY.items() if key in metrics}
