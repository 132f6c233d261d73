#!/usr/bin/env python3
"""The step-trace page (`loom trace view TRACE.json -o FILE.html`) in a real browser:
Debian's headless Chromium driven through ChromeDriver's W3C WebDriver protocol (plain
HTTP, Python's standard library only), as tests/plan/browser_timeline.py does.

Traces: `loom generate` of 32 tokens on models/default, two steps of `loom train` on
the test checkpoint (tests/data/train), and a synthetic trace of 200,000 events (4
threads of nested spans, async requests, a counter). Each page is self-contained (no
http:// or https:// reference), loads without a script error in the browser's console,
draws rows and spans, fills the summary tables (operations by self time, threads by
busy time), shows a tooltip naming the span, its category and duration when the
pointer moves over a span, and draws a zoomed-in view. The large page (sub-pixel spans
merged per pixel column) must load and draw; its times are printed, not judged. Saves
screenshots beside the build (trace_generate.png, trace_train.png, trace_large.png)
and prints page sizes, load and draw times.

usage: browser_trace.py LOOM_BINARY SOURCE_DIR OUT_DIR
Exits 77 (CTest's skip) when chromium or chromedriver is missing.
"""
import json
import os
import random
import shutil
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import webdriver  # noqa: E402 (tests/webdriver.py)

DEADLINE_S = 60


def run(args, what):
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (what, r.returncode, r.stderr))
    return r.stdout


def view(loom, trace, page):
    t = time.time()
    out = json.loads(run([loom, "trace", "view", trace, "-o", page], "loom trace view " + trace))
    with open(page, encoding="utf-8") as f:
        text = f.read()
    print("%s: %d bytes of trace -> %d bytes of page in %.2f s" % (os.path.basename(page), out["trace_bytes"],
                                                                   out["page_bytes"], time.time() - t))
    return text


def make_generate(loom, src, out):
    trace = os.path.join(out, "trace_generate.json")
    run([loom, "generate", "--model", os.path.join(src, "models", "default"), "--prompt", "Once upon a time",
         "--max-new", "32", "--threads", "2", "--trace", trace], "loom generate")
    return trace


def make_train(loom, src, out):
    data, run_dir = os.path.join(out, "trace_train.bin"), os.path.join(out, "trace_train_run")
    trace = os.path.join(out, "trace_train.json")
    d = os.path.join(src, "tests", "data", "train")
    run([loom, "data", "prepare", "--tokenizer", os.path.join(d, "tokenizer.json"), os.path.join(d, "corpus.txt"),
         "-o", data], "loom data prepare")
    shutil.rmtree(run_dir, ignore_errors=True)
    run([loom, "train", "--model", os.path.join(d, "loom_checkpoint"), "--data", data, "--out", run_dir, "--steps", "2",
         "--batch", "2", "--seq", "16", "--threads", "2", "--trace", trace], "loom train")
    return trace


