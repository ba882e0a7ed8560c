import math
from types import SimpleNamespace

import pytest
import torch
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen import methods as M
from fedfrozen.methods.scaffold import Scaffold


def test_fedprox_with_zero_mu_is_fedavg():
    assert ff.run(tiny_config(method="fedprox", prox_mu=0.0), progress=False).same_as(
        ff.run(tiny_config(method="fedavg"), progress=False))
    assert not ff.run(tiny_config(method="fedprox", prox_mu=1.0), progress=False).same_as(
        ff.run(tiny_config(method="fedavg"), progress=False))


def test_fedavgm_with_zero_momentum_and_unit_lr_is_fedavg():
    a = ff.run(tiny_config(method="fedavgm", server_momentum=0.0, server_lr=1.0), progress=False)
    assert a.same_as(ff.run(tiny_config(method="fedavg"), progress=False))


def _server(kind, lr=0.1, numel=1):
    cfg = SimpleNamespace(server_lr=lr, n_clients=10, server_momentum=0.9, server_beta1=0.9, server_beta2=0.99,
                          server_tau=1e-3, feddyn_alpha=0.1)
    opt = M.ServerOptimizer(kind, cfg)
    opt.setup(numel, "cpu")
    return opt


@pytest.mark.parametrize("kind", ["adam", "yogi", "adagrad"])
def test_fedopt_server_steps_match_hand_computation(kind):
    opt = _server(kind)
    x, mask = torch.tensor([1.0]), torch.ones(1)
    opt.step(x, torch.tensor([0.5]), mask, 5, 10)
    opt.step(x, torch.tensor([-0.2]), mask, 5, 10)
    # by hand (Reddi et al. 2021, Alg. 2; m and v start at 0; beta1 .9, beta2 .99, tau 1e-3, eta .1)
    m1 = 0.1 * 0.5
    m2 = 0.9 * m1 + 0.1 * -0.2
    v1 = {"adam": 0.01 * 0.25, "yogi": 0.01 * 0.25, "adagrad": 0.25}[kind]
    v2 = {"adam": 0.99 * v1 + 0.01 * 0.04,
          "yogi": v1 + 0.01 * 0.04,  # v1 - (1-b2) d^2 sign(v1 - d^2), with v1 < d^2
          "adagrad": v1 + 0.04}[kind]
    expected = 1.0 + 0.1 * m1 / (math.sqrt(v1) + 1e-3) + 0.1 * m2 / (math.sqrt(v2) + 1e-3)
    assert x.item() == pytest.approx(expected, rel=1e-6)


def test_server_optimiser_leaves_entries_no_client_moved():
    """The server step has no stage mask of its own (the round keeps the frozen entries: test_freeze_in_round); an
    entry whose aggregated update is 0 from the start stays where it is under the adaptive steps too."""
    for kind in ("avg", "momentum", "adam", "yogi", "adagrad"):
        opt = _server(kind, numel=2)
        x = torch.tensor([1.0, 2.0])
        for _ in range(2):
            opt.step(x, torch.tensor([0.5, 0.0]), torch.tensor([1.0, 0.0]), 5, 10)
        assert x[1].item() == 2.0 and x[0].item() != 1.0, kind


def test_scaffold_control_variates_start_at_zero_and_use_s_over_n():
    """The two halves: the clients' computes c_i+ and sends c_i+ - c_i up; the server's sums them, c += |S|/N mean,
    and sends c down; nothing else crosses."""
    cfg = SimpleNamespace(prox_mu=0.0, feddyn_alpha=0.1, scaffold_variant="update", optimizer="sgd")
    server, client = Scaffold(cfg), Scaffold(cfg)
    server.setup(3, "cpu")
    client.setup(3, "cpu")
    assert torch.equal(server.c, torch.zeros(3)) and torch.equal(client.correction(7), torch.zeros(3))
    mask = torch.ones(3)
    server.begin_round()
    d1, d2 = torch.tensor([1.0, 0.0, -1.0]), torch.tensor([0.0, 2.0, 0.0])
    for cid, d in ((0, d1), (1, d2)):
        client.from_server(cid, server.to_client(cid))
        client.after_client(cid, d, steps=2, lr=0.5, mask=mask)
        server.from_client(cid, client.to_server(cid))
    # c_i+ = c_i - c + (x^r - x_i)/(K eta) = -delta / 1, kept by the clients' half only
    assert torch.equal(client.client[0], -d1) and torch.equal(client.client[1], -d2) and not server.client.vec
    server.end_round(n_sampled=2, n_clients=10, mask=mask)
    expected = (2 / 10) * ((-d1) + (-d2)) / 2  # c += |S|/N * mean(c_i+ - c_i)
    assert torch.allclose(server.c, expected) and torch.equal(client.c, torch.zeros(3))
    client.from_server(0, server.to_client(0))
    assert torch.allclose(client.correction(0), expected - (-d1))


