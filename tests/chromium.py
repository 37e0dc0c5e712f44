"""Headless Chromium checks of HTML files (e.g. Snakemake reports), stdlib only.

Install (Debian, as root)::

    apt-get update && apt-get install -y chromium

How it works: Chromium is started headless with ``--remote-debugging-pipe``, i.e. the DevTools
protocol (CDP) over two pipes handed to the browser as fds 3 (commands in) and 4 (replies out),
NUL-separated JSON; no port, no websocket library, nothing listens on the network. We attach to
the page, enable the Runtime/Log/Page domains, navigate to the file, wait until the page is loaded
and its DOM stops changing, and collect errors as they happen:

* ``Runtime.exceptionThrown`` (uncaught JS exceptions, incl. in promises),
* ``Runtime.consoleAPICalled`` with type ``error``/``assert`` (``console.error``),
* ``Log.entryAdded`` with level ``error`` (failed resource loads, CSP/security errors, ...).

``render(html_path, png_path)`` returns those errors (an empty list = clean) and writes a
screenshot. ``check_snakemake_report(report_html, out_dir)`` additionally drives the Snakemake
report's React app (its global ``app`` and ``results``/``categories`` variables, exactly what the
report's own "eye" buttons call) to open every category in the navbar and display every result,
checking that images decode (``naturalWidth > 0``) and that HTML results render non-empty
documents inside their iframe (read through the frame's own execution context).

Every launch uses a throwaway ``--user-data-dir``; the browser is closed with ``Browser.close``
and killed (only that process) if it does not exit.
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

CHROMIUM = os.environ.get("TRAJSFT_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",  # containers often have a tiny /dev/shm
    "--disable-extensions",
    "--mute-audio",
    "--hide-scrollbars",
    "--remote-debugging-pipe",
]
INSTALL_HINT = "chromium not found: apt-get update && apt-get install -y chromium (or set TRAJSFT_CHROMIUM)"


def available() -> bool:
    return shutil.which(CHROMIUM) is not None or os.path.exists(CHROMIUM)


class CDPError(RuntimeError):
    pass


class Browser:
    """A headless Chromium driven over ``--remote-debugging-pipe``; one page (tab)."""

    def __init__(self, width: int = 1400, height: int = 900, timeout: float = 60.0):
        if not available():
            raise FileNotFoundError(INSTALL_HINT)
        self.timeout = timeout
        self.errors: list[str] = []
        self.events: list[dict] = []
        self._id = 0
        self._buf = b""
        self._profile = tempfile.mkdtemp(prefix="trajsft-chromium-")
        cmd_r, self._cmd_w = os.pipe()  # we write commands -> browser reads fd 3
        self._out_r, out_w = os.pipe()  # browser writes fd 4 -> we read

        def child_fds():  # move both ends out of the way first: they may already sit on fds 3/4
            a, b = fcntl.fcntl(cmd_r, fcntl.F_DUPFD, 10), fcntl.fcntl(out_w, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self._stderr = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [CHROMIUM, *FLAGS, f"--user-data-dir={self._profile}", f"--window-size={width},{height}", "about:blank"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            preexec_fn=child_fds,
            pass_fds=(3, 4),
            start_new_session=True,
        )
        os.close(cmd_r)
        os.close(out_w)
        try:
            self.session = self._attach(width, height)
        except BaseException:
            self.close()
            raise

    # ---- protocol --------------------------------------------------------------------------
    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("chromium: no DevTools reply in time")
            ready, _, _ = select.select([self._out_r], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._out_r, 1 << 20)
            if not chunk:
                raise CDPError(f"chromium exited (rc={self.proc.poll()}): {self.stderr_tail()}")
            self._buf += chunk
        msg, self._buf = self._buf.split(b"\0", 1)
        return json.loads(msg)

    def _handle_event(self, msg: dict) -> None:
        self.events.append(msg)
        method, p = msg.get("method"), msg.get("params") or {}
        if method == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails") or {}
            exc = d.get("exception") or {}
            text = exc.get("description") or d.get("text") or "exception"
            self.errors.append(f"exception: {text.splitlines()[0]} ({d.get('url', '')}:{d.get('lineNumber', '?')})")
        elif method == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            args = " ".join(str(a.get("value", a.get("description", ""))) for a in p.get("args") or [])
            self.errors.append(f"console.{p['type']}: {args}")
        elif method == "Log.entryAdded" and (p.get("entry") or {}).get("level") == "error":
            e = p["entry"]
            self.errors.append(f"log.{e.get('source', '')}: {e.get('text', '')} {e.get('url', '') or ''}".rstrip())

    def send(self, method: str, params: dict | None = None, session: str | None = "page", timeout: float | None = None):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        sid = self.session if session == "page" else session
        if sid:
            msg["sessionId"] = sid
        os.write(self._cmd_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._id:
                if "error" in reply:
                    raise CDPError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self._handle_event(reply)

    def pump(self, seconds: float) -> None:
        """Process events for ``seconds`` (errors logged late, e.g. by timers)."""
        end = time.monotonic() + seconds
        while True:
            left = end - time.monotonic()
            if left <= 0:
                return
            try:
                self._handle_event(self._read_message(time.monotonic() + left))
            except TimeoutError:
                return

    def _attach(self, width: int, height: int) -> str:
        targets = self.send("Target.getTargets", session=None)["targetInfos"]
        pages = [t for t in targets if t["type"] == "page"]
        tid = pages[0]["targetId"] if pages else self.send("Target.createTarget", {"url": "about:blank"}, session=None)["targetId"]
        sid = self.send("Target.attachToTarget", {"targetId": tid, "flatten": True}, session=None)["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.send(f"{domain}.enable", session=sid)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session=sid)
        return sid

    # ---- page helpers ----------------------------------------------------------------------
    def navigate(self, url: str, settle: float = 0.5) -> None:
        n = len(self.events)
        res = self.send("Page.navigate", {"url": url})
        if res.get("errorText"):
            raise CDPError(f"navigate {url}: {res['errorText']}")
        deadline = time.monotonic() + self.timeout
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events[n:]):
            self._handle_event(self._read_message(deadline))
        self.wait_stable(settle)

    def evaluate(self, expression: str, context_id: int | None = None):
        params = {"expression": expression, "returnByValue": True, "awaitPromise": True}
        if context_id is not None:
            params["contextId"] = context_id
        res = self.send("Runtime.evaluate", params)
        if "exceptionDetails" in res:
            d = res["exceptionDetails"]
            raise CDPError(f"evaluate: {(d.get('exception') or {}).get('description') or d.get('text')}")
        return res["result"].get("value")

    def wait_stable(self, quiet: float = 0.5, limit: float | None = None) -> None:
        """Wait until the DOM size has not changed for ``quiet`` seconds (JS apps render late)."""
        end = time.monotonic() + (limit or self.timeout)
        last, since = None, time.monotonic()
        while time.monotonic() < end:
            cur = self.evaluate("document.readyState + ':' + document.documentElement.outerHTML.length")
            if cur != last:
                last, since = cur, time.monotonic()
            elif time.monotonic() - since >= quiet and cur.startswith("complete"):
                return
            self.pump(0.1)

    def wait_for(self, expression: str, limit: float = 10.0):
        """Poll a JS expression until it is truthy; returns its value (or the last falsy one)."""
        end = time.monotonic() + limit
        val = None
        while time.monotonic() < end:
            val = self.evaluate(expression)
            if val:
                return val
            self.pump(0.1)
        return val

    def screenshot(self, png_path: str | os.PathLike, full_page: bool = False) -> None:
        params: dict = {"format": "png"}
        if full_page:
            m = self.send("Page.getLayoutMetrics")["cssContentSize"]
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": m["width"], "height": m["height"], "scale": 1})
        data = base64.b64decode(self.send("Page.captureScreenshot", params)["data"])
        png_path = Path(png_path)
        png_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = png_path.with_name(f".{png_path.name}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, png_path)

    def frame_contexts(self) -> dict[str, int]:
        """frameId -> an execution context id for every child frame (iframes, incl. data: URLs)."""
        tree = self.send("Page.getFrameTree")["frameTree"]
        out: dict[str, int] = {}

        def walk(node, top):
            fid = node["frame"]["id"]
            if not top:
                out[fid] = self.send("Page.createIsolatedWorld", {"frameId": fid, "worldName": "trajsft-check"})[
                    "executionContextId"]
            for ch in node.get("childFrames") or []:
                walk(ch, False)

        walk(tree, True)
        return out

    def stderr_tail(self, n: int = 2000) -> str:
        try:
            self._stderr.seek(0)
            return self._stderr.read().decode(errors="replace")[-n:]
        except (OSError, ValueError):
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("Browser.close", session=None, timeout=5)
            except (CDPError, TimeoutError, OSError):
                pass
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()  # only the browser we started
                self.proc.wait(timeout=10)
        for fd in (self._cmd_w, self._out_r):
            try:
                os.close(fd)
            except OSError:
                pass
        self._stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def file_url(path: str | os.PathLike) -> str:
    return Path(path).resolve().as_uri()


def render(html_path: str | os.PathLike, png_path: str | os.PathLike, *, width: int = 1400, height: int = 900,
           settle: float = 0.5, timeout: float = 60.0) -> list[str]:
    """Load ``html_path`` headless, wait for JS to settle, screenshot to ``png_path``.

    Returns the console/JS/resource errors seen while loading (empty list = clean)."""
    with Browser(width, height, timeout) as b:
        b.navigate(file_url(html_path), settle=settle)
        b.pump(0.3)
        b.screenshot(png_path)
        return list(b.errors)


def dom(html_path: str | os.PathLike, settle: float = 0.5, timeout: float = 60.0) -> tuple[str, list[str]]:
    """The rendered DOM (``outerHTML`` after JS ran) and the errors."""
    with Browser(timeout=timeout) as b:
        b.navigate(file_url(html_path), settle=settle)
        return b.evaluate("document.documentElement.outerHTML"), list(b.errors)


_IMG_CHECK = """(() => {
  const imgs = [...document.querySelectorAll('img')].filter(i => i.src.startsWith('data:image'));
  const i = imgs.find(i => i.getAttribute('src') === %s);
  return i ? {found: true, complete: i.complete, w: i.naturalWidth, h: i.naturalHeight} : {found: false};
})()"""


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
    with Browser(timeout=timeout) as b:
        b.navigate(file_url(report_html), settle=0.5)
        ready = b.wait_for("typeof app !== 'undefined' && !!document.querySelector('#app').children.length", 20)
        if not ready:
            raise CDPError(f"{report_html}: the report app did not render")
        if out:
            b.screenshot(out / "landing.png")
        info = {
            "errors": [],
            "categories": b.evaluate("categories"),
            "workflow_desc": b.evaluate("document.querySelector('#app').innerText"),
            "navbar": {},
            "results": {},
        }
        for cat, subs in info["categories"].items():
            # back to the main menu first, as a user clicking through would (the app keeps a
            # mounted result list's state when switching categories directly)
            b.evaluate("app.setView({navbarMode: 'menu'})")
            b.wait_stable(0.2)
            b.evaluate(f"app.showCategory({json.dumps(cat)})")
            b.wait_stable(0.2)
            if len(subs) > 1:  # category view lists subcategories; open each
                names_ok = True
                for sub, items in subs.items():
                    b.evaluate("app.setView({navbarMode: 'menu'})")
                    b.wait_stable(0.2)
                    b.evaluate(f"app.setView({{navbarMode: 'subcategory', category: {json.dumps(cat)}, "
                               f"subcategory: {json.dumps(sub)}}})")
                    b.wait_stable(0.2)
                    nav = b.evaluate("document.body.innerText")
                    names_ok &= all(x in nav for r in items for x in _labels(b, r))
                info["navbar"][cat] = names_ok
            else:
                nav = b.evaluate("document.body.innerText")
                info["navbar"][cat] = all(x in nav for r in next(iter(subs.values())) for x in _labels(b, r))
        where = {r: (cat, sub) for cat, subs in info["categories"].items() for sub, rs in subs.items() for r in rs}
        for name in b.evaluate("Object.keys(results)"):
            mime = b.evaluate(f"results[{json.dumps(name)}].mime_type")
            if name in where:  # show the result's own category in the navbar, as a user would
                cat, sub = where[name]
                b.evaluate("app.setView({navbarMode: 'menu'})")
                b.wait_stable(0.1)
                b.evaluate(f"app.setView({{navbarMode: 'subcategory', category: {json.dumps(cat)}, "
                           f"subcategory: {json.dumps(sub)}}})")
            kind = {"image/png": "img", "image/jpeg": "img", "image/svg+xml": "img", "text/html": "html",
                    "application/pdf": "pdf"}.get(mime)
            rec: dict = {"mime": mime, "ok": None}
            if kind:
                b.evaluate(f"app.setView({{content: {json.dumps(kind)}, contentPath: results[{json.dumps(name)}].data_uri,"
                           f" resultPath: {json.dumps(name)}}})")
                b.wait_stable(0.3)
            if kind == "img":
                uri = b.evaluate(f"results[{json.dumps(name)}].data_uri")
                st = b.wait_for(f"(() => {{ const r = {_IMG_CHECK % json.dumps(uri)}; "
                                "return r.found && r.complete && r.w > 0 ? r : null; })()", 10)
                st = st or b.evaluate(_IMG_CHECK % json.dumps(uri))
                rec.update(st, ok=bool(st.get("found") and st.get("w", 0) > 0))
            elif kind == "html":
                doc = None
                end = time.monotonic() + 10
                while time.monotonic() < end and not doc:
                    for ctx in b.frame_contexts().values():
                        try:
                            d = b.evaluate("({text: document.body ? document.body.innerText : '', "
                                           "tables: document.querySelectorAll('table').length, "
                                           "url: location.href.slice(0, 40)})", context_id=ctx)
                        except CDPError:
                            continue
                        if d and (d["text"].strip() or d["tables"]):
                            doc = d
                    if not doc:
                        b.pump(0.2)
                rec.update(doc or {}, ok=bool(doc))
            if out and kind:
                b.screenshot(out / (name.replace("/", "_") + ".png"))
            info["results"][name] = rec
        b.pump(0.3)
        info["errors"] = list(b.errors)
        return info


def _labels(b: Browser, result: str) -> list[str]:
    """The texts the navbar shows for a result: its label values if any, else the file name."""
    labels = b.evaluate(f"results[{json.dumps(result)}].labels")
    if labels:
        return [str(v) for v in labels.values()]
    return [os.path.basename(result)]
