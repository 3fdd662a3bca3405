#!/usr/bin/env bash
# Prepare the training corpus of the embedded demo model: the King James Bible as packaged by Debian
# (bible-kjv-text, read with the package's own `bible` program), one verse per line:
#     Genesis 1:1<TAB>In the beginning God created the heaven and the earth.
# Output: .train_tiny/corpus/kjv.txt and SOURCE.json (package versions, size, sha256) in the repository
# root. The folder is git-ignored and travels with the training run as a carried path.
# Deterministic: the same package version gives the same bytes (checked: 31102 verses, 66 books).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT_DIR="${1:-$ROOT/.train_tiny/corpus}"
OUT="$OUT_DIR/kjv.txt"

if ! command -v bible >/dev/null 2>&1 || ! dpkg-query -W -f='${Status}' bible-kjv-text 2>/dev/null | grep -q 'install ok installed'; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "prepare_corpus: installing bible-kjv (Debian)" >&2
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -qq --no-install-recommends bible-kjv >/dev/null || {
    $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends bible-kjv >/dev/null; }
fi

VER_TOOL="$(dpkg-query -W -f='${Version}' bible-kjv)"
VER_TEXT="$(dpkg-query -W -f='${Version}' bible-kjv-text)"
mkdir -p "$OUT_DIR"
TMP="$(mktemp)"
trap 'rm -f "$TMP"' EXIT

# -f turns pretty-printing off: one verse per line, each preceded by its reference ("Ge1:1 In the ...").
# A clean environment keeps COLUMNS, HOME rc files and the locale out of the output.
env -i PATH=/usr/bin:/bin LC_ALL=C bible -f "Gen1:1-Rev22:21" > "$TMP"

# The program's book abbreviations, in canonical order, mapped to the usual KJV book names. Runs of
# spaces inside a verse (two verses have them) are collapsed; nothing else in the text is changed.
LC_ALL=C awk -v OFS='\t' '
BEGIN {
  n = split("Ge Exo Lev Num Deu Josh Jdgs Ruth 1Sm 2Sm 1Ki 2Ki 1Chr 2Chr Ezra Neh Est Job Psa Prv Eccl SSol Isa Jer Lam Eze Dan Hos Joel Amos Obad Jonah Mic Nahum Hab Zep Hag Zec Mal Mat Mark Luke John Acts Rom 1Cor 2Cor Gal Eph Phi Col 1Th 2Th 1Tim 2Tim Titus Phmn Heb Jas 1Pet 2Pet 1Jn 2Jn 3Jn Jude Rev", ab, " ")
  m = split("Genesis|Exodus|Leviticus|Numbers|Deuteronomy|Joshua|Judges|Ruth|1 Samuel|2 Samuel|1 Kings|2 Kings|1 Chronicles|2 Chronicles|Ezra|Nehemiah|Esther|Job|Psalms|Proverbs|Ecclesiastes|Song of Solomon|Isaiah|Jeremiah|Lamentations|Ezekiel|Daniel|Hosea|Joel|Amos|Obadiah|Jonah|Micah|Nahum|Habakkuk|Zephaniah|Haggai|Zechariah|Malachi|Matthew|Mark|Luke|John|Acts|Romans|1 Corinthians|2 Corinthians|Galatians|Ephesians|Philippians|Colossians|1 Thessalonians|2 Thessalonians|1 Timothy|2 Timothy|Titus|Philemon|Hebrews|James|1 Peter|2 Peter|1 John|2 John|3 John|Jude|Revelation", nm, "|")
  if (n != 66 || m != 66) { print "book table broken" > "/dev/stderr"; exit 2 }
  for (i = 1; i <= n; i++) name[ab[i]] = nm[i]
}
{
  if (!match($0, /^[0-9]?[A-Za-z]+[0-9]+:[0-9]+ /)) { print "unexpected line " NR ": " $0 > "/dev/stderr"; exit 2 }
  ref = substr($0, 1, RLENGTH - 1); text = substr($0, RLENGTH + 1)
  match(ref, /^[0-9]?[A-Za-z]+/); book = substr(ref, 1, RLENGTH); cv = substr(ref, RLENGTH + 1)
  if (!(book in name)) { print "unknown book " book " at line " NR > "/dev/stderr"; exit 2 }
  gsub(/  +/, " ", text); sub(/ +$/, "", text)
  print name[book] " " cv, text
}' "$TMP" > "$OUT"

VERSES="$(wc -l < "$OUT")"
BOOKS="$(cut -f1 "$OUT" | sed -E 's/ [0-9]+:[0-9]+$//' | uniq | wc -l)"
if [ "$VERSES" -ne 31102 ] || [ "$BOOKS" -ne 66 ]; then
  echo "prepare_corpus: expected 31102 verses in 66 books, got $VERSES in $BOOKS" >&2
  exit 1
fi
BYTES="$(wc -c < "$OUT")"
SHA="$(sha256sum "$OUT" | cut -d' ' -f1)"
cp /usr/share/doc/bible-kjv-text/copyright "$OUT_DIR/copyright.bible-kjv-text"
cat > "$OUT_DIR/SOURCE.json" <<JSON
{
  "file": "kjv.txt",
  "format": "one verse per line: reference TAB text",
  "packages": {"bible-kjv": "$VER_TOOL", "bible-kjv-text": "$VER_TEXT"},
  "command": "bible -f Gen1:1-Rev22:21",
  "verses": $VERSES,
  "books": $BOOKS,
  "bytes": $BYTES,
  "sha256": "$SHA"
}
JSON
echo "prepare_corpus: $OUT"
echo "  bible-kjv $VER_TOOL / bible-kjv-text $VER_TEXT, $VERSES verses, $BOOKS books"
echo "  size   $BYTES bytes"
echo "  sha256 $SHA"
