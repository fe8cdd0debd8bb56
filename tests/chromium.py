"""A small driver for headless Chromium (Debian's `chromium` package) over the DevTools protocol, for the
browser tests and the report guide's screenshot (docs/report.png). It talks to Chromium over
`--remote-debugging-pipe` (file descriptors 3 and 4, messages ending in NUL): no port, no websocket,
standard library only.

    with Chromium.launch() as browser:
        page = browser.open(Path("report.html"))
        page.evaluate("document.title")
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-dev-shm-usage", "--disable-extensions", "--hide-scrollbars", "--mute-audio",
         "--remote-debugging-pipe"]


def find_chromium() -> str | None:
    """The Chromium binary: $OPSCOPE_CHROMIUM, else `chromium` or `chromium-browser` on PATH."""
    explicit = os.environ.get("OPSCOPE_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return shutil.which("chromium") or shutil.which("chromium-browser")


class DevToolsError(RuntimeError):
    pass


class Chromium:
    def __init__(self, proc: subprocess.Popen, send_fd: int, recv_fd: int, profile: str) -> None:
        self.proc, self._send_fd, self._recv_fd, self._profile = proc, send_fd, recv_fd, profile
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    @classmethod
    def launch(cls, binary: str | None = None, width: int = 1280, height: int = 900) -> Chromium:
        binary = binary or find_chromium()
        if binary is None:
            raise DevToolsError("chromium not found")
        to_chrome_r, to_chrome_w = os.pipe()
        from_chrome_r, from_chrome_w = os.pipe()
        # The child's ends, moved above any descriptor the redirections below could clobber.
        child_r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD, 10)
        child_w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD, 10)
        os.close(to_chrome_r)
        os.close(from_chrome_w)
        profile = tempfile.mkdtemp(prefix="opscope-chromium-")
        args = [*FLAGS, f"--user-data-dir={profile}", f"--window-size={width},{height}"]
        # bash, not sh: dash cannot redirect descriptors above 9.
        script = f'exec "$0" "$@" 3<&{child_r} 4>&{child_w} {child_r}<&- {child_w}>&-'
        proc = subprocess.Popen(["bash", "-c", script, binary, *args], pass_fds=(child_r, child_w),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        os.close(child_r)
        os.close(child_w)
        return cls(proc, to_chrome_w, from_chrome_r, profile)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with contextlib.suppress(DevToolsError, OSError):
            self.send("Browser.close", timeout=5)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._send_fd, self._recv_fd):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self._profile, ignore_errors=True)

    # --- protocol ---

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DevToolsError("timed out waiting for chromium")
            ready, _, _ = select.select([self._recv_fd], [], [], left)
            if ready:
                chunk = os.read(self._recv_fd, 1 << 20)
                if not chunk:
                    raise DevToolsError(f"chromium exited (code {self.proc.poll()})")
                self._buffer += chunk
        message, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(message)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 60) -> dict[str, Any]:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        while data:
            data = data[os.write(self._send_fd, data):]
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    raise DevToolsError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            if "method" in reply:
                self.events.append(reply)

    def wait_event(self, method: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for i, event in enumerate(self.events):
            if event.get("method") == method:
                return self.events.pop(i)
        while True:
            message = self._read_message(deadline)
            if message.get("method") == method:
                return message
            if "method" in message:
                self.events.append(message)

    def open(self, path: Path, width: int = 1280, height: int = 900, timeout: float = 60) -> Page:
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log", "Network"):
            page.send(f"{domain}.enable")
        page.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})
        page.send("Page.navigate", {"url": Path(path).absolute().as_uri()})
        self.wait_event("Page.loadEventFired", timeout)
        return page


class Page:
    def __init__(self, browser: Chromium, session: str) -> None:
        self.browser, self.session = browser, session

    def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 60) -> dict[str, Any]:
        return self.browser.send(method, params, self.session, timeout)

    def evaluate(self, expression: str, timeout: float = 60) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": True}, timeout)
        if "exceptionDetails" in result:
            raise DevToolsError(f"{expression[:80]}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not self.evaluate(expression):
            if time.monotonic() > deadline:
                raise DevToolsError(f"timed out waiting for {expression}")
            time.sleep(0.05)

    def hover(self, x: float, y: float) -> None:
        self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        time.sleep(0.15)  # plotly throttles hover handling

    def click(self, x: float, y: float) -> None:
        self.hover(x, y)
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left", "clickCount": 1})

    def key(self, key: str, code: str | None = None, key_code: int = 0) -> None:
        for kind in ("keyDown", "keyUp"):
            self.send("Input.dispatchKeyEvent", {"type": kind, "key": key, "code": code or key,
                                                 "windowsVirtualKeyCode": key_code})

    def screenshot(self, clip: dict[str, float] | None = None) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if clip is not None:
            params["clip"] = {**clip, "scale": 1}
        return base64.b64decode(self.send("Page.captureScreenshot", params)["data"])

    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (CSP violations included) so far."""
        out = []
        for event in self.browser.events:
            if event.get("sessionId") != self.session:
                continue
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                out.append(f"exception: {details.get('exception', {}).get('description') or details.get('text')}")
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                out.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in params.get("args", [])))
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                out.append(f"log: {params['entry'].get('text')}")
        return out

    def dialogs(self) -> list[str]:
        """Messages of alert/confirm/prompt dialogs the page opened."""
        return [e["params"].get("message", "") for e in self.browser.events
                if e.get("sessionId") == self.session and e.get("method") == "Page.javascriptDialogOpening"]

    def requests(self) -> list[str]:
        """URLs of every request the page made."""
        return [e["params"]["request"]["url"] for e in self.browser.events
                if e.get("sessionId") == self.session and e.get("method") == "Network.requestWillBeSent"]
