"""Notebook 15's cells (fedfrozen.studies.budgets): a longer budget is the notebooks' own run with more rounds."""

import pytest

import fedfrozen as ff
from fedfrozen.runs.experiments import config_key
from fedfrozen.studies import budgets, recipes, roles

RATES = {"sgd": {"fedavg": 0.3, "fedfrozen": 0.3}, "adamw_5ep": {"fedavg": 3e-3, "fedfrozen": 1e-2},
         "scratch": {"fedavg": 3e-3, "fedfrozen": 3e-3}, "pretrained": {"fedavg": 1e-3, "fedfrozen": 1e-3}}


def _cpu(cells=budgets.CELLS):
    image, text = ff.profiles.federated("cpu"), roles.fields("cpu", "data")
    return image, text, budgets.build("cpu", image, text, RATES, cells=cells)


def test_the_first_budget_is_the_notebooks_own_runs():
    image, text, arms = _cpu()
    own = recipes.build("cpu", image, {"sgd": RATES["sgd"]}, cells=["adamw", "sgd", "p4_w48"])
    own += roles.build("cpu", text, {k: RATES[k] for k in roles.INITS})
    keys = {config_key(a.cfg) for a in own}
    first = [a for a in arms if a.budget == 1 and a.cell != "adamw_5ep"]
    assert first and all(config_key(a.cfg) in keys for a in first)  # they load from notebooks 13's and 14's cache


def test_a_longer_budget_changes_the_rounds_and_t0_only():
    _, _, arms = _cpu()
    first = {(a.cell, a.cfg.method, a.cfg.seed): a.cfg for a in arms if a.budget == 1}
    longer = [a for a in arms if a.budget > 1]
    assert {a.budget for a in longer} == {2, 4}
    for a in longer:
        ref = first[(a.cell, a.cfg.method, a.cfg.seed)]
        da, db = a.cfg.to_dict(), ref.to_dict()
        assert {k for k in da if da[k] != db[k]} == {"rounds", "warmup_rounds"}
        assert a.cfg.rounds == a.budget * ref.rounds and a.cfg.warmup_rounds == round(0.25 * a.cfg.rounds)


def test_each_cell_runs_its_plan():
    _, _, arms = _cpu()
    for cell, (pair_at, fedavg_at, seeds) in budgets.PLAN.items():
        got = {(a.budget, a.cfg.method) for a in arms if a.cell == cell}
        assert got == {(m, "fedavg") for m in (*pair_at, *fedavg_at)} | {(m, "fedfrozen") for m in pair_at}, cell
        assert {a.cfg.seed for a in arms if a.cell == cell} == set(seeds)
    rows = budgets.comparisons(arms)
    assert len(rows) == sum(len(p) for p, _, _ in budgets.PLAN.values())  # a C1 row where the pair ran, no other
    assert ("C1", "FedFrozen T0 25% − FedAvg, both at 0.003, adamw, 480 rounds", "adamw, 480 rounds",
            "fedfrozen T0 25% @ 0.003", "fedavg @ 0.003", "late_acc") in rows
    five = [a.cfg for a in arms if a.cell == "adamw_5ep"]
    assert {(c.local_epochs, c.rounds, c.optimizer, c.lr) for c in five} == {(5, 240, "adamw", 3e-3)}  # FedAvg's rate
    assert {c.pretrain_seed == c.seed for a in arms if a.cell == "text_pretrained" for c in [a.cfg]} == {True}


def test_the_rule_for_adamw_5ep_runs_on_the_selection_seed():
    cfgs = budgets.selection_configs("cpu", ff.profiles.federated("cpu"))
    assert {c.seed for c in cfgs} == {budgets.SELECTION_SEED} and len(cfgs) == 2 * len(ff.profiles.CPU_LR_GRID)
    assert {(c.local_epochs, c.rounds) for c in cfgs} == {(5, 240)}


