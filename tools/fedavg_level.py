"""FedAvg's level against a plain FedAvg (docs/claims.md, "FedAvg's level"), from its committed per-seed rows.

    python tools/fedavg_level.py      # reads figures/fedavg_level_runs.csv; prints the table of docs/claims.md
                                      # and writes figures/fedavg_level_verdicts.csv (the plain draw's C1 pair)

The rows come from `tools/reference_fedavg.py` (a FedAvg in torch and timm alone, with switches that add the
project's choices one at a time), `tools/export_split.py` (fedfrozen's clients and initial weights for it to train
on) and `fedfrozen run`; each row names its command.
"""

from __future__ import annotations

import sys

import pandas as pd

from fedfrozen import plots, verdicts

PER_SEED = plots.project_root() / "figures" / "fedavg_level_runs.csv"


def summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Per arm (in file order): n, mean and sd over seeds of late accuracy and of the three-evaluation window."""
    return rows.groupby("arm", sort=False).agg(n=("seed", "size"), late_acc=("late_acc", "mean"),
                                               sd=("late_acc", "std"), late3=("late3", "mean"),
                                               sd3=("late3", "std"))


def plain_draw_verdict(rows: pd.DataFrame) -> pd.DataFrame:
    """FedFrozen (T0 = 25%) − FedAvg on the plain Dirichlet draw, paired by seed: its own family of one."""
    arm = {name: rows[rows["arm"] == name].set_index("seed")["late_acc"] for name in ("fffedfrozen", "fffedavg")}
    seeds = sorted(set(arm["fffedfrozen"].index) & set(arm["fffedavg"].index))
    c = verdicts.compare_runs(arm["fffedfrozen"][seeds].to_numpy(), arm["fffedavg"][seeds].to_numpy())
    return verdicts.verdict_table([("C1", "FedFrozen − FedAvg, dirichlet:0.1 unbalanced (dirichlet_balance=False)", c)])


def main() -> int:
    rows = pd.read_csv(PER_SEED)
    print(summary(rows).round(4).to_string())
    table = plain_draw_verdict(rows)
    print(table[["comparison", "d", "half_width", "n", "verdict_holm"]].to_string())
    print("wrote", plots.save_table(table, "fedavg_level_verdicts", "cpu"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
