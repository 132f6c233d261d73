#!/usr/bin/env python3
"""validate_trace.py - checks a file against the Chrome trace-event format as loom writes it.

    python3 tests/tools/validate_trace.py TRACE.json [--expect NAME[,NAME...]] [--quiet]

Checks (standard library only; numbers are read as exact decimals, so nesting is judged
in loom's nanosecond digits without float rounding):
  - the top level is {"traceEvents": [...]} (or a bare array of events);
  - every event is an object with a string "name", a "ph" among the known phases, and
    integer "pid" and "tid" (async events may omit tid); every event but metadata ("M")
    has a numeric "ts" in microseconds;
  - "X" events have a numeric "dur" >= 0, and on each (pid, tid) they nest: sorted by
    start (longest first on ties) each span lies wholly inside the open span it starts
    in, never partly overlapping it;
  - "B"/"E" pairs on each (pid, tid) match by name and nest like a stack, with "ts"
    non-decreasing in file order, and none is left open;
  - async "b"/"e" events match by (cat, id): each "e" closes the innermost open span of
    its (cat, id) with the same name, "ts" non-decreasing per (cat, id) in file order, and
    none is left open; "n" points fall inside an open span of their (cat, id);
  - counters ("C") have an "args" object of numeric values;
  - metadata ("M") thread_name / process_name events carry args.name as a string;
  - with --expect, each listed name appears as an event name.
Prints "ok: N events ..." and exits 0, or prints each problem (up to 20) and exits 1.
"""
import decimal
import json
import sys

PHASES = set("BEXiIbenCMsftPONDRcv") | {"(", ")"}


def number(x):
    return isinstance(x, (int, decimal.Decimal)) and not isinstance(x, bool)


def check(events, expect):
    errors = []

    def err(i, msg):
        if len(errors) < 20:
            errors.append("event %d: %s" % (i, msg))

    spans = {}     # (pid, tid) -> [(start, end, index)]
    stacks = {}    # (pid, tid) -> [(name, index)] open B events
    last_be = {}   # (pid, tid) -> last B/E ts
    astack = {}    # (cat, id) -> [name] open async spans
    last_async = {}
    names = set()
    for i, e in enumerate(events):
        if not isinstance(e, dict):
            err(i, "not an object")
            continue
        name, ph = e.get("name"), e.get("ph")
        if not isinstance(name, str):
            err(i, "no string name")
            continue
        names.add(name)
        if ph not in PHASES:
            err(i, "unknown phase %r" % (ph,))
            continue
        if not isinstance(e.get("pid"), int) or (ph not in "bne" and not isinstance(e.get("tid"), int)):
            err(i, "%r: pid/tid missing or not integers" % name)
            continue
        if ph == "M":
            args = e.get("args")
            if name in ("thread_name", "process_name") and not (isinstance(args, dict) and isinstance(args.get("name"), str)):
                err(i, "%s without args.name" % name)
            continue
        ts = e.get("ts")
        if not number(ts):
            err(i, "%r (%s): ts missing or not a number" % (name, ph))
            continue
        key = (e["pid"], e.get("tid"))
        if ph == "X":
            dur = e.get("dur")
            if not number(dur) or dur < 0:
                err(i, "%r: X without a dur >= 0" % name)
                continue
            spans.setdefault(key, []).append((ts, ts + dur, i, name))
        elif ph in "BE":
            if ts < last_be.get(key, ts):
                err(i, "%r: %s ts %s before the previous B/E %s on pid %s tid %s" % (name, ph, ts, last_be[key], *key))
            last_be[key] = ts
            st = stacks.setdefault(key, [])
            if ph == "B":
                st.append((name, i))
            elif not st:
                err(i, "%r: E without an open B" % name)
            elif st[-1][0] != name:
                err(i, "E %r closes B %r (event %d): bad nesting" % (name, st[-1][0], st[-1][1]))
                st.pop()
            else:
                st.pop()
        elif ph in "bne":
            cat, aid = e.get("cat"), e.get("id", e.get("id2"))
            if aid is None:
                err(i, "%r: async event without id" % name)
                continue
            akey = (cat, json.dumps(aid, default=str))
            if ts < last_async.get(akey, ts):
                err(i, "%r: async %s ts %s before the previous %s of id %s" % (name, ph, ts, last_async[akey], aid))
            last_async[akey] = ts
            st = astack.setdefault(akey, [])
            if ph == "b":
                st.append(name)
            elif ph == "n":
                if not st:
                    err(i, "%r: async point outside any open span of id %s" % (name, aid))
            elif not st:
                err(i, "%r: async end without a begin (cat %r, id %s)" % (name, cat, aid))
            elif st[-1] != name:
                err(i, "async end %r closes %r (cat %r, id %s): bad nesting" % (name, st[-1], cat, aid))
                st.pop()
            else:
                st.pop()
        elif ph == "C":
            args = e.get("args")
            if not isinstance(args, dict) or not args or not all(number(v) for v in args.values()):
                err(i, "%r: counter without numeric args" % name)
    for key, st in stacks.items():
        for name, i in st:
            err(i, "B %r on pid %s tid %s never ends" % (name, *key))
    for akey, st in astack.items():
        for name in st:
            err(-1, "async span %r (cat %r, id %s) never ends" % (name, *akey))
    for key, lst in spans.items():
        lst.sort(key=lambda s: (s[0], -(s[1] - s[0]), s[2]))
        open_ = []
        for start, end, i, name in lst:
            while open_ and open_[-1][1] <= start:
                open_.pop()
            if open_ and end > open_[-1][1]:
                p = open_[-1]
                err(i, "X %r [%s, %s] overlaps X %r [%s, %s] (event %d) on pid %s tid %s without nesting"
                    % (name, start, end, p[3], p[0], p[1], p[2], *key))
                continue
            open_.append((start, end, i, name))
    for name in expect:
        if name not in names:
            errors.append("no event named %r" % name)
    return errors, names


def main(argv):
    expect, quiet, path = [], False, None
    args = iter(argv[1:])
    for a in args:
        if a == "--expect":
            expect += [n for n in next(args, "").split(",") if n]
        elif a == "--quiet":
            quiet = True
        elif path is None:
            path = a
        else:
            print("usage: validate_trace.py TRACE.json [--expect NAME,...] [--quiet]", file=sys.stderr)
            return 2
    if path is None:
        print("usage: validate_trace.py TRACE.json [--expect NAME,...] [--quiet]", file=sys.stderr)
        return 2
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f, parse_float=decimal.Decimal)
    except (OSError, ValueError) as e:
        print("%s: not valid JSON: %s" % (path, e))
        return 1
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        print("%s: no traceEvents array" % path)
        return 1
    errors, names = check(events, expect)
    if errors:
        for e in errors:
            print("%s: %s" % (path, e))
        return 1
    if not quiet:
        print("ok: %d events, %d names" % (len(events), len(names)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