def make_large(out, n=200000):
    """A synthetic trace: 4 threads of steps holding nested ops, async requests, a counter."""
    rnd = random.Random(1)
    ev = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": "synthetic"}}]
    per = n // 4
    for tid in range(1, 5):
        ev.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": tid, "args": {"name": "worker %d" % tid}})
        t, k = 0.0, 0
        while k < per:
            ops = 30
            step0 = t
            t += 1.0
            for j in range(ops):
                d = rnd.choice([0.2, 0.5, 1.5, 3.0])
                ev.append({"name": ["matmul", "attention", "rms_norm", "add"][j % 4], "cat": "op", "ph": "X",
                           "pid": 1, "tid": tid, "ts": t, "dur": d, "args": {"detail": "layers.%d" % (j // 4)}})
                t += d + 0.05
            ev.append({"name": "decode step", "cat": "generate", "ph": "X", "pid": 1, "tid": tid, "ts": step0,
                       "dur": t - step0})
            t += rnd.choice([0.5, 5.0])
            k += ops + 1
    for r in range(200):
        b = r * 40.0
        ev.append({"name": "request", "cat": "request", "ph": "b", "pid": 1, "tid": 1, "id": r, "ts": b})
        ev.append({"name": "request", "cat": "request", "ph": "e", "pid": 1, "tid": 1, "id": r, "ts": b + 150})
    for i in range(2000):
        ev.append({"name": "memory (bytes)", "cat": "memory", "ph": "C", "pid": 1, "tid": 1, "ts": i * 20.0,
                   "args": {"value": 1e6 + 1e3 * (i % 97)}})
    trace = os.path.join(out, "trace_large.json")
    with open(trace, "w") as f:
        json.dump({"traceEvents": ev}, f)
    return trace


def check_page(wd, s, path, text, shot, span):
    """Returns a list of failures (empty: ok)."""
    bad = []
    if "http://" in text or "https://" in text:
        bad.append("%s references the network" % path)
    if "<script src" in text or "<link" in text:
        bad.append("%s loads an external resource" % path)

    def js(script):
        return wd("POST", s + "/execute/sync", {"script": script, "args": []})

    t = time.time()
    wd("POST", s + "/url", {"url": "file://" + os.path.abspath(path)})
    deadline = time.time() + DEADLINE_S
    while not js("return !!(window.loomTrace && window.loomTrace.ready)"):
        if time.time() > deadline:
            return bad + ["%s: the page never became ready" % path]
        time.sleep(0.05)
    load_s = time.time() - t
    st = js("const t = window.loomTrace; return {rows: t.drawnRows, spans: t.drawnSpans, agg: t.aggregated,"
            " ready_ms: t.readyMs, tracks: t.tracks, events: t.data.events,"
            " ops: document.querySelectorAll('#ops tr').length, threads: document.querySelectorAll('#threads tr').length}")
    st["load_s"] = round(load_s, 2)
    print("%s: %s" % (os.path.basename(path), json.dumps(st)))
    if not st["rows"] or not (st["spans"] or st["agg"]):
        bad.append("%s: nothing drawn (%s)" % (path, st))
    if st["ops"] < 2 or st["threads"] < 2:
        bad.append("%s: the summary tables are empty (%s)" % (path, st))
    # the pointer over a span: the tooltip names it, its category and its duration
    pt = js("return window.loomTrace.findSpan(%s)" % json.dumps(span))
    for part in (50, 1000):  # zoomed in until one is wide enough to point at
        if not pt:
            pt = js("const t = window.loomTrace, d = t.data.wall; t.zoom(0, d / %d); return t.findSpan(%s)"
                    % (part, json.dumps(span)))
    if not pt:
        bad.append("%s: no visible '%s' span" % (path, span))
    else:
        tipt = js("const c = document.getElementById('cv');"
                  "c.dispatchEvent(new MouseEvent('mousemove', {clientX: %f, clientY: %f, bubbles: true}));"
                  "const t = document.getElementById('tip');"
                  "return t.style.display === 'block' ? t.textContent : ''" % (pt["x"], pt["y"]))
        print("tooltip:", (tipt or "").replace("\n", " | "))
        if span not in (tipt or "") or "duration" not in (tipt or "") or "depth" not in (tipt or ""):
            bad.append("%s: the tooltip over a '%s' span reads %r" % (path, span, tipt))
    js("window.loomTrace.fit(); document.getElementById('tip').style.display = 'none'; return 0")
    webdriver.screenshot(wd, s, shot)
    print("screenshot:", shot)
    # zoomed in to 1% of the trace and back: still drawn (the time is printed)
    z = js("const t = window.loomTrace, d = t.data.wall, a = performance.now(); t.zoom(d * 0.4, d * 0.41);"
           "const r = {ms: performance.now() - a, rows: t.drawnRows, spans: t.drawnSpans, agg: t.aggregated};"
           "const b = performance.now(); t.fit(); r.fit_ms = performance.now() - b; r.fit_agg = t.aggregated; return r")
    print("zoom: %s" % json.dumps(z))
    if not z["rows"]:  # draw times are printed, not judged (speed is not a test)
        bad.append("%s: zoomed view drew %s" % (path, z))
    severe = webdriver.severe_logs(wd, s)
    if severe:
        bad.append("%s: script errors: %s" % (path, severe))
    return bad


def main():
    loom, src, out = sys.argv[1:4]
    if webdriver.missing():
        print(webdriver.missing())
        return 77
    os.makedirs(out, exist_ok=True)
    pages = []
    for name, trace, span in (("generate", make_generate(loom, src, out), "matmul"),
                              ("train", make_train(loom, src, out), "forward"),
                              ("large", make_large(out), "matmul")):
        html = os.path.join(out, "trace_%s.html" % name)
        pages.append((html, view(loom, trace, html), os.path.join(out, "trace_%s.png" % name), span))
    with webdriver.session() as (wd, s):
        bad = []
        for path, text, shot, span in pages:
            bad += check_page(wd, s, path, text, shot, span)
    for b in bad:
        print("FAIL:", b)
    print("ok" if not bad else "FAIL")
    return 0 if not bad else 1

if __name__ == "__main__":
    sys.exit(main())
