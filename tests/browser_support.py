"""A real headless browser for the UI tests: Debian's `chromium`, driven over the DevTools protocol.

`Browser()` starts `chromium --headless=new` on a private profile with a DevTools port on
127.0.0.1; `open(url, cookies=...)` loads a page in a fresh tab (cookies set first, e.g. the
Airflow login's `_token`) and returns a `Page` with its final DOM, its JavaScript-visible facts
and a PNG screenshot. `dump_dom(url)` is the plain `chromium --dump-dom` of a fresh profile (no
login). Install the browser with `apt-get install -y chromium` (`make test` does it).
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.airflow_services import stop_process

ARTIFACTS = Path(__file__).resolve().parent / "_artifacts"
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
         "--no-default-browser-check", "--disable-extensions", "--hide-scrollbars", "--mute-audio"]


def chromium() -> str | None:
    """The browser's executable, or None when it is not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


def dump_dom(url: str, timeout: float = 60) -> str:
    """`chromium --dump-dom URL` on a fresh, empty profile: the DOM a visitor without a login gets."""
    with tempfile.TemporaryDirectory(prefix="seedance-chromium-") as profile:
        out = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
                             capture_output=True, text=True, timeout=timeout)
    return out.stdout


@dataclass
class Page:
    """A loaded page: where it ended, its serialised DOM, and what the browser saw in it."""

    url: str
    html: str
    facts: dict
    png: bytes

    def save(self, name: str) -> Path:
        """Write the screenshot to tests/_artifacts/NAME.png (git-ignored); returns the path."""
        ARTIFACTS.mkdir(exist_ok=True)
        path = ARTIFACTS / f"{name}.png"
        path.write_bytes(self.png)
        return path


class Browser:
    """One headless Chromium process for a test module; `close()` ends it and removes its profile."""

    def __init__(self, width: int = 1280, height: int = 900):
        from websockets.sync.client import connect

        self.width, self.height = width, height
        self.profile = Path(tempfile.mkdtemp(prefix="seedance-chromium-"))
        self.process = subprocess.Popen(
            [chromium(), *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-address=127.0.0.1",
             "--remote-debugging-port=0", f"--window-size={width},{height}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port, path = port_file.read_text().splitlines()[:2]
        self.socket = connect(f"ws://127.0.0.1:{port}{path}", max_size=64 * 2**20, open_timeout=30)
        self._ids = itertools.count(1)

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params) -> dict:
        """One DevTools command; its result, skipping the events that arrive meanwhile."""
        message_id = next(self._ids)
        message = {"id": message_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        self.socket.send(json.dumps(message))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self.socket.recv(timeout=max(deadline - time.monotonic(), 0.1)))
            if reply.get("id") == message_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open(self, url: str, cookies: list[dict] | None = None, timeout: float = 30) -> Page:
        """Load `url` in a new tab (after setting `cookies`), wait for it, read its DOM and a full-page screenshot."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        try:
            self.call("Emulation.setDeviceMetricsOverride", session, width=self.width, height=self.height,
                      deviceScaleFactor=1, mobile=False)
            if cookies:
                self.call("Network.setCookies", session, cookies=cookies)
            self.call("Page.navigate", session, url=url)
            deadline = time.monotonic() + timeout
            while self._evaluate(session, "document.readyState") != "complete" or \
                    self._evaluate(session, "location.href") == "about:blank":
                if time.monotonic() > deadline:
                    raise AssertionError(f"{url} did not finish loading in {timeout:.0f} s")
                time.sleep(0.1)
            facts = json.loads(self._evaluate(session, """JSON.stringify({
                scripts: document.querySelectorAll('script').length,
                images: document.querySelectorAll('img').length,
                handlers: [...document.querySelectorAll('*')].filter(e => [...e.attributes].some(
                    a => a.name.startsWith('on'))).length,
                wider: document.documentElement.scrollWidth > window.innerWidth,
                title: document.title, text: document.body ? document.body.innerText : ''})"""))
            html = self._evaluate(session, "document.documentElement.outerHTML")
            final = self._evaluate(session, "location.href")
            full = min(int(self._evaluate(session, "document.documentElement.scrollHeight")), 6000)
            shot = self.call("Page.captureScreenshot", session, format="png", captureBeyondViewport=True,
                             clip={"x": 0, "y": 0, "width": self.width, "height": max(full, 1), "scale": 1})
            return Page(final, html, facts, base64.b64decode(shot["data"]))
        finally:
            self.call("Target.closeTarget", targetId=target)

    def _evaluate(self, session: str, expression: str):
        return self.call("Runtime.evaluate", session, expression=expression, returnByValue=True)["result"].get("value")

    def close(self) -> None:
        try:
            if getattr(self, "socket", None):
                self.socket.close()
        finally:
            stop_process(self.process)
            shutil.rmtree(self.profile, ignore_errors=True)
