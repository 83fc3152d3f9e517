#!/usr/bin/env bash
# The user-facing docs (README.md, docs/*.md) stand on their own: they name no file outside the
# checkout (the team's shared/ notes or specs/, an absolute /work path) and every relative link
# resolves to a file of the checkout. Usage: standalone_test.sh SOURCE_DIR. Exit 1 on a finding,
# each printed as FILE:LINE: what.
set -euo pipefail

if [[ $# -ne 1 || ! -d "$1" ]]; then
  echo "usage: $0 SOURCE_DIR" >&2
  exit 2
fi
src=$(cd "$1" && pwd)
cd "$src"

files=(README.md)
shopt -s nullglob
for f in docs/*.md; do files+=("$f"); done
shopt -u nullglob
for f in "${files[@]}"; do
  [[ -f "$f" ]] || { echo "$f: missing" >&2; exit 1; }
done

findings=0
report() {  # FILE LINE WHAT
  echo "$1:$2: $3"
  findings=$((findings + 1))
}

# 1. Paths outside the checkout, anywhere in the text (code spans and blocks included):
#    a path that starts with shared/ (or ./shared, ../shared), and an absolute /work path.
outside='(^|[^[:alnum:]_.~/-])shared/|(^|[^[:alnum:]_.~-])(\.\.?/)+shared([^[:alnum:]_.-]|$)'
outside+='|(^|[^[:alnum:]_.~-])/work([^[:alnum:]_.-]|$)'
for f in "${files[@]}"; do
  while IFS=: read -r line text; do
    report "$f" "$line" "names a file outside the checkout: ${text}"
  done < <(grep -nE -- "$outside" "$f" || true)
done

# 1b. The team's spec folder by its short name (`specs/quant.md`): outside the checkout unless
#     the checkout has that file (relative to its root or to the page).
for f in "${files[@]}"; do
  dir=$(dirname "$f")
  while IFS=: read -r line match; do
    path=${match#"${match%%specs/*}"}
    path=${path%.}
    if [[ ! -e "$path" && ! -e "$dir/$path" ]]; then
      report "$f" "$line" "names a file outside the checkout: $path"
    fi
  done < <(grep -noE -- '(^|[^[:alnum:]_.~/-])specs/[[:alnum:]_./-]+' "$f" || true)
done

# 2. Relative markdown links, outside code blocks and code spans: `](target)` must name a file
#    or folder of the checkout, relative to the page (a trailing #anchor or ?query is dropped;
#    URLs with a scheme and bare #anchors are not checked).
for f in "${files[@]}"; do
  dir=$(dirname "$f")
  while IFS=$'\t' read -r line target; do
    target=${target#<}
    target=${target%>}
    case "$target" in
      '' | '#'*) continue ;;
    esac
    if [[ "$target" =~ ^[A-Za-z][A-Za-z0-9+.-]*: ]]; then
      continue  # http:, https:, mailto:, ...
    fi
    path=${target%%#*}
    path=${path%%\?*}
    [[ -n "$path" ]] || continue
    if [[ "$path" == /* ]]; then
      report "$f" "$line" "link ($target) is an absolute path, not one relative to the page"
      continue
    fi
    resolved=$(realpath -m -- "$dir/$path")
    if [[ "$resolved" != "$src" && "$resolved" != "$src"/* ]]; then
      report "$f" "$line" "link ($target) leaves the checkout"
    elif [[ ! -e "$resolved" ]]; then
      report "$f" "$line" "link ($target) names no file of the checkout"
    fi
  done < <(awk '
    /^[[:space:]]*(```|~~~)/ { fence = !fence; next }
    fence { next }
    {
      s = $0
      gsub(/`[^`]*`/, "", s)
      while (match(s, /\]\([^)[:space:]]*/)) {
        printf "%d\t%s\n", NR, substr(s, RSTART + 2, RLENGTH - 2)
        s = substr(s, RSTART + RLENGTH)
      }
    }' "$f")
done

if ((findings > 0)); then
  echo "docs_standalone: ${findings} finding(s) in README.md and docs/*.md" >&2
  exit 1
fi
echo "docs_standalone: ${#files[@]} files, no path outside the checkout, every relative link resolves"