def test_feddyn_and_components_compose():
    m = M.build(tiny_config(method="fedfrozen", server_opt="yogi", local_objective="prox"))
    assert (m.local.name, m.server.kind, m.groups_to_freeze, m.freeze_at) == ("prox", "yogi", ("qk",), 1)
    m = M.build(tiny_config(method="fedavg", freeze_schedule="warmup", freeze=("v",)))
    assert m.groups_to_freeze == ("v",) and m.freeze_at == 1
    assert M.build(tiny_config(method="freeze_kernel_at_init")).freeze_at == 0
    assert "head" not in M.build(tiny_config(method="freeze_body")).groups_to_freeze
    with pytest.raises(ValueError, match="feddyn"):
        tiny_config(method="fedavg", local_objective="feddyn")


@pytest.mark.parametrize("method", M.names())
def test_every_preset_runs_and_keeps_its_frozen_groups_bit_identical(method, setups):
    snaps = []

    def grab(r, row, hist):
        snaps.append(setups[-1].flat.data.clone())

    hist = ff.run(tiny_config(method=method, rounds=2, warmup_rounds=1), callbacks=[grab], progress=False)
    assert len(hist) == 2 and hist.diverged is None
    assert all(math.isfinite(r["train_loss"]) for r in hist.rows)
    m = M.build(tiny_config(method=method, rounds=2, warmup_rounds=1))
    flat = setups[-1].flat
    before = snaps[0] if m.freeze_at == 1 else setups[-1].flat.data  # freeze_at 0: compare with round 1
    for g in m.frozen_groups(1):
        sl = flat.group_slice(g)
        if m.freeze_at == 0:
            assert torch.equal(snaps[0][sl], snaps[1][sl]), g
        else:
            assert torch.equal(before[sl], snaps[1][sl]), g
    trained = [g for g in ff.qkv.GROUPS if g not in m.frozen_groups(1) and flat.group_numel(g)]
    assert any(not torch.equal(snaps[0][flat.group_slice(g)], snaps[1][flat.group_slice(g)]) for g in trained)


@pytest.mark.parametrize("method", ["fedfrozen_scaffold", "fedfrozen_adam"])
def test_method_state_is_reset_at_the_switch_and_stays_off_frozen_groups(method, tmp_path, setups):
    cfg = tiny_config(method=method, rounds=4, warmup_rounds=2)
    ckpt = tmp_path / "checkpoint.pt"
    ff.run(cfg, callbacks=[lambda r, row, h: r == 1], checkpoint=ckpt, progress=False)  # stop at the end of stage 1
    before = torch.load(ckpt, weights_only=True)["method"]
    # ... and after the first stage-2 round
    ff.run(cfg, callbacks=[lambda r, row, h: r == 2], checkpoint=ckpt, progress=False)
    after = torch.load(ckpt, weights_only=True)["method"]
    qk = setups[-1].flat.group_slice("qk")
    state_before = before["local"]["c"] if method == "fedfrozen_scaffold" else before["server"]["m"]
    state_after = after["local"]["c"] if method == "fedfrozen_scaffold" else after["server"]["m"]
    assert state_before[qk].abs().sum() > 0          # stage 1 built up state on the kernel block
    assert torch.equal(state_after[qk], torch.zeros_like(state_after[qk]))  # reset, and kept off it
    assert state_after.abs().sum() > 0
    if method == "fedfrozen_scaffold":
        assert all(torch.equal(c_i[qk], torch.zeros_like(c_i[qk])) for c_i in after["local"]["client"].values())


# --- the registry is open: methods defined outside the package -------------------------------

