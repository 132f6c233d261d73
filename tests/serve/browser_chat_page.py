#!/usr/bin/env python3
"""The chat page in a real browser: `loom serve` on a tiny random model, Debian's
headless Chromium driven through ChromeDriver's W3C WebDriver protocol (plain HTTP,
Python's standard library only). The page loads, names the model, sends a message,
and the streamed reply appears and completes with no error bubble and no script
error in the browser's console. Saves a screenshot beside the build
(chat_page.png).

usage: browser_chat_page.py LOOM_BINARY SOURCE_DIR OUT_DIR
Exits 77 (CTest's skip) when chromium or chromedriver is missing.
"""
import json
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import webdriver  # noqa: E402 (tests/webdriver.py)

DEADLINE_S = 120


def make_model_dir(src, out):
    d = os.path.join(out, "browser_chat_model")
    os.makedirs(d, exist_ok=True)
    for name, target in (("config.json", "tests/data/models/qwen3_headdim/config.json"),
                         ("model.safetensors", "tests/data/models/qwen3_headdim/model.safetensors"),
                         ("tokenizer.json", "tests/data/train/tokenizer.json")):
        p = os.path.join(d, name)
        if os.path.lexists(p):
            os.unlink(p)
        os.symlink(os.path.join(src, target), p)
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump({"chat_template": "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>\n{% endfor %}"
                                    "{% if add_generation_prompt %}<assistant>{% endif %}"}, f)
    return d


def main():
    loom, src, out = sys.argv[1:4]
    if webdriver.missing():
        print(webdriver.missing())
        return 77
    model = make_model_dir(src, out)
    server = subprocess.Popen([loom, "serve", "--model", model, "--port", "0", "--slots", "2", "--context", "256"],
                              stderr=subprocess.PIPE, text=True)
    try:
        port = None
        t0 = time.time()
        for line in server.stderr:  # "listening on http://127.0.0.1:PORT"
            sys.stderr.write(line)
            m = re.search(r"listening on http://[\d.]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
            if time.time() - t0 > DEADLINE_S:
                break
        if not port:
            print("FAIL: the server did not start")
            return 1
        return browse(port, out)
    finally:
        server.terminate()  # SIGTERM: the server stops cleanly
        try:
            STOPPED[0] = server.wait(timeout=30)
            if STOPPED[0] != 0:
                print("FAIL: loom serve exited %d after SIGTERM" % STOPPED[0])
        except subprocess.TimeoutExpired:
            server.kill()
            print("FAIL: loom serve did not stop within 30 s of SIGTERM")


def browse(port, out):
    """The page at the server's port: names the model, streams a reply to a message."""
    with webdriver.session(window="1000,700") as (wd, s):
        def js(script):
            return wd("POST", s + "/execute/sync", {"script": script, "args": []})

        wd("POST", s + "/url", {"url": "http://127.0.0.1:%d/" % port})
        deadline = time.time() + DEADLINE_S
        while "tiny" not in (js("return document.getElementById('model').textContent") or "") \
                and "browser_chat_model" not in (js("return document.getElementById('model').textContent") or ""):
            if time.time() > deadline:
                print("FAIL: the page never named the model")
                return 1
            time.sleep(0.1)
        # temperature 0, a short reply, then type a message and press Send
        js("document.getElementById('temperature').value = '0'; document.getElementById('max_tokens').value = '24';")
        el = wd("POST", s + "/element", {"using": "css selector", "value": "#input"})
        key = next(iter(el))
        wd("POST", s + "/element/%s/value" % el[key], {"text": "Hello, loom!"})
        btn = wd("POST", s + "/element", {"using": "css selector", "value": "#send"})
        wd("POST", s + "/element/%s/click" % btn[key], {})
        state = None
        while time.time() < deadline:
            state = js("const a = document.querySelectorAll('.assistant'); const e = document.querySelectorAll('.error');"
                       "return {n: a.length, state: a.length ? a[a.length-1].dataset.state : null,"
                       " text: a.length ? a[a.length-1].textContent : '', errors: Array.from(e).map(x => x.textContent),"
                       " user: Array.from(document.querySelectorAll('.user')).map(x => x.textContent)}")
            if state["errors"] or state["state"] == "done":
                break
            time.sleep(0.1)
        webdriver.screenshot(wd, s, os.path.join(out, "chat_page.png"))
        print("page state:", json.dumps(state))
        ok = (state and state["n"] == 1 and state["state"] == "done" and not state["errors"]
              and len(state["text"]) > 0 and state["user"] == ["Hello, loom!"])
        # the browser's console: no script errors
        severe = webdriver.severe_logs(wd, s)
        if severe:
            print("FAIL: script errors:", severe)
            ok = False
        print("screenshot:", os.path.join(out, "chat_page.png"))
        print("ok" if ok else "FAIL: the reply did not stream into the page")
        return 0 if ok else 1


STOPPED = [None]  # loom serve's exit status after SIGTERM

if __name__ == "__main__":
    rc = main()
    sys.exit(rc if rc != 0 or STOPPED[0] == 0 else 1)
