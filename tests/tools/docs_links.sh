#!/usr/bin/env bash
# docs_links.sh [repo root]: checks the documentation (README.md and docs/*.md).
#   1. Every relative link, [text](path) or [text](path#anchor) (images and reference-style
#      definitions "[id]: path" too), names a file or directory that exists, relative to the
#      file that links it (a path starting with / is taken from the repository's root, as
#      GitHub does). Links with a scheme (http:, https:, mailto:, ...) and pure #anchors are
#      not checked; nor is anything inside `code` or a fenced code block.
#   2. README.md has at most 250 lines.
#   3. No document uses internal shorthand: "seed 00" or "issue notes" (any case).
# Prints each failure and exits 1 if there is any; otherwise prints a summary and exits 0.
# The root defaults to this script's ../.. (the repository).
set -uo pipefail

ROOT=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
if [ ! -f "$ROOT/README.md" ]; then
  echo "docs_links: no README.md in $ROOT" >&2
  exit 2
fi
README_MAX=250

files=("$ROOT/README.md")
shopt -s nullglob
files+=("$ROOT"/docs/*.md)
shopt -u nullglob

fail=0
nlinks=0
report() {
  echo "FAIL $*"
  fail=$((fail + 1))
}

# Prints "<line number> <target>" for each link target in a markdown file: outside fenced
# code blocks, with inline code spans removed, the target's first word (a title after it is
# dropped, <...> unwrapped).
links_of() {
  awk '
    /^[ \t]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    {
      line = $0
      gsub(/`[^`]*`/, "", line)
      # Reference-style definition: [id]: target
      if (match(line, /^[ \t]*\[[^\]]+\]:[ \t]*[^ \t]+/)) {
        def = substr(line, RSTART, RLENGTH)
        sub(/^[ \t]*\[[^\]]+\]:[ \t]*/, "", def)
        print NR " " def
        next
      }
      while (match(line, /\[[^\]]*\]\([^)]*\)/)) {
        link = substr(line, RSTART, RLENGTH)
        line = substr(line, RSTART + RLENGTH)
        sub(/^\[[^\]]*\]\(/, "", link)
        sub(/\)$/, "", link)
        sub(/^[ \t]+/, "", link)
        if (link ~ /^</) { sub(/^</, "", link); sub(/>.*$/, "", link) }
        else sub(/[ \t].*$/, "", link)
        print NR " " link
      }
    }
  ' "$1"
}

for f in "${files[@]}"; do
  rel=${f#"$ROOT"/}
  dir=$(dirname "$f")
  while read -r lineno target; do
    [ -n "${target:-}" ] || continue
    case "$target" in
      '#'*) continue ;;                                # an anchor in this file
    esac
    if [[ $target =~ ^[A-Za-z][A-Za-z0-9+.-]*: ]]; then
      continue                                         # http:, https:, mailto:, ...
    fi
    nlinks=$((nlinks + 1))
    path=${target%%#*}
    path=${path%%\?*}
    path=${path//%20/ }
    [ -n "$path" ] || continue
    base=$dir
    [ "${path#/}" != "$path" ] && base=$ROOT          # /path: from the repository's root
    if [ ! -e "$base/$path" ]; then
      report "$rel:$lineno: broken link: $target (no $(realpath -m "$base/$path" --relative-to="$ROOT"))"
    fi
  done < <(links_of "$f")
done

readme_lines=$(awk 'END { print NR }' "$ROOT/README.md")
if [ "$readme_lines" -gt "$README_MAX" ]; then
  report "README.md: $readme_lines lines, more than $README_MAX"
fi

for f in "${files[@]}"; do
  rel=${f#"$ROOT"/}
  while IFS= read -r hit; do
    report "$rel:${hit%%:*}: internal shorthand: ${hit#*:}"
  done < <(grep -n -i -E 'seed 00|issue notes' "$f")
done

if [ "$fail" -gt 0 ]; then
  echo "docs_links: $fail failure(s)"
  exit 1
fi
echo "docs_links: ${#files[@]} files, $nlinks relative links resolve, README.md $readme_lines lines (max $README_MAX), no internal shorthand"
exit 0
