"""Prose no stronger than its rows: every d ± half-width (n), p-value, "Holm over N", "detects x" and "no gain above x
points" that the README, docs/claims.md or a notebook's markdown quotes is a number of a committed verdict table it
can cite (at the digits it shows). A number that drifts from its row, or one from a table no longer committed (an
earlier measure's), fails here. The README's verdict table is also rendered from its family and compared whole."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "figures"
sys.path.insert(0, str(ROOT / "tools"))

D = re.compile(r"(?<![\w.])([+−-]\d+\.\d+) ± (\d+\.\d+)(?: \((\d+)\))?")
P = re.compile(r"\bp(?:_holm)? = (\d\.\d+)")
HOLM = re.compile(r"Holm over (?:all |the [\w']+ |this table's |its |the notebook's |the table's )?(\d+)")
DETECTS = re.compile(r"detects (\d+(?:\.\d+)?)(?:[–-](\d+(?:\.\d+)?))?(%)?")
BOUND = re.compile(r"no (gain|cut) above (\d+\.\d+)( points|%)?")  # %: of the reference arm's mean (V's dispersion)


def tables(*names) -> list:
    return [pd.read_csv(p, index_col=0) for n in names for p in sorted(FIGURES.glob(f"{n}*verdicts.csv"))]


def family() -> pd.DataFrame:
    return pd.read_csv(FIGURES / "readme_verdicts.csv", index_col=0)


def markdown(nb: str) -> str:
    (path,) = (ROOT / "notebooks").glob(f"{nb}_*.ipynb")
    cells = json.loads(path.read_text())["cells"]
    return "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")


def _shown(value: float, text: str) -> bool:
    """Whether `value` prints as `text` at its digits (up to a tie: the tables keep 6 significant digits)."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    quoted = float(text.lstrip("+−-"))
    return math.isfinite(value) and abs(abs(value) - quoted) <= 0.5 * 10 ** -decimals * (1 + 1e-4)


def problems(text: str, rows: pd.DataFrame) -> list[str]:
    """Every quoted number of `text` that no row of `rows` (verdict tables) holds at the digits shown."""
    out = []
    signed = list(zip(rows["d"], rows["half_width"], rows["n"]))
    for m in D.finditer(text):
        d, h, n = m.group(1).replace("−", "-"), m.group(2), m.group(3)
        # the same digits and sign ("−0.000" quotes a d that rounds to zero from either side)
        if not any(_shown(rd, d) and (float(d) == 0 or (rd > 0) == (d[0] == "+")) and _shown(rh, h)
                   and (n is None or int(n) == rn) for rd, rh, rn in signed):
            out.append(f"d {m.group(0)!r}")
    ps = [*rows["p"], *rows["p_holm"]]
    for m in P.finditer(text):
        if not any(_shown(p, m.group(1)) for p in ps):
            out.append(f"p {m.group(0)!r}")
    relative = 100 / rows["mean_b"].abs()  # a percent of the reference arm's mean
    for m in DETECTS.finditer(text):
        percent = m.group(3)
        for q in (g for g in m.groups()[:2] if g):
            found = (any(_shown(v * k, q) for v, k in zip(rows["detectable"], relative)) if percent else
                     any(_shown(100 * v, q) or _shown(v, q) for v in rows["detectable"]))
            if not found:
                out.append(f"detects {q!r} in {m.group(0)!r}")
    for m in BOUND.finditer(text):
        kind, value, unit = m.groups()
        ends = rows["d"] + rows["half_width"] if kind == "gain" else rows["half_width"] - rows["d"]
        scales = relative if unit == "%" else [100 if unit else 1] * len(rows)
        if not any(_shown(k * e, value) for e, k in zip(ends, scales)):
            out.append(f"bound {m.group(0)!r}")
    return out


CLAIM_LEAD = re.compile(r"^\*\*(C[1-4])\b|^\| (C[1-4])\b")  # a paragraph (or a README row) about one claim
SIZES = re.compile(r"(?:Holm over (?:all |the [\w']+ |this table's |its |the notebook's |the table's "
                   r"|notebook \d\d's )?|among the |family of |the README's |within notebook \d\d's "
                   r"|Holm-adjusted p over |table of )(\d+)\b")


def _sentences(paragraph: str) -> list[str]:
    """A paragraph's sentences (a full stop or a semicolon followed by a space ends one; "vs." and decimals do not)."""
    return [s for s in re.split(r"(?<=[.;])\s+(?=[A-Z*(])", paragraph) if s.strip()]


def bound_problems(text: str, tables: list[pd.DataFrame]) -> list[str]:
    """Every quoted d ± half-width (n) bound to the rows its context names, not just to some committed row:
    - its claim: in a paragraph that opens with **Cn (or a README table row of claim Cn), a row of claim Cn or of a
      claim its sentence names ("notebook 03's C1 comparison");
    - its family: in a sentence that names family sizes ("Holm over 26", "among the 100", "family of 12", "the
      README's 100"), a row of a table of one of those sizes (a verdict table is its own family; the README's family
      is readme_verdicts.csv).
    So a number quoted under the wrong claim or the wrong family fails, even when another row happens to hold it."""
    out = []
    sizes_of = [(len(t), t) for t in tables]
    for paragraph in re.split(r"\n\s*\n|\n(?=\| )", text):
        lead = CLAIM_LEAD.match(paragraph.strip())
        claim = (lead.group(1) or lead.group(2)) if lead else None
        for sentence in _sentences(paragraph):
            named = {int(n) for n in SIZES.findall(sentence)}
            claims = None if claim is None else {claim, *re.findall(r"\b(C[1-4])\b", sentence)}
            for m in D.finditer(sentence):
                d, h, n = m.group(1).replace("−", "-"), m.group(2), m.group(3)
                fits = []
                for size, t in sizes_of:
                    if named and size not in named:
                        continue
                    rows = t if claims is None else t[t["claim"].isin(claims)]
                    fits += [1 for rd, rh, rn in zip(rows["d"], rows["half_width"], rows["n"])
                             if _shown(rd, d) and (float(d) == 0 or (rd > 0) == (d[0] == "+")) and _shown(rh, h)
                             and (n is None or int(n) == rn)]
                if not fits:
                    where = f"claim {claim}" if claim else "any claim"
                    where += f", family {sorted(named)}" if named else ""
                    out.append(f"{m.group(0)!r} under {where}: {sentence[:90]!r}")
    return out


