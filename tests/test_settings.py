"""A method owns its settings: a dataclass declared beside it, given as Config.method_args, validated where it is
declared, flags generated from it; a component's settings are spelled by their flat names. One spelling a setting:
the other spellings of earlier versions are refused by name, read only from stored configs, and kept as cache keys."""

import dataclasses
import hashlib
import json
import warnings
from dataclasses import dataclass
from typing import ClassVar

import pytest
from conftest import tiny_config

import fedfrozen as ff
from fedfrozen import cli, experiments
from fedfrozen.methods import Settings, setting


def test_every_registered_setting_has_help_a_valid_default_and_one_flat_name():
    flats = {}
    for name in ff.methods.names():
        cls = ff.methods.settings_class(name)
        assert cls.create(name, {}).changed() == {}  # the defaults pass their own checks
        for spec in ff.methods.settings.spec(cls):
            assert spec["help"], (name, spec["name"])
            flats.setdefault(spec["flat"], set()).add(cls)
    # one spelling, one setting: FedACT's settings extend FedAdamW's, so gamma is fedadamw_gamma for both
    assert "fedadamw_gamma" in flats and "fedact_gamma" not in flats and "fedsteer_lambda" in flats
    assert not set(flats) & {f.name for f in dataclasses.fields(ff.Config)}
    assert not set(flats) & set(ff.methods.component_settings())  # one name, one setting


def test_method_args_are_normalised_to_the_changed_settings():
    cfg = ff.Config(method="fedsteer", method_args={"core": 5, "lambda": 1, "select_rounds": 5})
    assert cfg.method_args == {"core": 5, "lambda": 1.0}  # defaults left out, ints of float settings floats
    assert isinstance(cfg.method_args["lambda"], float)
    assert ff.Config(method="fedslm", method_args={"ranks": [4, 8]}).method_args == {"ranks": (4, 8)}
    m = ff.methods.build(cfg)
    assert m.settings.core == 5 and m.settings["lambda"] == 1.0 and m.settings.select_rounds == 5
    assert ff.Config.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize("method, args, message", [
    ("fedavg", {"core": 5}, r"method 'fedavg' has no setting\(s\) \['core'\] \(its settings: none\)"),
    ("fedsteer", {"cores": 5}, r"has no setting\(s\) \['cores'\] \(its settings: core, lambda, select_rounds\)"),
    ("fedsteer", {"core": 0}, r"method_args\['core'\] of method 'fedsteer' must be >= 1; got 0"),
    ("fedsteer", {"core": 2.5}, r"method_args\['core'\] of method 'fedsteer' must be an integer; got 2.5"),
    ("fedsteer", {"lambda": float("nan")}, r"method_args\['lambda'\] .* must be a finite number"),
    ("head_pruning", {"sparsity": 1.0}, r"method_args\['sparsity'\] .* must be >= 0 and < 1; got 1.0"),
    ("head_pruning", {"weighting": "x"}, r"method_args\['weighting'\] .* must be one of confidence, uniform"),
    ("fedadamw", {"server_moments": "false"}, r"method_args\['server_moments'\] .* must be True or False"),
    ("fedslm", {"ranks": (4, True)}, r"method_args\['ranks'\] .* must be a list of ints"),
    ("fedtlu", {"k": None, "x": 1}, r"no setting\(s\) \['x'\]"),
    ("fedsteer", [("core", 2)], r"method_args must be a dict"),
])
def test_bad_settings_are_named_before_any_work(method, args, message):
    with pytest.raises(ValueError, match=message):
        ff.Config(method=method, method_args=args)


def test_checks_across_the_config_run_when_the_config_is_built():
    with pytest.raises(ValueError, match=r"method_args\['core'\] \(7\) must not exceed n_clients \(6\)"):
        ff.Config(method="fedsteer", n_clients=6, method_args={"core": 7})


