#!/usr/bin/env bash
# The C and C++ sources in .clang-format's style, with the clang-format that
# CI pins (clang-format-14, Debian 12's: another version formats some
# constructs differently).
#   scripts/format.sh          check: list the files that differ, exit 1 if any
#   scripts/format.sh --fix    format them in place
set -euo pipefail
cd "$(dirname "$0")/.."
tool=${CLANG_FORMAT:-clang-format-14}
command -v "$tool" >/dev/null ||
  { echo "$0: $tool not found (scripts/install-deps.sh installs it)" >&2; exit 2; }
if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.c' '*.h' '*.cpp' '*.hpp')
else
  mapfile -t files < <(find core config observe wire interpose launcher tests -name '*.[ch]' -o -name '*.[ch]pp')
fi
if [ "${1:-}" = --fix ]; then
  "$tool" -i "${files[@]}"
  exit 0
fi
bad=()
for f in "${files[@]}"; do
  "$tool" --dry-run -Werror "$f" >/dev/null 2>&1 || bad+=("$f")
done
if [ ${#bad[@]} -gt 0 ]; then
  printf '%s\n' "${bad[@]}" >&2
  echo "$0: ${#bad[@]} of ${#files[@]} files differ from .clang-format's style: scripts/format.sh --fix" >&2
  exit 1
fi
echo "${#files[@]} files in .clang-format's style ($tool)"