def test_bad_input_is_refused_before_any_run():
    image, text = ff.profiles.federated("cpu"), roles.fields("cpu", "data")
    with pytest.raises(ValueError, match="cells must be among"):
        budgets.build("cpu", image, text, RATES, cells=["adamw", "lstm"])
    with pytest.raises(ValueError, match="needs text_base"):
        budgets.build("cpu", image, None, RATES, cells=["text_scratch"])
    with pytest.raises(ValueError, match="runs at one rate"):
        budgets.build("cpu", image, text, {**RATES, "scratch": {"fedavg": 3e-3, "fedfrozen": 3e-2}},
                      cells=["text_scratch"])
    with pytest.raises(ValueError, match="no selected rates for cell 'sgd'"):
        budgets.build("cpu", image, text, {}, cells=["sgd"])
    with pytest.raises(ValueError, match="seeds for cell 'adamw' must not be empty"):
        budgets.build("cpu", image, text, RATES, cells=["adamw"], seeds={"adamw": []})


# Every README cell's status: the FedAvg settings the README's rows rest on, screened, and doubled where the screen
# gains a point or more

def test_every_readme_comparison_rests_on_one_fedavg_setting_and_the_study_cells_are_named():
    from fedfrozen.studies import report
    from fedfrozen.studies.budgets import STUDY_CELLS, readme_settings

    settings = readme_settings("cpu")
    quoted = [f"{row.code} {row.regime}: {q.label}" for row in report.ROWS for q in row.quotes]
    assert sorted(r for s in settings for r in s["rows"]) == sorted(quoted)  # each comparison once
    for s in settings:
        assert [c.seed for c in s["configs"]] == list(range(5)) and {c.method for c in s["configs"]} == {"fedavg"}
    # the README's main C1 row rests on the adamw cell's FedAvg (notebook 13's), which notebook 15 doubles itself
    (main,) = [s for s in settings if "C1 base, Dir 0.1: accuracy" in s["rows"]]
    assert main["cell"] == "adamw" and any(r.startswith("C3 base, Dir 0.1") for r in main["rows"])  # 05's λ = 0
    assert {s["cell"] for s in settings} - {None} == set(STUDY_CELLS.values()) - {"adamw_5ep"}
    # one body and a body per seed are two settings (their pre-training seeds differ), one line each
    one, per_seed = ([s for s in settings if f"C1 pretrained, Dir 0.1: {x}" in s["rows"]] for x in
                     ("one body", "a body per seed"))
    assert len(one) == len(per_seed) == 1 and one[0] is not per_seed[0]
    assert {c.pretrain_seed for c in per_seed[0]["configs"]} == set(range(5))


def test_a_screen_run_stands_apart_from_a_notebooks_runs_unless_every_one_is_cached(tmp_path):
    from fedfrozen.studies.budgets import doubled, screen_experiment

    cfgs = [ff.Config(rounds=4, warmup_rounds=1, seed=s) for s in (0, 1)]
    assert screen_experiment(cfgs, "digits", root=tmp_path) == "digits_screen"
    for c in cfgs:
        folder = tmp_path / "digits" / config_key(c)
        folder.mkdir(parents=True)
        (folder / "history.json").write_text("{}")
    assert screen_experiment(cfgs, "digits", root=tmp_path) == "digits"
    twice = doubled(cfgs[0])
    assert (twice.rounds, twice.warmup_rounds) == (8, 2)
    assert {k for k, v in twice.to_dict().items() if cfgs[0].to_dict()[k] != v} == {"rounds", "warmup_rounds"}


def _run(seed, late, gain, rounds=100):
    """A History-like run: evaluated every round of its last fifth on a line that gains `gain` over a tenth of the
    rounds, ending at `late`."""
    from types import SimpleNamespace

    rows = [dict(round=r, test_acc=late - gain * (rounds - 1 - r) / (rounds / 10)) for r in range(80, rounds)]
    return SimpleNamespace(rows=rows, config=dict(rounds=rounds, seed=seed), diverged=None, late_accuracy=late)


