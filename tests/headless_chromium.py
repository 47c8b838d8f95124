"""One headless Chromium, driven over the DevTools protocol on a pipe
(--remote-debugging-pipe: no port, no websocket): pages opened at a window size, scripts run
in them, screenshots. Used by tests/docs_render.py. Python standard library only.
"""
from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

HEIGHT = 900

# Resolves when the page's MathJax queue is empty (at once where the page has no MathJax).
MATHJAX_DONE = r"""new Promise(done => {
  if (!window.MathJax || !MathJax.Hub) return done(0);
  MathJax.Hub.Queue(() => done(1));
})"""


class Browser:
    """One headless Chromium, driven over --remote-debugging-pipe (fd 3: commands in, fd 4:
    replies and events out, each a JSON message ended by a NUL byte)."""

    def __init__(self, chromium: str, timeout: float = 60.0):
        self.timeout = timeout
        self._profile = tempfile.mkdtemp(prefix="fa_chromium_")
        to_chrome_r, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome_w = os.pipe()

        def child_fds():
            os.dup2(to_chrome_r, 3)
            os.dup2(from_chrome_w, 4)

        self._proc = subprocess.Popen(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--no-first-run", "--no-default-browser-check", "--remote-debugging-pipe",
             f"--user-data-dir={self._profile}", "about:blank"],
            pass_fds=(3, 4), preexec_fn=child_fds,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        self._buf, self._id, self._events = b"", 0, []
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable", session=True)
        self.call("Runtime.enable", session=True)

    # --- the protocol
    def _read(self):
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                raise TimeoutError("Chromium did not answer")
            chunk = os.read(self._from_chrome, 1 << 16)
            if not chunk:
                raise EOFError("Chromium closed the pipe")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: bool = False):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = self.session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read()
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error'].get('message')}")
                return m.get("result", {})
            self._events.append(m)

    def _wait_event(self, name: str):
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for k, m in enumerate(self._events):
                if m.get("method") == name:
                    del self._events[k]
                    return m
            self._events.append(self._read())
        raise TimeoutError(f"no {name} from Chromium")

    def evaluate(self, expression: str, wait: bool = False):
        r = self.call("Runtime.evaluate", {"expression": expression, "awaitPromise": wait,
                                            "returnByValue": True}, session=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"script failed in the page: {r['exceptionDetails'].get('text')}")
        return r.get("result", {}).get("value")

    # --- pages
    def open(self, path: Path, width: int, height: int = HEIGHT):
        """Loads a page at a window size and waits for its formulas."""
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height,
                                                          "deviceScaleFactor": 1, "mobile": False},
                  session=True)
        self.navigate(path.resolve().as_uri())
        self.evaluate(MATHJAX_DONE, wait=True)

    def navigate(self, url: str):
        """Goes to url and waits for its load event, a new document's. A change of the
        fragment alone loads no document (Chromium answers without a loaderId): then the
        browser visits about:blank and goes to url again. (A visit to about:blank before every
        page would cost about 0.05 CPU-s a page.)"""
        if not self._load(url):
            self._load("about:blank")
            self._load(url)

    def _load(self, url: str) -> bool:
        """Page.navigate to url; waits for the load event when a document loads (True)."""
        self._events = [m for m in self._events if m.get("method") != "Page.loadEventFired"]
        if "loaderId" not in self.call("Page.navigate", {"url": url}, session=True):
            return False
        self._wait_event("Page.loadEventFired")
        return True

    def screenshot(self, box) -> bytes:
        """A PNG of box (x, y, w, h in CSS px of the viewport): its top 300 px, scaled to at
        most 600 px wide (thin lines stay dark; the PNG decodes in Python in well under a second)."""
        x, y, w, h = box
        h = min(h, 300.0)
        scale = min(1.0, 600.0 / max(w, 1.0))
        r = self.call("Page.captureScreenshot", {"format": "png", "clip": {
            "x": x, "y": y, "width": w, "height": h, "scale": scale}}, session=True)
        return base64.b64decode(r["data"])

    def close(self):
        try:
            self.call("Browser.close")
        except (OSError, EOFError, RuntimeError, TimeoutError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
        for fd in (self._to_chrome, self._from_chrome):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def find_chromium():
    """The Chromium on PATH, or None."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
