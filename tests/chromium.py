"""Headless Chromium checks of HTML files (e.g. Snakemake reports), driven by Playwright.

Install (Debian, as root)::

    apt-get update && apt-get install -y chromium

Playwright (a dev dependency, from PyPI) drives Debian's chromium through ``executable_path``
(``/usr/bin/chromium``, or ``TRAJSFT_CHROMIUM``); Playwright's own browser download
(``playwright install``) is never used. Errors are collected while the page loads and runs:

* ``pageerror``: uncaught JS exceptions (incl. in promises),
* ``console`` messages of type ``error``/``assert`` (``console.error``, and the browser's own
  log entries such as failed resource loads or CSP errors, which Playwright reports there),
* ``requestfailed``: a resource that could not be loaded at all.

``render(html_path, png_path)`` returns those errors (an empty list = clean) and writes a
screenshot. ``check_snakemake_report(report_html, out_dir)`` additionally drives the Snakemake
report's React app (its global ``app`` and ``results``/``categories`` variables, exactly what the
report's own "eye" buttons call) to open every category in the navbar and display every result,
checking that images decode (``naturalWidth > 0``) and that HTML results render non-empty
documents inside their iframe (read in the frame itself).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from pathlib import Path
from typing import Iterator

from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, sync_playwright

CHROMIUM = os.environ.get("TRAJSFT_CHROMIUM", "/usr/bin/chromium")
ARGS = [
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
]
INSTALL_HINT = "chromium not found: apt-get update && apt-get install -y chromium (or set TRAJSFT_CHROMIUM)"


def available() -> bool:
    return shutil.which(CHROMIUM) is not None or os.path.exists(CHROMIUM)


class ReportError(RuntimeError):
    pass


@contextlib.contextmanager
def page(width: int = 1400, height: int = 900, timeout: float = 60.0) -> Iterator[tuple[Page, list[str]]]:
    """A fresh headless browser (throwaway profile) with one page, and the list its errors go to."""
    if not available():
        raise FileNotFoundError(INSTALL_HINT)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=shutil.which(CHROMIUM) or CHROMIUM, args=ARGS,
                                     timeout=timeout * 1000)
        try:
            p = browser.new_page(viewport={"width": width, "height": height})
            p.set_default_timeout(timeout * 1000)
            errors: list[str] = []
            p.on("pageerror", lambda e: errors.append(f"exception: {(str(e) or e.name).splitlines()[0]}"))
            p.on("console", lambda m: errors.append(f"console.{m.type}: {m.text}") if m.type in ("error", "assert")
                 else None)
            p.on("requestfailed", lambda r: errors.append(f"request failed: {r.url} ({r.failure})"))
            yield p, errors
        finally:
            browser.close()


def wait_stable(p: Page, quiet: float = 0.5, limit: float = 60.0) -> None:
    """Wait until the DOM size has not changed for ``quiet`` seconds (JS apps render late)."""
    end = time.monotonic() + limit
    last, since = None, time.monotonic()
    while time.monotonic() < end:
        cur = p.evaluate("document.readyState + ':' + document.documentElement.outerHTML.length")
        if cur != last:
            last, since = cur, time.monotonic()
        elif time.monotonic() - since >= quiet and cur.startswith("complete"):
            return
        p.wait_for_timeout(100)


def wait_for(p: Page, expression: str, limit: float = 10.0):
    """Poll a JS expression until it is truthy; returns its value (or the last falsy one)."""
    end = time.monotonic() + limit
    val = None
    while time.monotonic() < end:
        val = p.evaluate(expression)
        if val:
            return val
        p.wait_for_timeout(100)
    return val


def open_file(p: Page, path: str | os.PathLike, settle: float = 0.5) -> None:
    p.goto(Path(path).resolve().as_uri(), wait_until="load")
    wait_stable(p, settle)


def screenshot(p: Page, png_path: str | os.PathLike) -> None:
    png_path = Path(png_path)
    png_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = png_path.with_name(f".{png_path.name}.tmp")
    p.screenshot(path=tmp, type="png")
    os.replace(tmp, png_path)


def render(html_path: str | os.PathLike, png_path: str | os.PathLike, *, width: int = 1400, height: int = 900,
           settle: float = 0.5, timeout: float = 60.0) -> list[str]:
    """Load ``html_path`` headless, wait for JS to settle, screenshot to ``png_path``.

    Returns the console/JS/resource errors seen while loading (empty list = clean)."""
    with page(width, height, timeout) as (p, errors):
        open_file(p, html_path, settle)
        p.wait_for_timeout(300)  # errors logged late, e.g. by timers
        screenshot(p, png_path)
        return list(errors)


def dom(html_path: str | os.PathLike, settle: float = 0.5, timeout: float = 60.0) -> tuple[str, list[str]]:
    """The rendered DOM (``outerHTML`` after JS ran) and the errors."""
    with page(timeout=timeout) as (p, errors):
        open_file(p, html_path, settle)
        return p.evaluate("document.documentElement.outerHTML"), list(errors)


_IMG_CHECK = """(uri) => {
  const imgs = [...document.querySelectorAll('img')].filter(i => i.src.startsWith('data:image'));
  const i = imgs.find(i => i.getAttribute('src') === uri);
  return i ? {found: true, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight} : {found: false};
}"""
_FRAME_DOC = ("() => ({text: document.body ? document.body.innerText : '', "
              "tables: document.querySelectorAll('table').length, url: location.href.slice(0, 40)})")


def _show_subcategory(p: Page, cat: str, sub: str, quiet: float = 0.2) -> None:
    p.evaluate("app.setView({navbarMode: 'menu'})")  # back to the main menu first, as a user would
    wait_stable(p, quiet)
    p.evaluate("([cat, sub]) => app.setView({navbarMode: 'subcategory', category: cat, subcategory: sub})",
               [cat, sub])
    wait_stable(p, quiet)


def _html_result_doc(p: Page, limit: float = 10.0) -> dict | None:
    """The first child frame (the result's iframe) whose document has text or a table."""
    end = time.monotonic() + limit
    while time.monotonic() < end:
        for frame in p.frames[1:]:
            try:
                d = frame.evaluate(_FRAME_DOC)
            except PlaywrightError:  # detached or not yet navigated
                continue
            if d and (d["text"].strip() or d["tables"]):
                return d
        p.wait_for_timeout(200)
    return None


def check_snakemake_report(report_html: str | os.PathLike, out_dir: str | os.PathLike | None = None, *,
                           timeout: float = 120.0) -> dict:
    """Open a Snakemake ``--report`` HTML, show every category and every result, like a user would.

    Returns ``{"errors": [...], "categories": {cat: {subcat: [result, ...]}}, "navbar": {cat: bool
    (all its result names appear in the navbar DOM)}, "results": {name: {"mime", "ok", ...}},
    "workflow_desc": str}``. Images: ``ok`` = the <img> is in the DOM and decoded (natural size >
    0). HTML: ``ok`` = the iframe's document has a non-empty body; ``text`` holds its innerText and
    ``tables`` the number of <table> elements. Screenshots go to ``out_dir`` (landing page +
    one per result) if given."""
    out = Path(out_dir) if out_dir else None
    with page(timeout=timeout) as (p, errors):
        open_file(p, report_html)
        if not wait_for(p, "typeof app !== 'undefined' && !!document.querySelector('#app').children.length", 20):
            raise ReportError(f"{report_html}: the report app did not render")
        if out:
            screenshot(p, out / "landing.png")
        info = {
            "errors": [],
            "categories": p.evaluate("categories"),
            "workflow_desc": p.evaluate("document.querySelector('#app').innerText"),
            "navbar": {},
            "results": {},
        }
        for cat, subs in info["categories"].items():
            p.evaluate("app.setView({navbarMode: 'menu'})")
            wait_stable(p, 0.2)
            p.evaluate("cat => app.showCategory(cat)", cat)
            wait_stable(p, 0.2)
            if len(subs) > 1:  # category view lists subcategories; open each
                names_ok = True
                for sub, items in subs.items():
                    _show_subcategory(p, cat, sub)
                    nav = p.evaluate("document.body.innerText")
                    names_ok &= all(x in nav for r in items for x in _labels(p, r))
                info["navbar"][cat] = names_ok
            else:
                nav = p.evaluate("document.body.innerText")
                info["navbar"][cat] = all(x in nav for r in next(iter(subs.values())) for x in _labels(p, r))
        where = {r: (cat, sub) for cat, subs in info["categories"].items() for sub, rs in subs.items() for r in rs}
        for name in p.evaluate("Object.keys(results)"):
            result = p.evaluate("name => results[name]", name)
            mime = result["mime_type"]
            if name in where:  # show the result's own category in the navbar, as a user would
                _show_subcategory(p, *where[name], quiet=0.1)
            kind = {"image/png": "img", "image/jpeg": "img", "image/svg+xml": "img", "text/html": "html",
                    "application/pdf": "pdf"}.get(mime)
            rec: dict = {"mime": mime, "ok": None}
            if kind:
                p.evaluate("([kind, name]) => app.setView({content: kind, contentPath: results[name].data_uri, "
                           "resultPath: name})", [kind, name])
                wait_stable(p, 0.3)
            if kind == "img":
                st = None
                with contextlib.suppress(PlaywrightError):  # not decoded in time: report what is there
                    p.wait_for_function(f"uri => {{ const r = ({_IMG_CHECK})(uri); return r.found && r.complete "
                                        "&& r.w > 0; }", arg=result["data_uri"], timeout=10_000)
                st = p.evaluate(_IMG_CHECK, result["data_uri"])
                rec.update(st, ok=bool(st.get("found") and st.get("w", 0) > 0))
            elif kind == "html":
                doc = _html_result_doc(p)
                rec.update(doc or {}, ok=bool(doc))
            if out and kind:
                screenshot(p, out / (name.replace("/", "_") + ".png"))
            info["results"][name] = rec
        p.wait_for_timeout(300)
        info["errors"] = list(errors)
        return info


def _labels(p: Page, result: str) -> list[str]:
    """The texts the navbar shows for a result: its label values if any, else the file name."""
    labels = p.evaluate("name => results[name].labels", result)
    if labels:
        return [str(v) for v in labels.values()]
    return [os.path.basename(result)]