class FreezeHeadFrom2(M.Method):
    """A plugin: FedAvg with the head frozen from round 2 (overrides one hook)."""

    def frozen_groups(self, r):
        return ("head",) if r >= 2 else ()


@pytest.fixture
def plugin():
    M.register("toy_freeze_head", FreezeHeadFrom2, summary="FedAvg, head frozen from round 2")
    yield "toy_freeze_head"
    M.unregister("toy_freeze_head")


def test_a_plugin_method_runs_through_ff_run_and_equals_its_composition(plugin, setups):
    heads = []
    head = lambda: setups[-1].flat.data[setups[-1].flat.group_slice("head")].clone()  # noqa: E731
    toy = ff.run(tiny_config(method=plugin, rounds=4), callbacks=[lambda r, row, h: heads.append(head())],
                 progress=False)
    assert [r["stage"] for r in toy.rows] == [1, 1, 2, 2]
    assert torch.equal(heads[1], heads[2]) and torch.equal(heads[2], heads[3])   # frozen from round 2
    assert not torch.equal(heads[0], heads[1])
    same = ff.run(tiny_config(method="fedavg", freeze_schedule="warmup", freeze=("head",), warmup_rounds=2,
                              rounds=4), progress=False)
    assert toy.same_as(same)
    assert plugin in M.describe()


def test_registry_errors_name_the_problem(plugin):
    with pytest.raises(ValueError, match="already registered"):
        M.register(plugin, FreezeHeadFrom2, summary="again")
    with pytest.raises(ValueError, match="identifier"):
        M.register("not a name", summary="x")
    with pytest.raises(ValueError, match="summary"):
        M.register("nosummary", summary="")
    with pytest.raises(ValueError, match="method must be one of fedavg.*toy_freeze_head"):
        tiny_config(method="toy_freeze_hea")
    M.unregister(plugin)
    with pytest.raises(ValueError, match="method must be one of"):
        tiny_config(method=plugin)
    M.register(plugin, FreezeHeadFrom2, summary="FedAvg, head frozen from round 2")  # for the fixture's teardown


class MaskOddHeadsOfClient0(M.Method):
    """A plugin with a per-client mask: client 0 never trains the head's odd rows; it records its updates."""

    def setup(self, setup):
        super().setup(setup)
        a, b = setup.flat.group_range["head"]
        self.masked = torch.arange(a, b)[1::2]
        self.mask0 = torch.ones(setup.flat.numel)
        self.mask0[self.masked] = 0.0
        self.deltas = {}

    def client_mask(self, r, cid):
        return self.mask0 if cid == 0 else None

    def after_client(self, r, cid, delta, steps, lr, mask):
        super().after_client(r, cid, delta, steps, lr, mask)
        self.deltas[(r, cid)] = delta.clone()


def test_a_per_client_mask_keeps_masked_entries_bit_identical_and_counts_bytes():
    built = []

    def factory(cfg, **kw):
        built.append(MaskOddHeadsOfClient0(cfg, **kw))
        return built[-1]

    M.register("toy_mask", factory, summary="client 0 leaves odd head rows alone")
    try:
        hist = ff.run(tiny_config(method="toy_mask", rounds=2, weight_decay=0.1), progress=False)
    finally:
        M.unregister("toy_mask")
    m = built[-1]
    for (r, cid), d in m.deltas.items():
        assert (d[m.masked] == 0).all() == (cid == 0), (r, cid)   # bit-identical only where masked
    assert (m.deltas[(0, 0)] != 0).sum() > 0                        # client 0 still trains the rest
    plain = ff.run(tiny_config(method="fedavg", rounds=2, weight_decay=0.1), progress=False)
    saved = 2 * len(m.masked) * 4  # two payloads (down, up) of float32 entries, one client
    def both(h):
        return h.rows[0]["bytes_up"] + h.rows[0]["bytes_down"]

    assert both(hist) == both(plain) - saved


def test_fedfrozen_stage_switch_equals_the_composition_of_fedavg_and_a_warmup_schedule():
    a = ff.run(tiny_config(method="fedfrozen", rounds=3, warmup_rounds=1), progress=False)
    b = ff.run(tiny_config(method="fedavg", freeze_schedule="warmup", freeze=("qk",), rounds=3, warmup_rounds=1),
               progress=False)
    assert a.same_as(b)


