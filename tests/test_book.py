"""The book (mkdocs.yml): it builds in strict mode from the committed notebooks and docs/, every internal link and
anchor of every built page resolves, a broken link fails the build, and in a real browser the front page shows
the headline figure and the results table and a notebook page shows its figures and tables.

Needs the `docs` extra (`pip install -e ".[docs]"`); the browser test also needs Chromium (Debian's `chromium`,
which `.ci/run` installs) and Playwright. Each is skipped with its reason where missing. Screenshots go to
artifacts/browser/ (CI keeps them).
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
ARTIFACTS = Path(os.environ.get("FEDFROZEN_ARTIFACTS", ROOT / "artifacts")) / "browser"

for module in ("mkdocs", "material", "mkdocs_jupyter", "mkdocstrings"):
    pytest.importorskip(module, reason=f"the book needs the docs extra ({module}): pip install -e '.[docs]'")


def build(config_dir: Path, out: Path) -> subprocess.CompletedProcess:
    """`mkdocs build --strict` of the book at `config_dir` into `out` (never with -q: mkdocs 1.6 then drops the
    warnings before strict mode counts them, and a broken link builds)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
                          cwd=config_dir, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("book") / "site"
    done = build(ROOT, out)
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


class _Page(HTMLParser):
    """The ids of a page and the links (href/src) it makes."""

    def __init__(self):
        super().__init__()
        self.ids, self.links = set(), []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("name"):
            self.ids.add(a["name"])
        for key in ("href", "src"):
            if a.get(key) and not (tag == "link" and a.get("rel") in ("preconnect", "dns-prefetch")):
                self.links.append(a[key])


@functools.lru_cache(maxsize=None)
def _parse(path: Path) -> _Page:
    page = _Page()
    page.feed(path.read_text(errors="replace"))
    return page


def _target(site: Path, page: Path, link: str) -> tuple[Path | None, str]:
    """The file an internal link of `page` points at (None for an external one) and its fragment."""
    parts = urlsplit(link)
    if parts.scheme or parts.netloc or link.startswith(("mailto:", "data:", "javascript:")):
        return None, ""
    if not parts.path:
        return page, unquote(parts.fragment)
    base = site if parts.path.startswith("/") else page.parent
    target = (base / unquote(parts.path).lstrip("/")).resolve()
    if target.is_dir() or parts.path.endswith("/"):
        target = target / "index.html"
    return target, unquote(parts.fragment)


def broken_links(site: Path) -> list[str]:
    """Every internal link or anchor of the built site that does not resolve, as 'page: link (why)'."""
    bad = []
    for page in sorted(site.rglob("*.html")):
        for link in _parse(page).links:
            target, fragment = _target(site, page, link)
            if target is None:
                continue
            if not target.exists():
                bad.append(f"{page.relative_to(site)}: {link} (no such file)")
            elif fragment and target.suffix == ".html" and fragment not in _parse(target).ids:
                bad.append(f"{page.relative_to(site)}: {link} (no anchor #{fragment})")
    return bad


def test_the_book_has_every_notebook_doc_and_api_page_and_a_search_index(site):
    for stem in NOTEBOOKS:
        page = site / "notebooks" / stem / "index.html"
        assert page.exists(), f"no page for notebook {stem}"
        html = page.read_text()
        assert "colab.research.google.com" in html  # its Colab badge
        assert "jp-OutputArea" in html or "output_area" in html  # rendered with its committed outputs
    for doc in ("methods", "cpu_profile", "paper_profile", "engines", "reliability", "flower", "related",
                "development", "attention_layouts", "api", "api/runs", "api/methods", "api/results"):
        assert (site / doc / "index.html").exists(), f"no page {doc}"
    api = (site / "api" / "runs" / "index.html").read_text()
    assert "run_or_load" in api and "Config" in api  # generated from the docstrings
    index = (site / "search" / "search_index.json").read_text()
    assert "paired" in index and "FedFrozen" in index
    front = (site / "index.html").read_text()
    assert "figures/headline.png" in front and "What it found" in front  # the README is the front page


