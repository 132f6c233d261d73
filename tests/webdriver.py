"""tests/webdriver.py - Debian's headless Chromium driven through ChromeDriver's W3C
WebDriver protocol (plain HTTP, Python's standard library only), shared by the browser
tests (tests/serve/browser_chat_page.py, tests/plan/browser_timeline.py,
tests/tools/browser_trace.py).

    with webdriver.session(window="1400,900") as (wd, s):   # None when chromium is missing
        wd("POST", s + "/url", {"url": "file:///..."})

wd(method, path, body) sends one command and returns its "value"; s is the session's
path prefix ("/session/ID"). missing() says what to install when the browser or the
driver is absent (the tests then exit 77, CTest's skip).
"""
import base64
import contextlib
import json
import shutil
import socket
import subprocess
import time
import urllib.request


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def binaries():
    """(chromium, chromedriver) paths, either None when not installed."""
    return shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")


def missing():
    """A skip message when chromium or chromedriver is missing, else None."""
    chromium, driver = binaries()
    if chromium and driver:
        return None
    return "skipped: chromium and chromedriver are needed (apt-get install chromium chromium-driver)"


def _command(base, method, path, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(base + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read().decode() or "{}").get("value")


@contextlib.contextmanager
def session(window="1400,900"):
    """Starts chromedriver and a headless Chromium session (console logs kept); yields
    (wd, session_path), and ends both however the block exits."""
    chromium, driver = binaries()
    port = free_port()
    drv = subprocess.Popen([driver, "--port=%d" % port], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = "http://127.0.0.1:%d" % port

    def wd(method, path, body=None):
        return _command(base, method, path, body)

    sid = None
    try:
        for _ in range(100):
            try:
                wd("GET", "/status")
                break
            except OSError:
                time.sleep(0.1)
        caps = {"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium,
                                   "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                            "--window-size=" + window]},
            "goog:loggingPrefs": {"browser": "ALL"}}}}
        sid = wd("POST", "/session", caps)["sessionId"]
        yield wd, "/session/" + sid
    finally:
        if sid:
            try:
                wd("DELETE", "/session/" + sid)
            except OSError:
                pass
        drv.terminate()
        drv.wait(timeout=10)


def severe_logs(wd, s):
    """The browser console's SEVERE entries (script errors) since the last call."""
    try:
        logs = wd("POST", s + "/se/log", {"type": "browser"}) or []
    except OSError:
        logs = []
    return [entry for entry in logs if entry.get("level") == "SEVERE"]


def screenshot(wd, s, path):
    with open(path, "wb") as f:
        f.write(base64.b64decode(wd("GET", s + "/screenshot")))
