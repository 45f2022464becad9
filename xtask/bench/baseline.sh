#!/usr/bin/env bash
# The bench's baseline: the usual shell autosave the source document describes. inotifywait
# watches the project recursively, an --exclude regex built from .gitignore drops the events of
# ignored paths, a loop waits until no event has arrived for the settle time, then
# `git add -A && git commit && git push`.
#
# Usage: baseline.sh DIR [SETTLE_SECONDS (3)] [REMOTE (project)] [BRANCH (main)]
# Ready when inotifywait prints "Watches established." on stderr.
set -uo pipefail

dir=${1:?usage: baseline.sh DIR [SETTLE_SECONDS] [REMOTE] [BRANCH]}
settle=${2:-3}
remote=${3:-project}
branch=${4:-main}
cd "$dir" || exit 2

# One ERE alternative per .gitignore pattern, anchored at a path component, so that
# `node_modules/` drops ./node_modules/a/b.js and ./pkg/node_modules/c.js alike.
alternatives='\.git'
if [ -f .gitignore ]; then
  while IFS= read -r pattern || [ -n "$pattern" ]; do
    pattern=${pattern%$'\r'}
    case $pattern in '' | '#'* | '!'*) continue ;; esac
    pattern=${pattern#/}
    pattern=${pattern%/}
    pattern=$(printf '%s' "$pattern" | sed -e 's/[].[^$+(){}|\\]/\\&/g' -e 's/\*/[^\/]*/g' -e 's/?/[^\/]/g')
    alternatives+="|$pattern"
  done <.gitignore
fi
exclude="(^|/)($alternatives)(/|\$)"

# Only events that change content or names: opening and reading files (git itself does
# plenty of that) must not start a save.
inotifywait -m -r -e close_write,create,delete,move,attrib --exclude "$exclude" --format '%w%f' . |
  while read -r _; do
    # Settle: drain events until none arrives for $settle seconds; end when inotifywait does.
    while :; do
      read -r -t "$settle" _
      rc=$?
      ((rc == 0)) && continue
      ((rc > 128)) && break
      exit 0
    done
    git add -A && git commit -q -m "autosave" && git push -q "$remote" "$branch"
  done