def test_cli_lists_every_registered_method(capsys):
    from fedfrozen import cli

    assert cli.main(["methods"]) == 0
    out = capsys.readouterr().out
    for name, summary in M.describe().items():
        assert f"{name}" in out and summary in out
    help_text = cli.build_parser()._subparsers._group_actions[0].choices["run"].format_help()
    assert "fedfrozen_scaffold" in help_text and "freeze_body" in help_text


# --- SCAFFOLD option I --------------------------------------------------------------------------

def test_scaffold_variant_auto_is_option_one_for_adamw_and_option_two_for_sgd():
    assert M.build(tiny_config(method="scaffold")).local.variant == "gradient"
    assert M.build(tiny_config(method="scaffold", optimizer="sgd")).local.variant == "update"
    gradient = tiny_config(method="scaffold", optimizer="sgd", scaffold_variant="gradient")
    assert M.build(gradient).local.variant == "gradient"


def test_scaffold_option_one_variate_is_the_full_batch_gradient_at_the_global_weights(tmp_path):
    from fedfrozen import loop

    cfg = tiny_config(method="scaffold", rounds=2)
    ckpt = tmp_path / "c.pt"
    ff.run(cfg, callbacks=[lambda r, row, h: r == 0], checkpoint=ckpt, progress=False)  # stop after round 0
    saved = torch.load(ckpt, weights_only=True)
    state, server = saved["client_method"]["local"], saved["method"]["local"]  # the clients' half, the server's
    ref = loop.prepare(cfg)  # the same initial weights x^0 (seeded)
    grads = []
    for cid in range(cfg.n_clients):  # by plain autograd: the gradient of the client's mean loss at x^0
        ref.flat.grad.zero_()
        idx = ref.client_train[cid]
        torch.nn.functional.cross_entropy(ref.model(ref.x[idx]), ref.y[idx]).backward()
        grads.append(ref.flat.grad.clone())
        assert torch.allclose(state["client"][str(cid)], grads[-1], atol=1e-6), cid
    # server: c = (|S|/N) mean(c_i+ - 0) = mean of the gradients with full participation; it keeps no c_i
    assert torch.allclose(server["c"], torch.stack(grads).mean(0), atol=1e-6) and not server["client"]


@pytest.mark.parametrize("variant", ["update", "gradient"])
def test_scaffold_both_options_equal_fedavg_on_identical_clients(variant, monkeypatch):
    from fedfrozen import loop

    original = loop.Setup.__init__

    def same_data(self, *a, **k):
        original(self, *a, **k)
        self.client_train = [self.client_train[0]] * len(self.client_train)
        self.client_sizes[:] = self.client_sizes[0]

    monkeypatch.setattr(loop.Setup, "__init__", same_data)
    kw = dict(optimizer="sgd", momentum=0.0, weight_decay=0.0, lr=0.05, batch_size=10_000, local_steps=3, rounds=3)
    avg = ff.run(tiny_config(method="fedavg", **kw), progress=False).to_frame()
    sca = ff.run(tiny_config(method="scaffold", scaffold_variant=variant, **kw), progress=False).to_frame()
    for col in ["train_loss", "test_loss", "test_acc"]:
        assert (avg[col] - sca[col]).abs().max() < 1e-5, col
    assert (sca["bytes_up"] == 2 * avg["bytes_up"]).all() and (sca["bytes_down"] == 2 * avg["bytes_down"]).all()


_HOOKS = ("frozen_groups", "on_stage_switch", "value_penalty", "sample_clients", "begin_round", "anchor_coeff",
          "to_client", "from_server", "client_mask", "init_client", "client_forward", "correction", "upload",
          "after_client", "to_server", "from_client", "aggregate", "client_bytes", "server_update", "on_round_end")
_PRE = [("client", h) for h in ("from_server", "client_mask", "init_client", "client_forward", "correction")]
_POST = [("client", h) for h in ("upload", "after_client", "to_server")]
_RECEIVE = [("server", h) for h in ("from_client", "aggregate", "client_mask", "client_bytes")]


