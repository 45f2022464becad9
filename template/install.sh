#!/bin/sh
# The persistence layer's part of the Shmastra E2B template, run by `template.ts` as the last
# build step on top of the original Shmastra template (and by the tests, into a scratch
# directory, to make the fake E2B's template): the watcher binary, the PM2 ecosystem with the
# watcher as the third app, and the folder `provision` later writes the watcher's environment
# (PROJECT_TOKEN and friends) into. Nothing secret is baked in: the token is minted per user
# and written at provision time. Idempotent.
#
#   install.sh FILES_DIR     FILES_DIR holds project-watcher and ecosystem.config.js
#
# PREFIX (default /usr/local) and SANDBOX_HOME (default /home/user) say where to install;
# PROJECT_DIR (default $SANDBOX_HOME/shmastra) is the project the watcher saves.
set -eu

files=${1:?usage: install.sh FILES_DIR}
prefix=${PREFIX:-/usr/local}
home=${SANDBOX_HOME:-/home/user}
project=${PROJECT_DIR:-$home/shmastra}

for tool in node pm2 git; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "install.sh: $tool is missing from the base template" >&2
    exit 1
  }
done
[ -d "$project" ] || {
  echo "install.sh: the project $project is missing from the base template" >&2
  exit 1
}

mkdir -p "$prefix/bin"
install -m 0755 "$files/project-watcher" "$prefix/bin/project-watcher"
install -m 0644 "$files/ecosystem.config.js" "$home/ecosystem.config.js"
# Where `provision` writes the watcher's environment file (mode 0600) at run time.
mkdir -p "$home/.project-watcher"
chmod 0700 "$home/.project-watcher"
# PM2 writes every app's log into the project's .logs/ (as the original template did): the
# watcher must never save them.
mkdir -p "$project/.logs"
if ! grep -qxF '.logs/' "$project/.gitignore" 2>/dev/null; then
  printf '.logs/\n' >> "$project/.gitignore"
fi
"$prefix/bin/project-watcher" --version
