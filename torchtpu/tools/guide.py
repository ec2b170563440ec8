"""Builds the user guide: the marimo notebooks in docs/ executed and exported to static HTML, plus an index.

    python -m torchtpu.tools.guide                        # every docs/NN_*.py -> build/guide/index.html
    python -m torchtpu.tools.guide --out DIR              # somewhere else
    python -m torchtpu.tools.guide docs/04_compile_cache.py   # only these notebooks
    python -m torchtpu.tools.guide --serve                # build, then serve it on http://127.0.0.1:8000
    python -m torchtpu.tools.guide --serve --no-build     # serve what was built before

Each notebook runs through `marimo export html` (which executes every cell, so the pages hold the outputs
this machine computed). A notebook with a cell that raises fails the build: the other notebooks are still
built, then the command exits 1 naming each failed notebook, its cell (file:line) and the error.

The pages load marimo's frontend from a copy of the installed marimo's own assets (DIR/_marimo), so the
guide works offline and matches the marimo that built it. Browsers differ on module scripts from file://
URLs: Firefox opens the pages from disk, Chromium-based browsers need them served (`--serve`) or
`--cdn`, which keeps marimo's links to its CDN instead of copying the assets.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import functools
import html
import http.server
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DOCS = os.path.join(REPO, "docs")
DEFAULT_OUT = os.path.join(REPO, "build", "guide")
ASSETS = "_marimo"  # where the frontend is copied, relative to the output directory
CDN = re.compile(r"https://cdn\.jsdelivr\.net/npm/@marimo-team/frontend@[^/\"']+/dist")
NOTEBOOK_NAME = re.compile(r"^\d\d_\w+\.py$")


def default_notebooks() -> list[str]:
    return [os.path.join(DOCS, n) for n in sorted(os.listdir(DOCS)) if NOTEBOOK_NAME.match(n)]


def notebook_info(path: str) -> dict:
    """Title (the App's app_title), description (the module docstring) and the first line of each cell
    (the `@app.cell` functions and an `app.setup` block, in file order, as marimo numbers them)."""
    tree = ast.parse(open(path).read(), path)
    title = os.path.splitext(os.path.basename(path))[0]
    cell_lines = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for kw in node.value.keywords:
                if kw.arg == "app_title" and isinstance(kw.value, ast.Constant):
                    title = kw.value.value
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for dec in node.decorator_list:
                target = dec.func if isinstance(dec, ast.Call) else dec
                if isinstance(target, ast.Attribute) and target.attr in ("cell", "function", "class_definition"):
                    cell_lines.append(node.lineno)
                    break
        elif isinstance(node, ast.With):
            if any(isinstance(item.context_expr, ast.Attribute) and item.context_expr.attr == "setup"
                   for item in node.items):
                cell_lines.append(node.lineno)
    return {"title": title, "description": ast.get_docstring(tree) or "", "cell_lines": cell_lines}


def display_path(path: str) -> str:
    rel = os.path.relpath(path, REPO)
    return path if rel.startswith("..") else rel


def _embedded(page: str, key: str):
    """The JSON value of `key` in the page's mount configuration (the notebook and its session)."""
    start = page.find("__MARIMO_MOUNT_CONFIG__")
    at = page.find(f'"{key}": ', start) if start >= 0 else -1
    if at < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(page, at + len(key) + 4)[0]
    except ValueError:
        return None


def _plain(markup: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", markup))


def cell_errors(page: str, path: str, info: dict) -> list[dict]:
    """The cells whose output is an error, root causes first: file:line, the error and its traceback."""
    notebook, session = _embedded(page, "notebook"), _embedded(page, "session")
    if not notebook or not session:
        return []
    order = {cell["id"]: i for i, cell in enumerate(notebook.get("cells", []))}
    code = {cell["id"]: cell.get("code", "") for cell in notebook.get("cells", [])}
    rel = display_path(path)
    errors = []
    for cell in session.get("cells", []):
        for output in cell.get("outputs", []):
            if output.get("type") != "error":
                continue
            index = order.get(cell["id"], -1)
            line = info["cell_lines"][index] if 0 <= index < len(info["cell_lines"]) else None
            tb = "".join(_plain(c.get("text", "")) for c in cell.get("console", [])
                         if c.get("mimetype") == "application/vnd.marimo+traceback")
            message = str(output.get("evalue", ""))
            lines = tb.strip().splitlines()
            frames = [i for i, ln in enumerate(lines) if ln.startswith("  File ")]
            after = next((i for i in range(frames[-1] + 1 if frames else 0, len(lines))
                          if lines[i] and not lines[i][0].isspace()), None)
            if after is not None:  # "Type: message" and the message's further lines, from the traceback
                message = "\n".join(lines[after:])
            elif output.get("ename") not in (None, "exception"):
                message = f"{output['ename']}: {message}"
            errors.append({"cell": index, "where": f"{rel}:{line}" if line else rel, "error": message,
                           "traceback": tb.strip(), "code": code.get(cell["id"], ""),
                           "downstream": message.startswith("An ancestor")})
    errors.sort(key=lambda e: (e["downstream"], e["cell"]))
    return errors


@functools.cache
def frontend_dir() -> str:
    import marimo

    return os.path.join(os.path.dirname(os.path.abspath(marimo.__file__)), "_static")


def copy_frontend(out: str) -> None:
    """The installed marimo's built frontend, which the exported pages otherwise load from a CDN."""
    target = os.path.join(out, ASSETS)
    if os.path.isdir(target):
        shutil.rmtree(target)
    shutil.copytree(frontend_dir(), target, ignore=shutil.ignore_patterns("index.html", "*.md"))


def export(path: str, out: str, cdn: bool, timeout: float) -> dict:
    """Runs one notebook through `marimo export html`; returns its manifest entry."""
    info = notebook_info(path)
    name = os.path.splitext(os.path.basename(path))[0]
    page_path, log_path = os.path.join(out, name + ".html"), os.path.join(out, "logs", name + ".log")
    partial = page_path + ".partial"
    cmd = [sys.executable, "-m", "marimo", "export", "html", "--include-code", path, "-o", partial, "-f"]
    start = time.perf_counter()
    # its own process group: on a timeout the kernel marimo started (and whatever a cell started) ends too
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
        returncode = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        returncode = None
        log += f"\n(still running after {timeout:.0f} s: stopped)"
    seconds = time.perf_counter() - start
    with open(log_path, "w") as f:
        f.write(log)
    page = open(partial).read() if os.path.exists(partial) else ""
    if os.path.exists(partial):
        os.remove(partial)
    errors = cell_errors(page, path, info) if page else []
    if returncode != 0 and not errors:
        reason = "timed out" if returncode is None else f"`marimo export html` exited {returncode}"
        tail = "\n".join(log.strip().splitlines()[-25:])
        errors = [{"cell": -1, "where": display_path(path), "error": reason, "traceback": tail,
                   "code": "", "downstream": False}]
    if page:
        if not cdn:
            page = CDN.sub(ASSETS, page)
        with open(page_path, "w") as f:
            f.write(page)
    return {"notebook": display_path(path), "page": os.path.basename(page_path) if page else None,
            "title": info["title"], "description": info["description"], "seconds": round(seconds, 1),
            "ok": not errors, "errors": errors, "log": os.path.relpath(log_path, out)}


INDEX = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>torchtpu user guide</title>
<style>
  body {{ font-family: system-ui, sans-serif; max-width: 52rem; margin: 2rem auto; padding: 0 1rem; color: #1f2328; }}
  h1 {{ margin-bottom: 0.2rem; }}
  .sub {{ color: #59636e; margin-top: 0; }}
  ol {{ padding-left: 1.4rem; }}
  li {{ margin: 0.9rem 0; }}
  li a {{ font-size: 1.15rem; font-weight: 600; }}
  .desc {{ margin: 0.2rem 0; }}
  .meta {{ color: #59636e; font-size: 0.85rem; }}
  .failed {{ color: #b42318; font-weight: 600; }}
  code {{ background: #f2f4f7; padding: 0.05rem 0.3rem; border-radius: 4px; }}
  #file-hint {{ display: none; background: #fff8e1; border: 1px solid #f0c36d; padding: 0.6rem 0.9rem; border-radius: 6px; }}
</style>
</head>
<body>
<h1>torchtpu user guide</h1>
<p class="sub">{count} marimo notebooks, each executed on device <code>tpu</code>{plugin} when this guide was built.</p>
<p id="file-hint">Opened from disk: if a page stays blank, this browser refuses module scripts from
<code>file://</code> (Chromium does; Firefox does not). Serve the guide instead:
<code>python -m torchtpu.tools.guide --serve --no-build</code>, or build it with <code>--cdn</code>.</p>
<ol>
{items}
</ol>
<p>Run and change any of them yourself: <code>marimo edit docs/01_quickstart.py</code>
(or run one as a script: <code>python docs/01_quickstart.py</code>). Rebuild this guide with
<code>python -m torchtpu.tools.guide</code>.</p>
<p class="meta">Built {built} with marimo {marimo}, torch {torch}.</p>
<script>
  if (location.protocol === "file:" && {local_assets}) document.getElementById("file-hint").style.display = "block";
</script>
</body>
</html>
"""


def _version(package: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"


def write_index(out: str, entries: list[dict], cdn: bool) -> None:
    items = []
    for e in entries:
        link = (f'<a href="{html.escape(e["page"])}">{html.escape(e["title"])}</a>' if e["page"]
                else html.escape(e["title"]))
        status = "" if e["ok"] else ' <span class="failed">failed: ' + html.escape(e["errors"][0]["error"]) + "</span>"
        items.append(f'<li>{link}{status}<p class="desc">{html.escape(e["description"])}</p>'
                     f'<span class="meta"><code>{html.escape(e["notebook"])}</code>, ran in {e["seconds"]} s</span></li>')
    plugin = os.environ.get("TORCHTPU_PJRT_PLUGIN")
    plugin = f" (<code>TORCHTPU_PJRT_PLUGIN={html.escape(plugin)}</code>)" if plugin else ""
    with open(os.path.join(out, "index.html"), "w") as f:
        f.write(INDEX.format(count=len(entries), items="\n".join(items), plugin=plugin,
                             built=time.strftime("%Y-%m-%d %H:%M"), marimo=_version("marimo"),
                             torch=_version("torch"), local_assets="false" if cdn else "true"))


def build(notebooks: list[str], out: str, cdn: bool = False, jobs: int = 1, timeout: float = 600.0,
          log=print) -> list[dict]:
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
    if not cdn:
        copy_frontend(out)
    entries = [None] * len(notebooks)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = {pool.submit(export, path, out, cdn, timeout): i for i, path in enumerate(notebooks)}
        for future in concurrent.futures.as_completed(futures):
            e = entries[futures[future]] = future.result()
            log(f"{'ok    ' if e['ok'] else 'FAILED'} {e['notebook']} ({e['seconds']} s)")
    write_index(out, entries, cdn)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(entries, f, indent=1)
    return entries


def failure_report(entries: list[dict], out: str) -> str:
    lines = []
    for e in entries:
        if e["ok"]:
            continue
        roots = [x for x in e["errors"] if not x["downstream"]] or e["errors"]
        for x in roots:
            lines.append(f"{e['notebook']}: cell at {x['where']} raised {x['error']}" if x["cell"] >= 0
                         else f"{e['notebook']}: {x['error']}")
            lines += ["    " + ln for ln in x["traceback"].splitlines()[-12:]]
        skipped = len(e["errors"]) - len(roots)
        if skipped:
            lines.append(f"    ({skipped} later cell(s) did not run because of it)")
        lines.append(f"    full output: {os.path.join(out, e['log'])}")
    return "\n".join(lines)


def serve(out: str, port: int) -> None:
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=out)
    with http.server.ThreadingHTTPServer(("127.0.0.1", port), handler) as server:
        print(f"serving {out} on http://127.0.0.1:{server.server_address[1]}/ (Ctrl-C stops)", flush=True)
        try:
            server.serve_forever()
        except KeyboardInterrupt:
            pass


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="*", help="notebooks to build (default: docs/NN_*.py)")
    parser.add_argument("--out", default=DEFAULT_OUT, help="output directory (default: build/guide)")
    parser.add_argument("--cdn", action="store_true", help="load marimo's frontend from its CDN instead of a local copy")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                        help="notebooks exported at once (default 2)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds one notebook may run (default 600)")
    parser.add_argument("--serve", nargs="?", type=int, const=8000, metavar="PORT",
                        help="serve the guide on 127.0.0.1 (default port 8000) after building")
    parser.add_argument("--no-build", action="store_true", help="with --serve: serve what is already built")
    args = parser.parse_args(argv)
    out = os.path.abspath(args.out)
    if args.no_build:
        if args.serve is None:
            parser.error("--no-build only makes sense with --serve")
        if not os.path.exists(os.path.join(out, "index.html")):
            parser.error(f"nothing built in {out} yet")
        serve(out, args.serve)
        return 0
    if importlib.util.find_spec("marimo") is None:
        parser.error("marimo is not installed: pip install marimo==0.25.2 (or pip install -e '.[test]')")
    notebooks = [os.path.abspath(p) for p in args.notebooks] or default_notebooks()
    missing = [p for p in notebooks if not os.path.isfile(p)]
    if missing:
        parser.error("no such notebook: " + ", ".join(missing))
    start = time.perf_counter()
    entries = build(notebooks, out, cdn=args.cdn, jobs=args.jobs, timeout=args.timeout)
    failed = [e for e in entries if not e["ok"]]
    print(f"guide: {len(entries) - len(failed)} of {len(entries)} notebooks built in "
          f"{time.perf_counter() - start:.0f} s: {os.path.join(out, 'index.html')}")
    if failed:
        print(f"guide: {len(failed)} notebook(s) raised:\n" + failure_report(entries, out), file=sys.stderr)
        return 1
    if args.serve is not None:
        serve(out, args.serve)
    return 0


if __name__ == "__main__":
    sys.exit(main())
