#!/usr/bin/env bash
# What PM2's autorestart does for the baseline: start it again whenever it exits 0 (it does
# that when `.gitignore` changes, to pick up new exclusions). Any other exit ends this too, so
# a broken baseline shows as broken. SIGTERM (the bench's stop, sent to the whole process
# group) reaches the baseline directly; this waits for it to finish its last save and exits
# with its status.
#
# The bench counts this process's CPU (its children's, once reaped, land there) but not its
# memory, as PM2's own is not counted for the watcher.
#
# Usage: autorestart.sh PROGRAM [ARGS...]
set -u
stopping=0
trap 'stopping=1' TERM INT
while :; do
  bash "$@" &
  child=$!
  # `wait` returns early when a trapped signal arrives; wait again until the child is gone.
  while :; do
    wait "$child"
    status=$?
    kill -0 "$child" 2>/dev/null || break
  done
  if [ "$stopping" = 1 ] || [ "$status" != 0 ]; then
    exit "$status"
  fi
  echo "autorestart: the baseline exited 0; starting it again" >&2
done
