"""The README cannot drift from the code: its code blocks run as written (the quickstart at the smoke profile),
its numbers are the ones the notebooks wrote, and it stays a front page."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CLAIMS = (ROOT / "docs" / "claims.md").read_text()
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.M | re.S)


def blocks(lang: str) -> list[str]:
    return [body for kind, body in BLOCK.findall(README) if kind == lang]


def commands(prefix: str) -> list[str]:
    """The README's shell lines that start with `prefix`, without their trailing comments."""
    out = []
    for body in blocks("bash"):
        for line in body.splitlines():
            line = line.split("  #")[0].strip()
            if line.startswith(prefix):
                out.append(line)
    return out


def scratch_project(tmp_path: Path) -> Path:
    """An empty project folder (its own results/), so a README example does not write into the repository."""
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "pyproject.toml").write_text("")
    return tmp_path


def run(cmd, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    # one torch thread, as the command line uses by default (from Python torch takes every core, which on a
    # shared 2-core CI machine costs more than it gains)
    env = {**os.environ, "FEDFROZEN_PROFILE": "smoke", "FEDFROZEN_PROGRESS": "0", "FEDFROZEN_THREADS": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def stated_range(text: str) -> tuple[float, float]:
    """The accuracy range the README states for an example ("in 0.6-0.9"): a range, never one machine's digits
    (another CPU's float kernels end the same run elsewhere in it; docs/claims.md#reproducing-on-your-machine)."""
    found = re.search(r"in (0\.\d+)-(0\.\d+)", text)
    assert found, "the README states the range an example ends in"
    low, high = map(float, found.groups())
    assert 0.1 < low < high < 1.0 and high - low >= 0.1, "a range wide enough for another CPU, above chance"
    assert not re.search(r"(?:final_test_acc=|# )0\.\d{3}", text[:400]), "no digits of one machine next to it"
    return low, high


def test_the_python_example_runs_as_written(tmp_path):
    (example,) = [b for b in blocks("python") if "import fedfrozen as ff" in b]
    done = run([sys.executable, "-c", example], scratch_project(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "qk" in done.stdout and "test_acc" in done.stdout and "kernel_change" in done.stdout
    assert list((tmp_path / "results").rglob("history.json"))  # run_or_load cached it where it says
    acc = float(re.search(r"final test accuracy (\d\.\d+)", done.stdout).group(1))
    low, high = stated_range(example)
    assert low <= acc <= high, f"the README's Python example should visibly learn: it says {low}-{high}, ended at {acc}"


def test_the_command_line_example_runs_as_written(tmp_path):
    (line,) = [c for c in commands("fedfrozen run ")]
    done = run([sys.executable, "-m", "fedfrozen", *shlex.split(line)[1:]], scratch_project(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    assert "final_test_acc=" in done.stdout and "method=fedfrozen" in done.stdout
    acc = float(re.search(r"final_test_acc=(\d\.\d+)", done.stdout).group(1))
    low, high = stated_range(README[README.index(line):])
    assert low <= acc <= high, f"the README's first run should visibly learn: it says {low}-{high}, ended at {acc}"


def test_the_quickstart_runs_at_the_smoke_profile():
    """Every `fedfrozen reproduce` line of the quickstart, with the cpu profile swapped for smoke and cut to the
    first notebook (the test command itself executes every notebook at smoke)."""
    lines = commands("fedfrozen reproduce")
    assert any("--profile cpu" in c for c in lines) and any("--profile smoke" in c for c in lines)
    shown = set()
    for line in lines:
        args = shlex.split(line.replace("--profile cpu", "--profile smoke"))[1:]
        if "--only" not in args:
            args += ["--only", "00"]
        shown.add(tuple(args))
    for args in sorted(shown):
        done = run([sys.executable, "-m", "fedfrozen", *args], ROOT)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        assert re.search(r"00_quickstart\.ipynb\s+ok", done.stdout), done.stdout[-2000:]
        assert "1 notebooks, 1 ok, 0 failed" in done.stdout


def test_the_test_command_is_the_one_ci_runs():
    (line,) = commands("FEDFROZEN_PROFILE=smoke python -m pytest")
    assert line in (ROOT / ".ci" / "run").read_text()
    assert 'pip install -e ".[dev]"' in README and 'pip install -e ".[dev]"' in (ROOT / ".ci" / "run").read_text()


def verdicts() -> pd.DataFrame:
    """Every verdict of the claim notebooks judged as the README's one family (`fedfrozen report` writes it)."""
    return pd.read_csv(ROOT / "figures" / "readme_verdicts.csv", index_col=0)


def test_every_verdict_the_table_quotes_is_one_the_notebooks_wrote_with_its_family_verdict():
    table = CLAIMS[CLAIMS.index("## The verdicts, row by row"):CLAIMS.index("<!-- verdicts: end -->")]
    quoted = re.findall(r"d = ([+−-]\d\.\d{3}) ± (\d\.\d{3}) \((\d+)\): (lower alone|higher alone|lower|higher|"
                        r"not resolved)", table)
    assert len(quoted) >= 15
    written = {}  # the rows at the digits the README shows (two rows may share them: each is a candidate)
    rows = verdicts()[["d", "half_width", "n", "verdict", "verdict_holm"]]
    for d, h, n, alone, after in rows.itertuples(index=False):
        written.setdefault((f"{d:+.3f}", f"{h:.3f}", str(n)), []).append((alone, after))
    for d, h, n, said in quoted:
        key = (d.replace("−", "-"), h, n)
        assert key in written, f"the verdict table quotes d = {d} ± {h} ({n}), which no verdict table holds"
        if said.endswith(" alone"):  # resolved by the paired rule, not after Holm over the family
            fits = [after == "no difference resolved" and alone == said.split()[0] for alone, after in written[key]]
        else:
            fits = [said == after.replace("no difference resolved", "not resolved") for _, after in written[key]]
        assert any(fits), (d, h, n, said, written[key])


def test_the_readme_family_is_the_notebooks_tables_judged_together():
    """readme_verdicts.csv is the verdict tables of 03-06 (06's drift family, 03 § 3's controls and rates included)
    adjusted as one family, each table also adjusted alone; each hypothesis (the measure and both arms' configs up to
    the seed) counts once, as its row with the most seeds (report.FAMILY)."""
    import fedfrozen as ff
    from fedfrozen.studies import report

    frames = [pd.read_csv(ROOT / "figures" / f"{nb}_verdicts.csv", index_col=0) for nb in report.NOTEBOOKS]
    for f in frames:  # each notebook's table is its own family
        # (the CSV keeps 6 significant digits of d and the half-width: p recomputed from them agrees to 1e-4)
        pd.testing.assert_frame_equal(ff.tables.adjust(f.drop(columns=ff.tables.ADJUSTED_COLUMNS)), f, rtol=1e-4)
    family = verdicts()
    joined = report.verdicts("cpu")
    assert len(family) == joined["hypothesis"].nunique() < len(joined)  # 04's T0 = 25% is 03's comparison: once
    def key(frame):  # a row's identity: its table, grouping, both arms' values and measure (never its label)
        return list(zip(frame["source"], frame["by"], frame["a"], frame["b"], frame["measure"]))

    kept = set(key(family))
    assert len(kept) == len(family)
    for _, same in joined.groupby("hypothesis"):  # the one kept has the most seeds
        mine = same[[k in kept for k in key(same)]]
        assert len(mine) >= 1 and mine["n"].max() == same["n"].max(), key(same)
    hypothesis = dict(zip(key(joined), joined["hypothesis"]))
    rates = joined[joined["source"] == "03_rate_sensitivity"]
    assert len(rates) and set(rates["hypothesis"]) <= {hypothesis[k] for k in kept}  # the rates are in the family
    assert report.family_words(len(family)) in CLAIMS  # the definition and size under the table
    written = {k: r for k, r in zip(key(joined), joined.itertuples(index=False))}
    for k, row in zip(key(family), family.itertuples(index=False)):  # a row some notebook wrote, digit for digit
        assert (written[k].d, written[k].half_width, written[k].n) == (row.d, row.half_width, row.n), k
    again = ff.tables.adjust(family.drop(columns=[*ff.tables.ADJUSTED_COLUMNS, "low", "high", "half_width_holm"]))
    assert list(again["verdict_holm"]) == list(family["verdict_holm"])
    assert again["p_holm"].to_numpy() == pytest.approx(family["p_holm"].to_numpy(), rel=1e-4)


def test_a_run_stored_before_a_field_was_added_is_the_same_hypothesis(tmp_path):
    """A configs file written by an earlier version lacks the fields added since (at their defaults); its run is the
    same hypothesis as a later table's spelling of it, so the family counts it once (notebook 13's AdamW pair is
    notebook 03's Dir 0.1 comparison with more seeds)."""
    import json

    import fedfrozen as ff
    from fedfrozen.studies import report

    full = ff.Config(rounds=4, seed=3).to_dict()
    old = {k: v for k, v in full.items() if k not in ("shift", "shift_groups", "min_samples_by")}
    for name, cfg in (("a", full), ("b", old), ("c", {**full, "seed": 4}), ("d", {**full, "rounds": 5})):
        (tmp_path / f"{name}_configs.jsonl").write_text(json.dumps({"key": name, "experiment": "t", "config": cfg}))
    spelt = {n: report._configs(tmp_path, n)[n] for n in "abcd"}
    assert spelt["a"] == spelt["b"] == spelt["c"] != spelt["d"]  # up to the seed; another rounds is another


def test_the_headline_intervals_agree_with_the_fill():
    """The headline figure draws each interval at its comparison's Holm level: it excludes 0 exactly where the
    family's verdict holds."""
    family = verdicts()
    excludes = (family["d"].abs() > family["half_width_holm"]).tolist()
    assert excludes == family["verdict_holm"].isin(["higher", "lower"]).tolist()
    assert (family["half_width_holm"] >= family["half_width"] - 1e-12).all()  # never narrower than the 95% one


def test_the_readme_is_a_front_page():
    """Read in two minutes: its first 40 lines say what the project is, what it found (a few bullets and the figure)
    and how to run it; the verdict table is in docs/claims.md."""
    first = "\n".join(README.splitlines()[:40])
    assert "arXiv 2605.06446" in first and "figures/headline.png" in first
    found = first[first.index("## What it found"):first.index("## Run it")]
    assert 3 <= len(re.findall(r"^- \*\*", found, re.M)) <= 6
    assert 'pip install -e ".[dev]"' in first and "fedfrozen reproduce --profile smoke" in first
    assert "<!-- verdicts:" not in README and "<!-- verdicts:" in CLAIMS
    assert len(README.splitlines()) <= 120
    for target in re.findall(r"\]\((?!https?://|#)([^)\s]+)\)", README):
        assert (ROOT / target.split("#")[0]).exists(), f"README links to {target}, which does not exist"
    assert "figures/headline.png" in README


def test_the_front_page_figure_is_readable():
    """One marker per verdict-table row that quotes an accuracy comparison (at most ~27), a plot area of at least 40%
    of the figure's width, and a height no more than twice the width: 80 rows of labels squeezed it to a sliver once."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from fedfrozen.studies import report

    family = verdicts()
    fig = report.figure(family)
    try:
        rows = report.figure_rows(family)
        accuracy_rows = [row for row in report.ROWS if any(q.measure in report.ACCURACY for q in row.quotes)]
        assert len(rows) == len(accuracy_rows) <= 27
        width, height = fig.get_size_inches()
        assert height <= 2 * width
        for ax in fig.axes:
            assert ax.get_position().width >= 0.40, "a plot area narrower than 40% of the figure"
    finally:
        plt.close(fig)