def test_every_internal_link_and_anchor_resolves(site):
    assert broken_links(site) == []


def test_the_link_check_finds_a_missing_page_and_a_missing_anchor(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "index.html").write_text('<a href="a/">ok</a><a href="b/">gone</a><a href="#top">x</a>'
                                         '<img src="https://example.org/x.png"><h1 id="top">t</h1>')
    (tmp_path / "a" / "index.html").write_text('<a href="../#nowhere">x</a><a href="../index.html#top">y</a>')
    assert broken_links(tmp_path) == ["a/index.html: ../#nowhere (no anchor #nowhere)", "index.html: b/ (no such file)"]


def test_a_broken_link_fails_the_strict_build(tmp_path):
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "docs", copy / "docs", symlinks=False)  # notebooks/ and figures/ copied in
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy(ROOT / name, copy / name)
    (copy / "tools").mkdir()
    shutil.copy(ROOT / "tools" / "book_hooks.py", copy / "tools" / "book_hooks.py")
    with open(copy / "docs" / "engines.md", "a") as f:
        f.write("\nSee [the missing page](no_such_page.md).\n")
    done = build(copy, tmp_path / "site")
    assert done.returncode != 0
    assert "no_such_page.md" in done.stdout + done.stderr


def _chromium() -> str | None:
    return next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)


@pytest.fixture(scope="module")
def browser_page(site):
    playwright = pytest.importorskip("playwright.sync_api", reason="the browser test needs Playwright (docs extra)")
    exe = _chromium()
    if exe is None:
        pytest.skip("no Chromium installed (apt-get install chromium; .ci/run installs it)")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)  # a port of its own
    threading.Thread(target=server.serve_forever, daemon=True).start()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.route("**/*", lambda route: route.abort() if not route.request.url.startswith(
            f"http://127.0.0.1:{server.server_port}/") else route.continue_())  # offline: nothing from outside
        yield page, f"http://127.0.0.1:{server.server_port}"
        browser.close()
    server.shutdown()


RENDERED_IMAGE = """sel => [...document.querySelectorAll(sel)].map(i => [i.complete && i.naturalWidth,
                                                                  i.getBoundingClientRect().width])"""
TABLE_ROWS = """needle => [...document.querySelectorAll('table')].filter(t => t.innerText.includes(needle))
                   .map(t => [t.rows.length, t.getBoundingClientRect().height])"""


def test_the_front_page_shows_the_headline_figure_and_the_claims_and_the_verdict_table_its_rows(browser_page):
    page, base = browser_page
    page.goto(base + "/", wait_until="load")
    images = page.evaluate(RENDERED_IMAGE, 'img[src*="headline"]')
    assert images and all(natural > 0 and width > 400 for natural, width in images), images  # decoded, laid out
    tables = page.evaluate(TABLE_ROWS, "reproduced in")
    assert tables and tables[0][0] >= 5 and tables[0][1] > 80, tables  # the claims table: a header and four claims
    page.screenshot(path=str(ARTIFACTS / "front_page.png"), full_page=True)
    page.goto(base + "/claims/", wait_until="load")
    tables = page.evaluate(TABLE_ROWS, "d ± 95% (n)")
    assert tables and tables[0][0] >= 20 and tables[0][1] > 300, tables  # the verdict table, row by row


def test_a_notebook_page_shows_its_figures_and_tables(browser_page):
    page, base = browser_page
    page.goto(base + "/notebooks/03_main_results/", wait_until="load")
    images = page.evaluate(RENDERED_IMAGE, "img")
    assert sum(1 for natural, width in images if natural > 200 and width > 300) >= 1, images  # the bar chart
    tables = page.evaluate(TABLE_ROWS, "fedfrozen")
    assert tables and max(rows for rows, _ in tables) >= 3 and max(h for _, h in tables) > 50, tables
    assert "Open In Colab" in page.content()
    page.screenshot(path=str(ARTIFACTS / "notebook_03.png"), full_page=True)
