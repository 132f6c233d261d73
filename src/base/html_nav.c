/* base/html_nav.c — the zoom and pan code the two timeline pages share (the plan
 * timeline, plan/timeline.c, and the step-trace page, base/trace_view.c): JavaScript
 * lines spliced into each page where its template holds lm__html_nav_marker.
 *
 * The page provides, in the same function scope: the view t0, t1 (time units of its
 * axis) over [0, total], MINW (the narrowest view), pending (a redraw is queued), drag,
 * the canvas cv and its scroller sc, T(x) (time at a canvas x), plotW() (the plot's
 * width in pixels), draw(), $(id), and buttons #fit, #zin, #zout. It gets redraw(),
 * clampPan(), zoom(f, at) and fit(), and the handlers: ctrl/alt+wheel zooms around the
 * pointer, shift+wheel or a horizontal wheel pans, dragging pans (the page's own
 * mousedown starts a drag), double-click zooms in (shift: out), + - 0 keys.
 */
#include "base/internal.h"

const char lm__html_nav_marker[] = "<!-- navigation -->";

const char *const lm__html_nav_js[] = {
    "function redraw() { if (!pending) { pending = true; requestAnimationFrame(draw); } }\n",
    "function clampPan() { var w = t1 - t0; if (t0 < 0) t0 = 0; if (t0 + w > total) t0 = Math.max(0, total - w); t1 = t0 + w; }\n",
    "function zoom(f, at) {\n",
    "  var ta = T(at === undefined ? LABELW + plotW() / 2 : at), w = Math.min(total, Math.max(MINW, (t1 - t0) * f));\n",
    "  t0 = ta - (ta - t0) * w / (t1 - t0); t1 = t0 + w; clampPan(); redraw();\n",
    "}\n",
    "function fit() { t0 = 0; t1 = total; redraw(); }\n",
    "window.addEventListener('mouseup', function () { drag = null; });\n",
    "cv.addEventListener('dblclick', function (ev) { var rc = cv.getBoundingClientRect(); zoom(ev.shiftKey ? 2 : 0.5, ev.clientX - rc.left); });\n",
    "sc.addEventListener('wheel', function (ev) {\n",
    "  var rc = cv.getBoundingClientRect();\n",
    "  if (ev.ctrlKey || ev.metaKey || ev.altKey) { ev.preventDefault(); zoom(ev.deltaY > 0 ? 1.25 : 0.8, ev.clientX - rc.left); }\n",
    "  else if (ev.shiftKey || Math.abs(ev.deltaX) > Math.abs(ev.deltaY)) {\n",
    "    ev.preventDefault(); var d = (ev.shiftKey ? ev.deltaY : ev.deltaX) * (t1 - t0) / plotW(); t0 += d; t1 += d; clampPan(); redraw();\n",
    "  }\n",
    "}, {passive: false});\n",
    "sc.addEventListener('scroll', redraw);\n",
    "window.addEventListener('resize', redraw);\n",
    "window.addEventListener('keydown', function (ev) {\n",
    "  if (ev.key === '+' || ev.key === '=') zoom(0.5); else if (ev.key === '-') zoom(2); else if (ev.key === '0') fit();\n",
    "});\n",
    "$('fit').onclick = fit;\n",
    "$('zin').onclick = function () { zoom(0.5); };\n",
    "$('zout').onclick = function () { zoom(2); };\n",
    NULL};