@pytest.mark.parametrize("engine", ["sequential", "batched"])
def test_the_hooks_are_called_in_the_documented_order(engine):
    """The order of methods/base.py's docstring and docs/methods.md, recorded on each half (outermost calls only:
    a hook calling another, as value_penalty calls frozen_groups, counts once). Sequentially each client passes
    its hooks before and after training in turn and the server takes its reply before the next one prepares; the
    batched engine runs every client's pre-training hooks first."""
    calls = []

    def recorded(name):
        def hook(self, *a, **kw):
            self._depth = getattr(self, "_depth", 0) + 1
            if self._depth == 1:
                calls.append((id(self), name))
            try:
                return getattr(M.Method, name)(self, *a, **kw)
            finally:
                self._depth -= 1
        return hook

    Recorder = type("Recorder", (M.Method,), {h: recorded(h) for h in _HOOKS})
    M.register("hook_recorder", Recorder, summary="records its hooks", schedule="warmup", frozen=("qk",))
    try:
        ff.run(tiny_config(method="hook_recorder", rounds=2, warmup_rounds=1, clients_per_round=2, engine=engine),
               progress=False)
    finally:
        M.unregister("hook_recorder")
    client = {i for i, name in calls if name == "init_client"}
    assert len(client) == 1 and len({i for i, _ in calls}) == 2  # two halves, two instances
    sides = [("client" if i in client else "server", name) for i, name in calls]
    if engine == "sequential":
        clients = _PRE + _POST + _RECEIVE + _PRE + _POST + _RECEIVE
    else:
        clients = _PRE + _PRE + _POST + _RECEIVE + _POST + _RECEIVE
    head = [("server", h) for h in ("frozen_groups", "value_penalty", "sample_clients", "begin_round",
                                    "anchor_coeff", "to_client", "to_client")]
    tail = [("server", "server_update"), ("server", "on_round_end")]
    switch = [("server", "frozen_groups"), ("server", "on_stage_switch"), *head[1:], ("client", "on_stage_switch")]
    assert sides == [*head, *clients, *tail, *switch, *clients, *tail]


def test_where_a_method_cannot_run_is_one_mechanism_on_the_method():
    """Method.cannot_run: the batched engine's and Flower's refusals come from the method object, with a reason."""
    from fedfrozen import batched
    from fedfrozen.flower import check_supported

    every = {m: M.build(tiny_config(method=m)) for m in M.names()}
    on_flower = sorted(m for m, meth in every.items() if meth.cannot_run("flower") is None)
    assert on_flower == sorted(M.names())  # every method's halves talk in records: they run on Flower as here
    for m, meth in every.items():
        check_supported(tiny_config(method=m))  # what Flower checks is this
        assert (meth.cannot_run("batched") is None) == meth.batched
        assert (batched.unsupported(meth, torch.nn.Module()) is None) == meth.batched
    assert not hasattr(M.Method, "split") and not hasattr(M.LocalObjective, "split")  # no flag to disagree on

    class ClientHook(M.Method):  # a client-side hook: its half runs it wherever the client trains
        def after_client(self, r, cid, delta, steps, lr, mask):
            pass

    assert ClientHook(tiny_config()).cannot_run("flower") is None
    with pytest.raises(ValueError, match="runtime must be one of"):
        every["fedavg"].cannot_run("gpu")

    class Plugin(M.Method):
        not_on = {"batched": "it needs the whole model per client", "flower": "it reads every client's data"}

    plugin = Plugin(tiny_config())
    assert plugin.cannot_run("batched") == "it needs the whole model per client"
    assert plugin.cannot_run("flower") == "it reads every client's data"


def test_t0_at_or_past_the_last_round_means_never_frozen_everywhere():
    """One meaning of T0 (methods.freeze_round): at or past the last round the schedule never freezes and the run
    says so when it starts (that its History is then FedAvg's: tests/test_loop.py); one round earlier the last round
    is stage 2."""
    never = tiny_config(method="fedfrozen", rounds=3, warmup_rounds=3)
    assert ff.methods.freeze_round(never) is None and ff.methods.freeze_round(never.replace(warmup_rounds=2)) == 2
    assert any("nothing is ever frozen" in w for w in never.warnings())
    assert ff.methods.build(never).frozen_groups(2) == ()
    assert [r["stage"] for r in ff.run(never.replace(warmup_rounds=2), progress=False).rows] == [1, 1, 2]