def family_sizes(*frames) -> set:
    return {len(f) for f in frames}


def holm_problems(text: str, sizes: set) -> list[str]:
    return [f"{m.group(0)!r} (families: {sorted(sizes)})" for m in HOLM.finditer(text) if int(m.group(1)) not in sizes]


# each notebook's markdown may quote its own tables and the README's family; 04 and 06 also quote 03's rows they share
CITES = {"03": ["03"], "04": ["04", "03"], "05": ["05"], "06": ["06", "03"], "09": ["09"], "10": ["10"], "11": ["11"],
         "12": ["12"], "13": ["13"], "14": ["14"],
         "02": ["02"]}


@pytest.mark.parametrize("nb", sorted(CITES))
def test_a_notebook_quotes_only_its_committed_rows(nb):
    own = tables(*CITES[nb])
    rows = pd.concat([*own, family()], ignore_index=True)
    text = markdown(nb)
    found = problems(text, rows) + holm_problems(text, family_sizes(*own, family()))
    assert not found, f"notebook {nb}'s markdown quotes numbers no committed row holds: {found}"


@pytest.mark.parametrize("doc", ["README.md", "docs/claims.md"])
def test_the_front_page_and_the_claims_quote_only_committed_rows(doc):
    every = tables("0", "1", "fedavg_level")
    rows = pd.concat([family(), *every], ignore_index=True)
    text = (ROOT / doc).read_text()
    if "## Reproducing on your machine" in text:  # its verify transcript quotes digits retrained on one machine
        start, end = text.index("## Reproducing on your machine"), text.index("## What the committed tables")
        text = text[:start] + text[end:]
    found = problems(text, rows) + holm_problems(text, family_sizes(family(), *every))
    assert not found, f"{doc} quotes numbers no committed row holds: {found}"


@pytest.mark.parametrize("doc", ["README.md", "docs/claims.md"])
def test_the_documents_blocks_are_rendered_from_the_family(doc):
    from fedfrozen.studies import report

    text = (ROOT / doc).read_text()
    assert report.render(text, family(), doc) == text, "run fedfrozen report"


def test_the_checker_catches_a_drifted_number():
    rows = family()
    r = rows.iloc[0]
    good = f"d = {r.d:+.3f} ± {r.half_width:.3f} ({int(r.n)})".replace("-", "−")
    assert problems(good, rows) == []
    assert problems(good.replace(f"({int(r.n)})", f"({int(r.n) + 1})"), rows)  # the seeds it rests on
    drifted = f"d = {r.d + 0.321:+.3f} ± {r.half_width:.3f}"  # no row of the family has it
    assert problems(drifted, rows)
    assert problems("detects 97.3 points", rows) and problems("p = 0.987654", rows)
    assert problems("no gain above 7.77 points", rows) and not problems("no gain above 0.53 points", rows)
    assert holm_problems("Holm over 7", {61}) and not holm_problems("Holm over 61", {61})


def test_the_verdict_table_states_the_size_of_its_family():
    stated = re.search(r"The family: .*?: (\d+) comparisons, Holm", (ROOT / "docs" / "claims.md").read_text())
    assert stated and int(stated.group(1)) == len(family())


@pytest.mark.parametrize("doc", ["README.md", "docs/claims.md", *[f"notebook {nb}" for nb in sorted(CITES)]])
def test_every_quoted_number_is_its_claims_and_its_familys(doc):
    """Each d ± half-width (n) is a row of the claim its paragraph is about and of the family its sentence names."""
    if doc.startswith("notebook"):
        nb = doc.split()[1]
        text, rows = markdown(nb), [*tables(*CITES[nb]), family()]
    else:
        text, rows = (ROOT / doc).read_text(), [family(), *tables("0", "1", "fedavg_level")]
        if "## Reproducing on your machine" in text:
            start, end = text.index("## Reproducing on your machine"), text.index("## What the committed tables")
            text = text[:start] + text[end:]
    found = bound_problems(text, rows)
    assert not found, f"{doc} quotes numbers away from the row its context names: {found}"


def test_the_binding_catches_a_number_under_the_wrong_claim_or_family():
    rows = family()
    c1 = rows[rows["claim"] == "C1"].iloc[0]
    quoted = f"d = {c1.d:+.3f} ± {c1.half_width:.3f} ({int(c1.n)})".replace("-", "−")
    assert bound_problems(f"**C1.** FedFrozen {quoted}.", [rows]) == []
    assert bound_problems(f"**C3.** The penalty {quoted}.", [rows])  # another claim's row
    assert bound_problems(f"**C3.** The penalty, as C1's row, {quoted}.", [rows]) == []  # named: allowed
    assert bound_problems(f"FedFrozen {quoted}, after Holm over {len(rows)}.", [rows]) == []
    assert bound_problems(f"FedFrozen {quoted}, after Holm over {len(rows) + 7}.", [rows])  # the wrong family
