#!/usr/bin/env python3
"""The plan timeline page (`loom plan ... --timeline FILE.html`) in a real browser:
Debian's headless Chromium driven through ChromeDriver's W3C WebDriver protocol (plain
HTTP, Python's standard library only), for a small plan (the MLP on small16, simulated)
and an ipu21 plan (the SigLIP MLP, 1,472 tiles, predicted schedule). Each page is
self-contained (no http:// or https:// reference), loads without a script error in
the browser's console, draws rows and spans, shows a tooltip naming the kernel and
its mid-program op when the pointer moves over a matmul span, and still draws with
every group expanded (the ipu21 page: 1,472 tile rows, spans narrower than a pixel
aggregated). Saves screenshots beside the build (plan_timeline_small.png,
plan_timeline_ipu21.png) and prints load and draw times.

usage: browser_timeline.py LOOM_BINARY OUT_DIR
Exits 77 (CTest's skip) when chromium or chromedriver is missing.
"""
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import webdriver  # noqa: E402 (tests/webdriver.py)

DEADLINE_S = 60


def make_page(loom, out, name, args):
    path = os.path.join(out, name)
    r = subprocess.run([loom, "plan"] + args + ["--threads", "2", "--timeline", path],
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=600)
    if r.returncode != 0 or not os.path.exists(path):
        raise RuntimeError("loom plan %s failed (%d): %s" % (" ".join(args), r.returncode, r.stderr))
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return path, text


def check_page(wd, s, path, text, shot, expand_rows):
    """Returns a list of failures (empty: ok)."""
    bad = []
    if "http://" in text or "https://" in text:
        bad.append("%s references the network" % path)

    def js(script):
        return wd("POST", s + "/execute/sync", {"script": script, "args": []})

    wd("POST", s + "/url", {"url": "file://" + os.path.abspath(path)})
    deadline = time.time() + DEADLINE_S
    while not js("return !!(window.loomTimeline && window.loomTimeline.ready)"):
        if time.time() > deadline:
            return bad + ["%s: the page never became ready" % path]
        time.sleep(0.05)
    st = js("const t = window.loomTimeline; return {rows: t.drawnRows, spans: t.drawnSpans, agg: t.aggregated,"
            " ready_ms: t.readyMs, groups: t.data.groups.length, tiles: t.data.tiles,"
            " gap: document.querySelectorAll('#gapbar rect').length}")
    print("%s: %s" % (os.path.basename(path), json.dumps(st)))
    if not st["rows"] or not st["spans"]:
        bad.append("%s: nothing drawn (%s)" % (path, st))
    if not st["gap"]:
        bad.append("%s: the gap strip is empty" % path)
    # the pointer over a matmul span: the tooltip names the kernel and its mid-program op
    pt = js("return window.loomTimeline.findSpan('matmul')")
    if not pt:
        bad.append("%s: no visible matmul span" % path)
    else:
        tipt = js("const c = document.getElementById('cv');"
                  "c.dispatchEvent(new MouseEvent('mousemove', {clientX: %f, clientY: %f, bubbles: true}));"
                  "const t = document.getElementById('tip');"
                  "return t.style.display === 'block' ? t.textContent : ''" % (pt["x"], pt["y"]))
        print("tooltip:", (tipt or "").replace("\n", " | "))
        if "matmul" not in (tipt or "") or "mid op" not in (tipt or "") or "cycles" not in (tipt or ""):
            bad.append("%s: the tooltip over a matmul span reads %r" % (path, tipt))
    webdriver.screenshot(wd, s, shot)
    print("screenshot:", shot)
    # every group expanded: one row per tile, still drawn (the time is printed)
    ex = js("const t = window.loomTimeline; t.expandAll(); const a = performance.now(); t.draw();"
            "const ms = performance.now() - a; const r = {rows: t.drawnRows, spans: t.drawnSpans, agg: t.aggregated, ms: ms};"
            "const sc = document.getElementById('scroller'); sc.scrollTop = sc.scrollHeight; t.draw();"
            "r.bottom_rows = t.drawnRows; r.scroll_px = sc.scrollTop; sc.scrollTop = 0; t.draw(); return r")
    print("expanded: %s" % json.dumps(ex))
    if not ex["rows"] or not ex["bottom_rows"]:  # its draw time is printed, not judged (speed is not a test)
        bad.append("%s: expanded view drew %s" % (path, ex))
    if expand_rows and ex["rows"] < expand_rows:
        bad.append("%s: expanded view drew only %d rows" % (path, ex["rows"]))
    severe = webdriver.severe_logs(wd, s)
    if severe:
        bad.append("%s: script errors: %s" % (path, severe))
    return bad


def main():
    loom, out = sys.argv[1:3]
    if webdriver.missing():
        print(webdriver.missing())
        return 77
    os.makedirs(out, exist_ok=True)
    pages = []
    t = time.time()
    pages.append(make_page(loom, out, "plan_timeline_small.html",
                           ["mlp", "--machine", "small16", "--tokens", "64", "--width", "96", "--hidden", "160"]) +
                 (os.path.join(out, "plan_timeline_small.png"), 0))
    pages.append(make_page(loom, out, "plan_timeline_ipu21.html", ["mlp", "--machine", "ipu21", "--no-sim"]) +
                 (os.path.join(out, "plan_timeline_ipu21.png"), 20))
    print("pages written in %.1f s: %s" % (time.time() - t, ", ".join("%s (%d bytes)" % (p[0], len(p[1]))
                                                                   for p in pages)))
    with webdriver.session() as (wd, s):
        bad = []
        for path, text, shot, rows in pages:
            bad += check_page(wd, s, path, text, shot, rows)
    for b in bad:
        print("FAIL:", b)
    print("ok" if not bad else "FAIL")
    return 0 if not bad else 1

if __name__ == "__main__":
    sys.exit(main())