def test_a_method_settings_flat_name_is_refused_with_its_one_spelling():
    said = r"fedsteer_core is a method's setting: give it as method_args=\{'core': \.\.\.\} \(of fedsteer; command line"
    with pytest.raises(ValueError, match=said):
        ff.Config(method="fedsteer", fedsteer_core=5)
    cfg = ff.Config(method="fedsteer", method_args={"core": 5})
    with pytest.raises(ValueError, match="fedsteer_lambda is a method's setting"):
        cfg.replace(fedsteer_lambda=2)
    with pytest.raises(AttributeError, match=r"no attribute 'fedsteer_core': the setting is cfg.method_args\['core'\]"):
        cfg.fedsteer_core  # noqa: B018
    # a stored config of an earlier version: another method's setting never changed its run; dropped, and said
    with pytest.warns(FutureWarning, match=r"head_sparsity=0.3\) is ignored: method 'fedavg' has no such setting.*"
                                           r"head_pruning"):
        assert ff.Config.from_dict({"head_sparsity": 0.3}).method_args == {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ff.Config(method="fedavg", method_args={})
        with pytest.raises(AttributeError, match="no attribute 'no_such_field'"):
            ff.Config().no_such_field  # noqa: B018


def test_a_stored_config_of_the_flat_form_loads_without_warnings():
    """A config.json of an earlier version holds every flat setting (most at their defaults)."""
    old = ff.Config(method="fedslm").to_dict()
    del old["method_args"]
    old |= {"tlu_k": None, "afedlf_max_depth": None, "head_sparsity": 0.5, "head_weighting": "confidence",
            "fedadamw_gamma": 0.9, "fedadamw_server_moments": True, "fedact_alpha": 0.9, "fedact_tau_min": 0.1,
            "fedslm_ranks": [4, 8], "fedslm_adapter_rank": 0, "fedsteer_core": None, "fedsteer_lambda": 0.5,
            "fedsteer_select_rounds": 5}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = ff.Config.from_dict(old)
    assert cfg == ff.Config(method="fedslm", method_args={"ranks": (4, 8)})


def _flat_key(flat_changes: dict) -> str:
    """config_key as it was computed when the settings were Config fields: the hash of the non-default fields
    (local_epochs is always among them: None becomes 1 when local_steps is unset)."""
    from fedfrozen import __version__

    payload = json.dumps({"config": {"local_epochs": 1, **flat_changes}, "version": __version__}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def test_cache_keys_are_those_of_the_flat_spelling_so_cached_runs_stay_found():
    key = experiments.config_key
    assert key(ff.Config(method="fedslm", method_args={"ranks": (4, 8)})) == _flat_key(
        {"method": "fedslm", "fedslm_ranks": [4, 8]})
    assert key(ff.Config(method="fedact", method_args={"gamma": 0.5, "alpha": 1})) == _flat_key(
        {"method": "fedact", "fedadamw_gamma": 0.5, "fedact_alpha": 1.0})
    # settings at their defaults, spelled or not, are the same run and the same key
    assert key(ff.Config(method="fedsteer", method_args={"lambda": 0.5})) == key(ff.Config(method="fedsteer"))


def test_replacing_the_method_starts_from_the_new_methods_defaults():
    cfg = ff.Config(method="fedsteer", method_args={"core": 5})
    assert cfg.replace(method="fedavg").method_args == {}
    assert cfg.replace(method="fedtlu", method_args={"k": 2}).method_args == {"k": 2}
    assert cfg.replace(lr=0.1).method_args == {"core": 5}
    with pytest.raises(ValueError, match="method 'fedavg' has no setting"):
        dataclasses.replace(cfg, method="fedavg")  # the dataclass's own replace keeps every field


def test_flags_are_generated_from_the_settings_and_fill_method_args(capsys):
    parser = cli.build_parser()
    run = parser._subparsers._group_actions[0].choices["run"]
    flags = {o for a in run._actions for o in a.option_strings}
    for name in ff.methods.names():
        for spec in ff.methods.settings.spec(ff.methods.settings_class(name)):
            assert "--" + spec["flat"].replace("_", "-") in flags
    titles = [g.title for g in run._action_groups]
    assert "settings of fedsteer (Config.method_args)" in titles
    assert "settings of fedadamw, fedlada, fedact (Config.method_args)" in titles
    args = parser.parse_args(["run", "--method", "fedsteer", "--fedsteer-core", "3", "--fedsteer-lambda", "2"])
    assert cli.config_from_args(args).method_args == {"core": 3, "lambda": 2.0}
    args = parser.parse_args(["run", "--method", "fedadamw", "--no-fedadamw-server-moments"])
    assert cli.config_from_args(args).method_args == {"server_moments": False}
    args = parser.parse_args(["run", "--method", "fedavg", "--fedsteer-core", "3"])
    with pytest.raises(ValueError, match="--fedsteer-core is a setting of fedsteer, not of --method fedavg"):
        cli.config_from_args(args)
    assert cli.main(["methods", "--settings", "fedsteer"]) == 0
    out = capsys.readouterr().out
    assert "--fedsteer-core" in out and "default 0.5" in out and "ridge lambda" in out
    assert cli.main(["methods", "--settings", "fedavg"]) == 0
    assert "no settings of its own" in capsys.readouterr().out


@dataclass(frozen=True)
class _ToySettings(Settings):
    prefix: ClassVar[str] = "toy"
    every: int = setting(2, "freeze the head every this many rounds", lo=1)


class _Toy(ff.methods.Method):
    Settings = _ToySettings

    def frozen_groups(self, r):
        return ("head",) if r % self.settings.every == self.settings.every - 1 else ()


def test_a_plugin_brings_its_own_settings_flags_and_checks():
    ff.methods.register("toy_every", _Toy, summary="head frozen every k-th round")
    try:
        with pytest.raises(ValueError, match=r"method_args\['every'\] of method 'toy_every' must be >= 1"):
            tiny_config(method="toy_every", method_args={"every": 0})
        hist = ff.run(tiny_config(method="toy_every", rounds=3, method_args={"every": 3}), progress=False)
        assert [r["stage"] for r in hist.rows] == [1, 1, 2]
        args = cli.build_parser().parse_args(["run", "--method", "toy_every", "--toy-every", "3"])
        assert cli.config_from_args(args).method_args == {"every": 3}

        @dataclass(frozen=True)
        class Clash(Settings):
            prefix: ClassVar[str] = "fedsteer"
            core: int = setting(1, "another core")

        class Other(ff.methods.Method):
            Settings = Clash

        with pytest.raises(ValueError, match="spells 'fedsteer_core', already a setting of FedSteerSettings"):
            ff.methods.register("clash", Other, summary="x")
    finally:
        ff.methods.unregister("toy_every")
    with pytest.raises(TypeError, match="must subclass"):
        ff.methods.register("bad_settings", ff.methods.Method, summary="x", settings=dict)


_WRONG = {bool: "yes", int: 1.5, float: "x", str: 3, tuple: "x"}


@pytest.mark.parametrize("method, name", [(m, spec["name"]) for m in ff.methods.names()
                                          for spec in ff.methods.settings.spec(ff.methods.settings_class(m))])
def test_every_setting_of_every_method_refuses_a_wrong_type_by_name(method, name):
    """Generated from the settings dataclasses (a new setting is covered too), as Config's fields are."""
    spec = next(s for s in ff.methods.settings.spec(ff.methods.settings_class(method)) if s["name"] == name)
    with pytest.raises(ValueError, match=rf"method_args\['{name}'\] of method '{method}' must be"):
        ff.Config(method=method, method_args={name: _WRONG[spec["type"][0]]})


# --- the components' settings: declared beside the components, taken by Config by flat name -----------------------

COMPONENT_HOMES = {"prox_mu": "fedfrozen.methods.objective", "feddyn_alpha": "fedfrozen.methods.feddyn",
                   "scaffold_variant": "fedfrozen.methods.scaffold", "server_lr": "fedfrozen.methods.fedopt",
                   "server_tau": "fedfrozen.methods.fedopt", "freeze_tau": "fedfrozen.methods.freezing",
                   "freeze_patience": "fedfrozen.methods.freezing", "value_l2": "fedfrozen.methods.base",
                   "participation_skew": "fedfrozen.methods.base", "pretrain_epochs": "fedfrozen.engine.pretrain",
                   "engine_chunk": "fedfrozen.engine.batched"}


def test_component_settings_live_beside_their_components_and_config_stays_small():
    known = ff.methods.component_settings()
    for flat, home in COMPONENT_HOMES.items():
        assert known[flat][0].__module__ == home, flat
    fields = {f.name for f in dataclasses.fields(ff.Config)}
    assert len(fields) <= 48 and not fields & set(known)  # (46: dirichlet_balance; 48: shift, shift_groups, how the
    # data is shown to clients, which no method or component owns)
    assert not set(known) & set(ff.methods.flat_settings())  # one name, one setting


def test_a_component_setting_is_a_keyword_an_attribute_and_only_stored_when_changed():
    cfg = ff.Config(method="fedprox", prox_mu=0.1, server_lr=1)
    assert cfg.prox_mu == 0.1 and cfg.server_lr == 1.0 and cfg.freeze_patience == 3  # a default when not given
    assert cfg.components == {"prox_mu": 0.1, "server_lr": 1.0}
    assert ff.Config(prox_mu=0.01).components == {}  # the default is no change
    again = cfg.replace(prox_mu=0.2)
    assert again.components == {"prox_mu": 0.2, "server_lr": 1.0} and cfg.prox_mu == 0.1
    assert cfg.replace(prox_mu=0.01).components == {"server_lr": 1.0}  # back to the default: no change
    assert cfg.replace(method="fedavg").components == cfg.components  # a component's setting is not the method's
    # one spelling in a file too: to_dict writes the changed ones by name beside the fields, and reads them back
    stored = cfg.to_dict()
    assert stored["prox_mu"] == 0.1 and "components" not in stored and "freeze_patience" not in stored
    assert ff.Config.from_dict(stored) == cfg
    with pytest.raises(ValueError, match=r"components is read only: give a component's setting by its name"):
        ff.Config(components={"prox_mu": 0.1})
    with pytest.raises(ValueError, match=r"components is read only"):
        cfg.replace(components={})
    assert dataclasses.replace(cfg, seed=1).components == cfg.components  # a copy carries them
    cfg.components["prox_mu"] = 9.0  # a copy: the Config does not change
    assert cfg.prox_mu == 0.1
    with pytest.raises(ValueError, match="prox_mu must be >= 0"):
        ff.Config(prox_mu=-1)
    with pytest.raises(ValueError, match=r"no setting\(s\) \[.prox_nu.\] \(prox_nu: did you mean prox_mu\?\)"):
        ff.Config(prox_nu=0.1)
    with pytest.raises(ValueError, match=r"components: no component has the setting\(s\) \['prox_nu'\]"):
        ff.methods.check_components({"prox_nu": 0.1})  # the public validator a Config's names go through


def test_a_stored_config_with_component_settings_as_fields_loads_with_its_key():
    """config.json of a run cached when the component settings were Config fields: read into components, the same
    cache key (a non-default value enters the key by its flat name, as it did)."""
    from fedfrozen.runs.experiments import config_key

    new = ff.Config(method="fedfrozen_plateau", freeze_tau=0.05, pretrain_epochs=2, init="pretrained",
                    train_subset=1000)
    old = new.to_dict()
    old.update({flat: getattr(new, flat) for flat in ff.methods.component_settings()})  # every one, as fields were
    assert ff.Config.from_dict(old) == new and config_key(ff.Config.from_dict(old)) == config_key(new)
    between = {k: v for k, v in new.to_dict().items() if k not in new.components}  # as the last version stored it
    between["components"] = dict(new.components)
    assert ff.Config.from_dict(between) == new
    with pytest.raises(ValueError, match=r"unknown Config field\(s\) \['prox_nu'\]"):
        ff.Config.from_dict({"components": {"prox_nu": 0.1}})
    content = {"config": {"method": "fedfrozen_plateau", "freeze_tau": 0.05, "pretrain_epochs": 2, "init": "pretrained",
                          "train_subset": 1000, "local_epochs": 1}, "version": ff.__version__}  # the changed fields
    import hashlib
    import json
    assert config_key(new) == hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:12]


def test_the_command_line_and_flower_take_component_settings_by_their_flags():
    from fedfrozen import cli
    from fedfrozen.flower import RUN_CONFIG_FIELDS, config_from_run

    args = cli.build_parser().parse_args(["run", "--method", "fedprox", "--prox-mu", "0.3", "--server-lr", "0.5"])
    assert cli.config_from_args(args).components == {"prox_mu": 0.3, "server_lr": 0.5}
    assert RUN_CONFIG_FIELDS["freeze-patience"] == "freeze_patience"
    assert config_from_run({"method": "fedfrozen_plateau", "freeze-patience": 5}).freeze_patience == 5


def test_a_component_must_be_a_settings_class_with_a_prefix_and_new_names():
    from typing import ClassVar

    from fedfrozen.methods.settings import Settings, component, setting

    @dataclasses.dataclass(frozen=True)
    class NoPrefix(Settings):
        x: int = setting(1, "x", lo=0)

    @dataclasses.dataclass(frozen=True)
    class Clash(Settings):
        prefix: ClassVar[str] = "prox"
        mu: float = setting(0.5, "another mu", lo=0)

    with pytest.raises(TypeError, match="must subclass Settings and have a prefix"):
        component(NoPrefix)
    with pytest.raises(ValueError, match=r"\['prox_mu'\] already belong to another component"):
        component(Clash)
    assert ff.methods.component_settings()["prox_mu"][0].__name__ == "ProxSettings"  # nothing registered


def test_a_yaml_file_holds_the_one_spelling_and_an_earlier_ones_is_said(tmp_path):
    """to_dict's form written as YAML reads back through --config with no warning; a file in an earlier version's
    spelling (a components dict, a method's flat name) still reads, and the command line says so once."""
    yaml = pytest.importorskip("yaml")
    cfg = ff.Config(method="fedsteer", method_args={"core": 3}, prox_mu=0.1, n_clients=6)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    assert "prox_mu: 0.1" in path.read_text() and "components" not in path.read_text()
    parser = cli.build_parser()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cli.config_from_args(parser.parse_args(["run", "--config", str(path)])) == cfg
    earlier = tmp_path / "earlier.yaml"
    earlier.write_text("method: fedsteer\nn_clients: 6\nfedsteer_core: 3\ncomponents: {prox_mu: 0.1}\n")
    with pytest.warns(FutureWarning, match="components, fedsteer_core are an earlier version's spelling"):
        assert cli.config_from_args(parser.parse_args(["run", "--config", str(earlier)])) == cfg
