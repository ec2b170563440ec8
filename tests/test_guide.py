"""The user guide: docs/NN_*.py are marimo notebooks, and `python -m torchtpu.tools.guide` exports each
to static HTML (which executes it) plus an index. The guide is built once for this module; every
notebook must have run without a cell raising, the command must exit 0, a notebook with a raising cell
must fail the build naming the cell and its error, and headless Chromium must render the pages with the
outputs the notebooks computed (not only their source code)."""

from __future__ import annotations

import html.parser
import json
import os
import shutil
import subprocess
import sys
import textwrap
import types

import pytest

pytest.importorskip("marimo", reason="marimo is a test dependency: pip install -e '.[test]'")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
NOTEBOOKS = sorted(n for n in os.listdir(DOCS) if n[:2].isdigit() and n.endswith(".py"))
BUILD_TIMEOUT = 1800  # seconds for all notebooks; each takes well under a minute here
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def run_guide(out, *args, timeout=BUILD_TIMEOUT) -> subprocess.CompletedProcess:
    from conftest import skip_if_device_is_exclusive

    skip_if_device_is_exclusive()  # the guide's notebooks run in their own processes
    return subprocess.run([sys.executable, "-m", "torchtpu.tools.guide", "--out", str(out), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def guide(tmp_path_factory):
    """One build of the whole guide (two notebooks at a time), shared by the tests below."""
    out = tmp_path_factory.mktemp("guide")
    proc = run_guide(out, "--jobs", "2")
    manifest = out / "manifest.json"
    entries = json.loads(manifest.read_text()) if manifest.exists() else []
    return types.SimpleNamespace(out=out, proc=proc, entries={e["notebook"]: e for e in entries})


def describe_failure(entry: dict) -> str:
    lines = []
    for error in entry["errors"]:
        if error["downstream"]:
            continue
        lines += [f"cell at {error['where']} raised {error['error']}", textwrap.indent(error["traceback"], "    ")]
    return "\n".join(lines)


@pytest.mark.parametrize("notebook", NOTEBOOKS)
def test_notebook_runs_without_error(guide, notebook):
    entry = guide.entries.get(f"docs/{notebook}")
    assert entry is not None, f"the guide did not build {notebook}:\n{guide.proc.stdout}\n{guide.proc.stderr[-5000:]}"
    assert entry["ok"], f"{notebook}:\n{describe_failure(entry)}"
    assert entry["page"] and (guide.out / entry["page"]).exists()


def test_guide_command_builds_every_page_and_an_index(guide):
    assert guide.proc.returncode == 0, guide.proc.stderr[-5000:]
    index = (guide.out / "index.html").read_text()
    positions = []
    for notebook in NOTEBOOKS:
        entry = guide.entries[f"docs/{notebook}"]
        link = f'href="{entry["page"]}"'
        assert link in index and entry["title"] in index, (notebook, entry["title"])
        positions.append(index.index(link))
    assert positions == sorted(positions), "the index lists the notebooks in order"
    # the pages load marimo's frontend from the copy next to them, not from a CDN
    assert (guide.out / "_marimo" / "assets").is_dir()
    page = (guide.out / guide.entries[f"docs/{NOTEBOOKS[0]}"]["page"]).read_text()
    assert "_marimo/assets/" in page and "cdn.jsdelivr.net/npm/@marimo-team/frontend" not in page


BROKEN = '''
import marimo

app = marimo.App(app_title="Broken")


@app.cell
def _():
    value = 41
    return (value,)


@app.cell
def _(value):
    if value + 1 == 42:
        raise ValueError("the guide must report this")
    return


@app.cell
def _(value):
    print("an independent cell still runs", value)
    return


if __name__ == "__main__":
    app.run()
'''


def test_a_raising_cell_fails_the_build_naming_the_notebook_cell_and_error(tmp_path):
    notebook = tmp_path / "broken.py"
    notebook.write_text(BROKEN)
    proc = run_guide(tmp_path / "out", str(notebook), timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = BROKEN.splitlines().index("def _(value):") + 1  # the raising cell's def, 1-based
    assert "broken.py" in proc.stderr
    assert f"broken.py:{line}" in proc.stderr, proc.stderr
    assert "ValueError: the guide must report this" in proc.stderr, proc.stderr
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [e["ok"] for e in manifest] == [False]
    assert "failed" in (tmp_path / "out" / "index.html").read_text()  # the index says so too


class RenderedOutputs(html.parser.HTMLParser):
    """The text inside marimo's rendered cell outputs and console areas (not the code editors)."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self):
        super().__init__()
        self.outputs: list[str] = []
        self._parts: list[str] | None = None
        self._depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.VOID:
            return
        attrs = dict(attrs)
        if self._parts is None and (attrs.get("data-cell-role") == "output"
                                    or "console-output-area" in (attrs.get("class") or "")):
            self._parts, self._depth = [], 0
        if self._parts is not None:
            self._depth += 1

    def handle_endtag(self, tag):
        if self._parts is None or tag in self.VOID:
            return
        self._depth -= 1
        if self._depth == 0:
            self.outputs.append("".join(self._parts))
            self._parts = None

    def handle_data(self, data):
        if self._parts is not None:
            self._parts.append(data)


def chromium_dom(path, tmp_path) -> str:
    """The DOM after headless Chromium loaded `path` and ran its scripts."""
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--allow-file-access-from-files",
         f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=30000", "--dump-dom",
         f"file://{path}"],
        capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (Debian: apt-get install chromium)")
def test_headless_chromium_renders_the_computed_outputs(guide, tmp_path):
    index = guide.out / "index.html"
    dom = chromium_dom(index, tmp_path)
    for notebook in NOTEBOOKS:
        entry = guide.entries.get(f"docs/{notebook}")
        if entry and entry["page"]:
            assert f'href="{entry["page"]}"' in dom, notebook

    quickstart = guide.out / guide.entries["docs/01_quickstart.py"]["page"]
    parser = RenderedOutputs()
    parser.feed(chromium_dom(quickstart, tmp_path))
    rendered = "\n".join(parser.outputs)
    assert len(parser.outputs) >= 10, f"marimo rendered {len(parser.outputs)} output areas:\n{rendered[:3000]}"
    # a tensor's repr that a cell returned, a line a cell printed, and markdown a cell built from values
    assert "device='tpu:0'" in rendered, rendered[:3000]
    assert "tpu equals cpu: True" in rendered, rendered[:3000]
    assert "torch.allclose says True" in " ".join(rendered.split()), rendered[:3000]

    cache = guide.out / guide.entries["docs/04_compile_cache.py"]["page"]
    parser = RenderedOutputs()
    parser.feed(chromium_dom(cache, tmp_path))
    rendered = " ".join(" ".join(parser.outputs).split())
    assert "2nd, same cache" in rendered and "A second process compiles nothing" in rendered, rendered[:3000]
