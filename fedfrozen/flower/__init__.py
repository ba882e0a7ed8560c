"""FedFrozen on a real federation: a Flower ServerApp and ClientApp on Flower's Message API.

    pip install -e ".[flower]"
    flwr run .                                   # the local simulation federation (pyproject.toml)
    python -c "import fedfrozen.flower as f; f.simulate(ff.Config(...))"   # the same from Python

The ClientApp (`fedfrozen.flower.client:app`) trains one client exactly as `fedfrozen.run` trains it: the
same partition (its `partition-id` from the node config, the partitioner seeded by Config.seed), the same
batches, seeds and local step: the records become the loop's `fedfrozen.engine.messages.Instruction` and the loop's
client
(`LocalTraining.replies`) answers it, with the clients' half of the method, built for its round. The ServerApp
(`fedfrozen.flower.server:app`) holds the method's server half and runs the loop's round, in its order
(`fedfrozen.engine.round.play`: stage switch, sampling, aggregation, server optimiser, adaptive schedules) with the
nodes
as its exchange, and writes the same History as the in-process loop. What travels (fedfrozen.flower.records
declares the scalars): the Config as JSON, the round's frozen groups, lr, value penalty, prox weight and the
sampled partition ids in the ConfigRecord; the global arrays down (the frozen block once per stage) and each
client's update up (its trainable part, as Method.upload left it); the records the halves exchange, in process
as here (`Method.to_client` down, e.g. SCAFFOLD's c or a layer mask; `Method.to_server` up, e.g. c_i+ - c_i).
What a client keeps across rounds (`Method.client_state`: SCAFFOLD's c_i, FedDyn's h_i) lives in its node's
Context.state, tagged with the run's config and stage (a stage switch drops it).

Every registered method runs here; a plugin that says it cannot (`not_on = {"flower": reason}`) is refused before
any node starts: `check_supported` gives the reason `Method.cannot_run("flower")` gives.
"""

from __future__ import annotations

import json

from ..engine.config import Config, field_type, settings
from ..inputs.data import version
from ..methods import build

__all__ = ["config_from_run", "check_supported", "RUN_CONFIG_FIELDS", "simulate", "simulate_many"]


def _run_config_fields() -> dict:
    """run-config key (pyproject [tool.flwr.app.config], `flwr run --run-config`) -> Config field: every field a
    TOML scalar can hold, its name with dashes (`warmup-rounds`), and Flower's usual `num-clients` for n_clients.
    A dict or list field goes in `fedfrozen-config` (the whole Config as JSON)."""
    keys = {name.replace("_", "-"): name for name, _, _ in settings() if field_type(name)[0] in (bool, int, float, str)}
    return {**keys, "num-clients": "n_clients"}


RUN_CONFIG_FIELDS = _run_config_fields()

def check_supported(cfg: Config) -> None:
    """A clear error for a method the Flower apps do not run (Method.cannot_run("flower")), or a dataset they cannot
    load (one given to ff.data.register), before any node is contacted."""
    reason = build(cfg).cannot_run("flower")
    if reason:
        raise ValueError(f"method {cfg.method!r} is not supported on Flower: {reason}; run it with fedfrozen.run")
    if version(cfg.dataset) is not None:
        raise ValueError(f"dataset {cfg.dataset!r} is registered in this process only (ff.data.register); the Flower "
                         f"nodes are other processes, which do not have it: run it with fedfrozen.run")


def config_from_run(run_config: dict) -> Config:
    """The Config of a Flower run: `fedfrozen-config` (a whole Config as JSON) when given, else the named
    keys (RUN_CONFIG_FIELDS: any Config field by its dashed name; Flower fills the ones not given from
    pyproject.toml's defaults)."""
    if run_config.get("fedfrozen-config"):
        return Config.from_dict(json.loads(run_config["fedfrozen-config"]))
    base = {}
    for key, field in RUN_CONFIG_FIELDS.items():
        value = run_config.get(key, "")
        if value == "" or (value == 0 and field_type(field)[2] and field_type(field)[0] is int):
            continue  # unset: TOML has no None, so "" (and 0 for an optional count, e.g. local-steps) means it
        base[field] = value
    if base.get("local_steps"):
        base["local_epochs"] = None
    return Config.from_dict(base)


def simulate(cfg: Config, out, *, fail: str = "", verbose: bool = False, checkpoint=None, client_state_dir=None,
             stop_after: int | None = None) -> None:
    """Run `cfg` through Flower's simulation runtime (one SuperNode per client) and write its History to
    `out`. `fail="round:partition,..."` makes those clients raise in those rounds (to test failures).
    `checkpoint`: the server keeps its state there and continues from it when it exists; `client_state_dir`: where
    the clients keep theirs (both together make a resumable run); `stop_after`: stop after that many rounds."""
    resume = {"checkpoint": str(checkpoint or ""), "client_state_dir": str(client_state_dir or ""),
              "stop_after": stop_after}
    simulate_many([(cfg, out)], fail=fail, verbose=verbose, _resume=resume)


def simulate_many(runs, *, fail: str = "", verbose: bool = False, _resume=None) -> None:
    """Run each (Config, out) of `runs` in turn on one Flower simulation (one SuperNode per client, one runtime
    started once), writing each History to its `out`. The configs must agree on n_clients; every one is checked
    (check_supported) before any node starts. `fail` applies to the first."""
    from flwr.app import Context  # noqa: F401  (a clear ImportError when the extra is missing)
    from flwr.simulation import run_simulation

    from .client import app as client_app
    from .server import make_server_app

    runs = [(c, str(o)) for c, o in runs]
    if not runs:
        raise ValueError("runs: give at least one (Config, out) pair")
    for c, _ in runs:
        check_supported(c)
    cfg, out = runs[0]
    if any(c.n_clients != cfg.n_clients for c, _ in runs):
        raise ValueError(f"runs: every config must have the first's n_clients ({cfg.n_clients}): one node per client")
    try:
        run_simulation(server_app=make_server_app(cfg, out, fail=fail, more=runs[1:], **(_resume or {})),
                       client_app=client_app,
                       num_supernodes=cfg.n_clients,
                       backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
                       verbose_logging=verbose)
    finally:  # leave nothing running: the simulation's Ray runtime (raylet, actors) stops with the run
        import ray

        if ray.is_initialized():
            ray.shutdown()
