#!/usr/bin/env bash
# The bench's baseline: the original system's watcher (bash + inotifywait), as issue 31
# describes it, written from that description.
#
# - Before watching, it asks git for every ignored path that exists
#   (`git ls-files --others --directory --ignored --exclude-standard`, which collapses an ignored
#   folder to one `dir/` line) and hands each folder, and `.git`, to `inotifywait -m -r` as an
#   `@path` exclusion, so no watch is ever set inside them.
# - Writes to `shmastra.json`, `*.swp`, `*.tmp`, `*~` and `*.duckdb*` do not wake it.
# - It settles with `read -t`: the save starts once no event has arrived for SETTLE seconds.
# - A save is skipped while `.git/MERGE_HEAD` or `.git/REBASE_HEAD` exists or
#   `git ls-files -u` lists an unmerged path; otherwise it rewrites `shmastra.json` from `.env`'s
#   names, runs `git add -A`, and when something is staged `git commit --no-verify` and
#   `git push --no-verify REMOTE BRANCH`.
# - After a save, it exits 0 if `.gitignore`'s mtime changed (PM2 restarts it with fresh
#   exclusions; the bench restarts it through autorestart.sh). On SIGTERM it saves, then exits.
#
# Two differences from the original, neither of which changes what it costs: inotifywait runs
# without `-q`, so it says "Watches established." on stderr (the bench's ready signal), and
# `shmastra.json` is written in the watcher's canonical form (names sorted, serde's layout), so
# the two sides, which take turns on one fixture, never rewrite each other's file.
#
# Usage: baseline.sh DIR [SETTLE_SECONDS (3)] [REMOTE (project)] [BRANCH (main)]
set -u

dir=${1:?usage: baseline.sh DIR [SETTLE_SECONDS] [REMOTE] [BRANCH]}
settle=${2:-3}
remote=${3:-project}
branch=${4:-main}
cd "$dir" || exit 2
dir=$PWD

log() {
  printf '[%s] %s\n' "$(date -uIs)" "$*"
}

# The names (never the values) of `.env`'s variables.
write_manifest() {
  local names=() name
  if [ -f .env ]; then
    while IFS= read -r name; do
      names+=("$name")
    done < <(awk -F= '/^[A-Z_][A-Z0-9_]*[[:space:]]*=/ { sub(/[[:space:]]+$/, "", $1); print $1 }' .env | LC_ALL=C sort -u)
  fi
  {
    printf '{\n  "version": 1,\n'
    if [ ${#names[@]} -eq 0 ]; then
      printf '  "env": []\n'
    else
      printf '  "env": [\n'
      local i
      for i in "${!names[@]}"; do
        printf '    "%s"' "${names[i]}"
        ((i + 1 < ${#names[@]})) && printf ','
        printf '\n'
      done
      printf '  ]\n'
    fi
    printf '}\n'
  } >shmastra.json
}

save() {
  if [ -e .git/MERGE_HEAD ] || [ -e .git/REBASE_HEAD ] || [ -n "$(git ls-files -u 2>/dev/null)" ]; then
    log "merge in progress (unresolved conflicts), skipping the save"
    return
  fi
  write_manifest || log "could not write shmastra.json"
  git add -A
  if git diff --cached --quiet; then
    return
  fi
  local message
  message="Edit $(date -uIs)"
  if git commit --no-verify -q -m "$message" && git push --no-verify -q "$remote" "$branch"; then
    log "pushed: $message"
  else
    log "the save failed; the next change retries it"
  fi
}

gitignore_mtime() {
  stat -c %Y .gitignore 2>/dev/null || echo 0
}

excludes=()
while IFS= read -r path; do
  [[ $path == */ ]] || continue
  excludes+=("@$dir/${path%/}")
done < <(git ls-files --others --directory --ignored --exclude-standard 2>/dev/null)
excludes+=("@$dir/.git")
gitignore_at_start=$(gitignore_mtime)

trap 'log "stopping on SIGTERM"; save; exit 0' TERM
trap 'log "stopping on SIGINT"; save; exit 0' INT

log "watching $dir"
while IFS= read -r _; do
  while IFS= read -r -t "$settle" _; do :; done
  save
  if [ "$(gitignore_mtime)" != "$gitignore_at_start" ]; then
    log ".gitignore changed: exiting so that the restart reads the new exclusions"
    exit 0
  fi
done < <(inotifywait -m -r --format '%w%f' \
  --exclude '(^|/)(shmastra\.json|[^/]*\.(swp|tmp)|[^/]*~|[^/]*\.duckdb[^/]*)$' \
  "${excludes[@]}" -e modify,create,delete,move "$dir")
log "inotifywait ended, exiting"
