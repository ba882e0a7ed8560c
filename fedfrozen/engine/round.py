"""One federated round as two messages, shared by `fedfrozen.engine.loop.run` and the Flower apps (fedfrozen.flower).

The server sends each sampled client an `Instruction` (the round, the global weights, the stage, the round's rate,
value penalty and prox weight, and `sent`: what the method's server half has for that client's half); the client
answers with a `Reply` (its update, its share p_i, its training loss and steps, and `extras`: what its half sends
the server's). The server's side is `Round`, holding the method's server half; the clients' side is `LocalTraining`
(either engine), holding the clients' half, whose `replies` turns instructions into replies. `play` is the round's
order, written once: the loop runs it with `LocalTraining.replies` as the exchange, the Flower ServerApp with its
nodes (fedfrozen.flower.server), and the Flower ClientApp answers with the same `LocalTraining.replies`:

    s, rnd, hist, first = loop.start_up(cfg, method, client=client)   # the same start for both (fresh or resumed)
    clients = LocalTraining(s, client, use_batched)                    # the clients' half, in this process
    stop = play(rnd, r, hist, lambda plan, ins: (clients.replies(ins), {}))
        plan = rnd.open(r)                       # stage switch, lr, value penalty, sampling (server half)
        replies = exchange(plan, rnd.instructions(plan))   # to_client; local training; to_server
        rnd.receive(plan, reply) for each        # from_client, aggregate, drift sums, loss and bytes
        rnd.finish(plan, hist, started)          # server step, the stage's freeze, measurements: the row

A client's hooks run on its side, in one order wherever it trains (fedfrozen.methods.base lists it): from_server,
client_mask (unless the server sent the mask), init_client, client_forward, correction, (training), upload,
after_client, to_server; the server's side then takes the reply (from_client, aggregate) and counts its bytes
(client_mask, client_bytes).
"""

from __future__ import annotations

import math
import time
import warnings

from .server import Round

__all__ = ["play"]


def play(rnd: Round, r: int, hist, exchange) -> bool:
    """Round r in its order, written once: the loop runs it with its clients in this process, the Flower ServerApp
    with its nodes. Opens the round (stage switch, rate, value penalty, sampling), gives `exchange(plan,
    instructions)` one Instruction per sampled client and takes back (replies, columns): the replies of the clients
    that trained, in the sampled order (an iterable: in process each is received before the next client trains),
    and columns for the History row (Flower: what its records weighed, failures). Each reply is received (from_client,
    aggregate, drift, bytes) unless its loss is not finite: then `hist.diverged` says where, nothing more is taken and
    no row is written. Else the round closes (server step on the replies received, the stage's freeze, measurements,
    evaluation: the row). Returns whether the run stops (diverged, or the method asks)."""
    started = time.perf_counter()
    plan = rnd.open(r)
    replies, columns = exchange(plan, rnd.instructions(plan))
    joined = []
    for reply in replies:
        if not math.isfinite(reply.loss):
            hist.diverged = {"round": r, "client": reply.cid}
            warnings.warn(f"run diverged: non-finite loss at round {r}, client {reply.cid}; stopping",
                          RuntimeWarning, stacklevel=2)
            return True
        rnd.receive(plan, reply)
        joined.append(reply.cid)
    return rnd.finish(plan, hist, started, joined=joined, **columns)