def test_the_status_is_the_screen_or_the_doubling_and_says_which():
    from types import SimpleNamespace

    import pandas as pd

    from fedfrozen.studies.budgets import readme_status
    from fedfrozen.studies.convergence import FAILS, PASSES

    cfg = SimpleNamespace(rounds=100)
    settings = [dict(rows=["C1 flat"], cell=None, configs=[cfg]), dict(rows=["C1 rising"], cell=None, configs=[cfg]),
                dict(rows=["C1 rising, doubled"], cell=None, configs=[cfg]),
                dict(rows=["C1 study"], cell="adamw", configs=[cfg]), dict(rows=["C1 pending"], cell="sgd",
                                                                           configs=[cfg]),
                dict(rows=["C1 smoke"], cell=None, configs=[cfg])]
    flat = [_run(s, 0.7, 0.002) for s in range(5)]
    rising = [_run(s, 0.7, 0.03) for s in range(5)]
    twice = [_run(s, 0.74 + 0.001 * s, 0.0) for s in range(5)]
    convergence = pd.DataFrame([dict(cell="adamw", budget=1, by="doubling", gain=0.004, half_width=0.002, n=15,
                                     status=PASSES)])
    got = readme_status(settings, [flat, rising, rising, flat, flat, []], {2: (rising, twice)}, convergence)
    assert list(got["status"]) == [PASSES, "needs the doubling runs", FAILS, PASSES, "pending: its runs are not in",
                                   "not run at this profile"]
    assert list(got["by"])[:3] == ["last tenth", "last tenth", "doubling (FedAvg at 2x)"]
    assert got.loc[0, "screen_mean"] == pytest.approx(0.2) and got.loc[1, "screen_mean"] == pytest.approx(3.0)
    assert got.loc[2, "gain"] == pytest.approx(100 * (0.742 - 0.7)) and got.loc[3, "gain"] == pytest.approx(0.4)


# A seed's budgets pair on one machine: its first budget is read where the machine of its longer ones trained it

def _cache(root, experiment, cfg, machine_signature):
    """A finished cache entry of `cfg` in `experiment` trained on the machine `machine_signature`."""
    import json

    folder = root / experiment / config_key(cfg)
    folder.mkdir(parents=True)
    (folder / "history.json").write_text("{}")
    (folder / "env.json").write_text(json.dumps({"machine": machine_signature}))


