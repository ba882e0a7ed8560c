"""Seeds by name: one tag per kind of random choice (fedfrozen.base.rng.PURPOSES)."""

import ast
from pathlib import Path

import numpy as np
import pytest
from conftest import tiny_config

from fedfrozen import experiments, rng
from fedfrozen.methods import afedlf, registry

PKG = Path(rng.__file__).parent


def test_every_purpose_has_its_own_tag():
    assert len(set(rng.PURPOSES.values())) == len(rng.PURPOSES)


def test_seed_for_is_the_position_with_the_purposes_tag():
    assert rng.seed_for("sampling", 3, 7) == rng.derive_seed(3, 7, 104)
    assert rng.seed_for("local_batches", 0, 2, 1) == rng.derive_seed(0, 2, 1, 105)
    assert rng.seed_for("participation", 5) != rng.seed_for("afedlf_devices", 5)
    with pytest.raises(ValueError, match="purpose must be one of"):
        rng.seed_for("sampleing", 0)


def test_no_bare_tag_is_passed_to_derive_seed_in_the_package():
    """Every seed of a run comes from seed_for (derive_seed is called in rng.py only)."""
    calls = []
    for path in PKG.rglob("*.py"):
        if path.name == "rng.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            called = getattr(node.func, "id", getattr(node.func, "attr", None)) if isinstance(node, ast.Call) else None
            if called == "derive_seed":
                calls.append(f"{path.relative_to(PKG)}:{node.lineno}")
    assert calls == []


def test_afedlf_device_profiles_do_not_share_the_participation_stream():
    """Under skewed participation the likelier half of the clients is drawn from tag 107; AFedLF's device speeds
    once came from the same stream (tag 107 too), tying speed to participation. Now they are independent draws."""
    cfg = tiny_config(method="afedlf", n_clients=8, participation="skewed", participation_rate=0.5,
                      clients_per_round=None)
    speed, _ = afedlf.device_profiles(cfg)
    shared = np.random.default_rng(rng.derive_seed(cfg.seed, 107)).lognormal(0.0, 0.5, cfg.n_clients)
    assert not np.allclose(speed, shared)
    assert np.allclose(speed, np.random.default_rng(rng.seed_for("afedlf_devices", cfg.seed)).lognormal(0.0, 0.5, 8))


def test_a_methods_results_revision_is_in_its_cache_key_only():
    """AFedLF's fix changed its results: its key carries the revision (old Histories are not served); the keys of
    methods without one are what they were (the payload without a revision field)."""
    import hashlib
    import json

    from fedfrozen import __version__

    assert registry.results_revision("afedlf") == 1 and registry.results_revision("fedavg") == 0
    for method, same in (("fedavg", True), ("afedlf", False)):
        cfg = tiny_config(method=method)
        defaults = experiments._defaults(type(cfg))
        changed = {k: v for k, v in cfg.to_dict().items() if k not in defaults or defaults[k] != v}
        old = hashlib.sha256(json.dumps({"config": changed, "version": __version__}, sort_keys=True).encode())
        assert (experiments.config_key(cfg) == old.hexdigest()[:12]) == same
