"""The full Config of every committed run: figures/NN_configs.jsonl beside each figures/NN_per_seed.csv.

    python tools/configs.py            # every notebook with a per-seed table (about 10 min on 2 cores)
    python tools/configs.py 04 05      # only these
    python tools/configs.py --columns  # add the setting columns a per-seed table lacks, from its configs

A notebook writes its configs itself when it runs (`ff.plots.save_configs`); this rebuilds them without the
results cache, for per-seed tables committed before notebooks did: it executes the notebooks under the cpu profile
as a tiny dry run (`fedfrozen.runs.dryrun`: every run cut to two rounds on a tiny model, one seed, in a temporary
project), which logs the full config and the cache key of every run a notebook asks for, and keeps the configs
whose keys are rows of the per-seed table. It fails, writing nothing for that notebook, when a committed row's key
is one the notebook no longer asks for (the code and the table disagree) or a config does not hash to its key.
Two choices of notebook 10 depend on what the dry run cannot reproduce (the AdamW variant composed with the freeze
is the family's best by accuracy; FedSLM's ranks follow the model's width): its rows are found among the logged
configs with those settings changed (VARIANTS), each accepted only when it hashes to the committed key.
Tables without a `machine` column gain one, "unrecorded" (rows computed before runs recorded their machine), and
tables without a setting of `ff.tables.SETTINGS` gain it from each row's config (`--columns`: only that, from the
committed configs, no dry run).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


VARIANTS = {"10": [{"freeze_schedule": "warmup"},
                   *({"method_args": {"ranks": ranks}} for ranks in ((4,), (8,), (16,), (4, 8, 16)))]}


def _variant(key: str, number: str, configs: dict):
    """(experiment, config) of a committed key found as a logged config with one of VARIANTS[number] applied."""
    import fedfrozen as ff

    for experiment, config in list(configs.values()):
        for change in VARIANTS.get(number, []):
            try:
                cfg = ff.Config.from_dict(config).replace(**change)
            except (TypeError, ValueError):
                continue
            if ff.experiments.config_key(cfg) == key:
                return experiment, cfg.to_dict()
    return None


def logged_configs(numbers: list[str]) -> dict:
    """{cache key: (experiment, config dict)} of every run the notebooks numbered `numbers` ask for under cpu."""
    from fedfrozen.runs.dryrun import dry_run

    with tempfile.TemporaryDirectory(prefix="fedfrozen-configs-") as tmp:
        rows = dry_run("cpu", tiny=True, rounds=2, only=",".join(numbers), keep=tmp, progress=print)
        failed = [r["notebook"] for r in rows if r["status"] != "ok"]
        if failed:
            print(f"executions that failed (their configs up to the failure are kept): {failed}")
        out = {}
        for log in sorted(Path(tmp).glob("dry_run_*.jsonl")):
            for line in log.read_text().splitlines():
                r = json.loads(line)
                out.setdefault(r["key"], (r["experiment"], r["config"]))
    return out


def write(number: str, configs: dict) -> bool:
    import pandas as pd

    import fedfrozen as ff

    (table,) = (ROOT / "figures").glob(f"{number}_per_seed.csv")
    runs = pd.read_csv(table, index_col=0)
    keys = list(dict.fromkeys(runs["key"]))
    configs = dict(configs)
    for key in [k for k in keys if k not in configs]:
        found = _variant(key, number, configs)
        if found is not None:
            configs[key] = found
    missing = [k for k in keys if k not in configs]
    if missing:
        print(f"{number}: {len(missing)} of {len(keys)} committed keys are not asked for by the notebook "
              f"(e.g. {missing[:3]}): nothing written")
        return False
    lines = []
    for key in keys:
        experiment, config = configs[key]
        cfg = ff.Config.from_dict(config)
        assert ff.experiments.config_key(cfg) == key, f"{number}: config of {key} hashes to another key"
        lines.append(json.dumps({"key": key, "experiment": experiment, "config": cfg.to_dict()}, sort_keys=True))
    path = ROOT / "figures" / f"{number}_configs.jsonl"
    ff.io.atomic_write(path, lambda tmp: Path(tmp).write_text("\n".join(lines) + "\n"))
    if "machine" not in runs.columns:
        runs.insert(list(runs.columns).index("seed") + 1, "machine", ff.tables.UNRECORDED)
        ff.io.atomic_write(table, lambda tmp: runs.to_csv(tmp, float_format=ff.plots.PRECISE_FLOAT_FORMAT))
    print(f"{number}: {len(lines)} configs -> {path.relative_to(ROOT)}")
    return True


def add_settings(number: str) -> None:
    """Give NN_per_seed.csv every column of ff.tables.SETTINGS it lacks, from NN_configs.jsonl (rows keep their
    order and every other digit)."""
    import pandas as pd

    import fedfrozen as ff

    table = ROOT / "figures" / f"{number}_per_seed.csv"
    runs = pd.read_csv(table, index_col=0)
    lines = [json.loads(x) for x in (ROOT / "figures" / f"{number}_configs.jsonl").read_text().splitlines() if x]
    settings = {e["key"]: ff.tables.settings_of(ff.Config.from_dict(e["config"])) for e in lines}
    added = []
    for position, name in enumerate(ff.tables.SETTINGS):
        if name not in runs.columns:
            after = list(runs.columns).index(ff.tables.SETTINGS[position - 1]) + 1 if position else 1
            runs.insert(after, name, [settings[k][name] for k in runs["key"]])
            added.append(name)
    if added:
        ff.io.atomic_write(table, lambda tmp: runs.to_csv(tmp, float_format=ff.plots.PRECISE_FLOAT_FORMAT))
    print(f"{number}: added {', '.join(added) or 'nothing'}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["--columns"]:
        for n in argv[1:] or sorted(p.name[:2] for p in (ROOT / "figures").glob("[0-9][0-9]_configs.jsonl")):
            add_settings(n)
        return 0
    numbers = argv or sorted(p.name[:2] for p in (ROOT / "figures").glob("[0-9][0-9]_per_seed.csv"))
    configs = logged_configs(numbers)
    ok = [write(n, configs) for n in numbers]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