def test_the_first_budget_is_read_where_the_longer_budgets_machine_trained_it(tmp_path):
    from fedfrozen.base.io import machine, machine_id

    one, two = (ff.Config(rounds=r, warmup_rounds=r // 4, seed=3) for r in (4, 8))
    here, b = budgets._this_machine(), "torch x | CPU B | x86_64 | 1 thread"
    homes = budgets.rerun_homes("digits", here)
    assert homes == ("digits", "digits_screen", f"digits_screen_{here}")
    # nothing cached: the notebook's own folder, as at the smoke profile
    assert budgets.paired_home(one, here, homes, tmp_path) == "digits"
    _cache(tmp_path, "digits", one, b)  # the notebook's run is another machine's: trained again apart from it
    assert budgets.paired_home(one, here, homes, tmp_path) == "digits_screen"
    assert budgets.paired_home(one, machine_id(b), budgets.rerun_homes("digits", machine_id(b)), tmp_path) == "digits"
    _cache(tmp_path, "digits_screen", one, b)  # the rerun folder holds another machine's too: this machine's own
    assert budgets.paired_home(one, here, homes, tmp_path) == homes[2]
    _cache(tmp_path, homes[2], one, machine(threads=1))
    assert budgets.paired_home(one, here, homes, tmp_path) == homes[2]
    # longer runs of another machine whose first budget that machine did not train: refused, not paired across two
    c = "torch x | CPU C | x86_64 | 1 thread"
    with pytest.raises(ValueError, match="would pair two machines"):
        budgets.paired_home(one, machine_id(c), budgets.rerun_homes("digits", machine_id(c)), tmp_path)
    with pytest.raises(ValueError, match="from machines other than"):
        budgets.paired_home(one, here, homes[:2], tmp_path)
    # the longer budgets' machine: their cached runs', this machine's where none is cached, refused where split
    assert budgets.longer_machine([two], "digits", tmp_path) == here
    _cache(tmp_path, "digits", two, b)
    assert budgets.longer_machine([two], "digits", tmp_path) == machine_id(b)
    four = two.replace(rounds=16, warmup_rounds=4)
    _cache(tmp_path, "digits", four, c)
    with pytest.raises(ValueError, match=r"seed \[3\].*trained on machines"):
        budgets.longer_machine([two, four], "digits", tmp_path)


def test_each_arm_of_the_notebook_is_read_from_the_folder_that_pairs_it(tmp_path):
    from fedfrozen.studies.controls import Arm

    arms = [Arm("c", m, ff.Config(method=m, rounds=4 * k, warmup_rounds=k, seed=s), "", None, k)
            for k in (1, 2) for m in ("fedavg", "fedfrozen") for s in (0, 1)]
    arms.append(Arm("alone", "fedavg", ff.Config(rounds=6, seed=0), "", None, 1))  # one budget: its notebook's run
    a = "torch x | CPU A | x86_64 | 1 thread"
    for arm in arms:
        if arm.budget == 1 and arm.cell == "c":
            _cache(tmp_path, "digits", arm.cfg, a)  # the notebook's first budget, trained on machine A
        if arm.budget == 2 and arm.cfg.seed == 0:
            _cache(tmp_path, "digits", arm.cfg, a)  # seed 0's longer runs: A too; seed 1's: not trained yet
    got = budgets.experiments(arms, lambda arm: "digits", tmp_path)
    # seed 1's first budget is trained again beside its longer runs, here, apart from machine A's
    assert got == ["digits" if arm.budget == 2 or arm.cell == "alone" or arm.cfg.seed == 0 else "digits_screen"
                   for arm in arms]


def test_a_seed_trains_its_first_budget_before_its_longer_ones_one_seed_at_a_time():
    from fedfrozen.studies.controls import Arm

    arms = [Arm("c", m, ff.Config(method=m, rounds=4 * k, warmup_rounds=k, seed=s), "", None, k)
            for k in (2, 1, 4) for m in ("fedavg", "fedfrozen") for s in (0, 1)]
    where = ["long" if a.budget > 1 else ("own" if a.cfg.seed == 0 else "rerun") for a in arms]
    got = budgets.units(arms, where)
    assert [(cell, seed) for cell, seed, _ in got] == [("c", 0), ("c", 1)]
    for _, seed, steps in got:
        assert [exp for exp, _ in steps] == ["own" if seed == 0 else "rerun", "long"]
        first, longer = (set(idx) for _, idx in steps)
        assert {arms[i].budget for i in first} == {1} and {arms[i].budget for i in longer} == {2, 4}
        assert {arms[i].cfg.seed for i in first | longer} == {seed} and len(first | longer) == 6


def test_the_screen_pairs_each_seeds_doubling_with_a_first_budget_of_its_machine(tmp_path, monkeypatch, request):
    import json

    import torch

    from fedfrozen.studies import convergence
    from fedfrozen.studies.tables import machine_of

    monkeypatch.setattr(convergence, "THRESHOLD", -1.0)  # every setting gets its doubling runs
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the notebooks train (ff.io.use_threads): the machine signature names the count
    request.addfinalizer(lambda: torch.set_num_threads(threads))
    tiny = dict(dataset="digits", model="vit_digits", model_kwargs=dict(embed_dim=16, depth=1, num_heads=2),
                n_clients=4, clients_per_round=2, rounds=10, local_steps=1, batch_size=16, partition="iid",
                eval_every=1, device="cpu", engine="sequential", warmup_rounds=2)
    cfgs = [ff.Config(seed=s, **tiny) for s in (0, 1)]
    # seed 1's first budget is in the notebook's folder too, from another machine: it must not pair with this one's
    ff.run_many(cfgs[1:], root=tmp_path, experiment="digits", workers=1, progress=False)
    env = tmp_path / "digits" / config_key(cfgs[1]) / "env.json"
    env.write_text(json.dumps({**json.loads(env.read_text()), "machine": "torch x | CPU B | x86_64 | 1 thread"}))
    settings = [dict(rows=["C1 x"], cell=None, configs=cfgs)]
    hists, pairs = budgets.screen(settings, workers=1, root=tmp_path)
    ones, twos = pairs[0]
    here = budgets._this_machine()
    assert [h.config["seed"] for h in ones] == [0, 1] and [h.config["rounds"] for h in twos] == [20, 20]
    assert {machine_of(h) for h in ones + twos} == {here}  # each seed's 1x and 2x on one machine
    assert (tmp_path / "digits_screen" / config_key(cfgs[1]) / "history.json").exists()
    status = budgets.readme_status(settings, hists, pairs)
    assert status.loc[0, "by"] == "doubling (FedAvg at 2x)" and status.loc[0, "n"] == 2
