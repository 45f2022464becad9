// PM2 ecosystem for the sandbox template, installed as /home/user/ecosystem.config.js: the
// apps of the original Shmastra template, `shmastra` (the dev server, `pnpm dev`) and `healer`,
// and project-watcher as the third. Every app runs in the project (/home/user/shmastra) and
// logs to its `.logs/` folder (`<app>-out.log`, `<app>-error.log`), as the original's did.
//
// The watcher's environment (PROJECT_DIR, PROJECT_TOKEN, PROJECT_REMOTE, PROJECT_BRANCH) comes
// from the file cloud-core's `provision` writes, ~/.project-watcher/.env (override the path with
// PROJECT_WATCHER_ENV_FILE). Without that file the feature is off and the watcher is not started.
//
//   pm2 start ecosystem.config.js                          every app
//   pm2 start ecosystem.config.js --only shmastra,healer   the dev server (cloud-core's start)
//   pm2 start ecosystem.config.js --only project-watcher   after provisioning
//
// Knobs for other setups and tests (all optional): PROJECT_WATCHER_BIN (the executable, default
// `project-watcher` found on PATH, else /usr/local/bin/project-watcher), SHMASTRA_CMD (default
// `pnpm dev`), HEALER_CMD (default `pnpm run healer`), WATCHER_DEBOUNCE and WATCHER_MAX_DELAY
// (passed through).

'use strict';

const fs = require('fs');
const os = require('os');
const path = require('path');

const home = process.env.HOME || os.homedir();
const envFile =
  process.env.PROJECT_WATCHER_ENV_FILE || path.join(home, '.project-watcher', '.env');

// KEY=VALUE lines as cloud-core writes them; blank lines and `#` comments skipped.
function readEnvFile(file) {
  let text;
  try {
    text = fs.readFileSync(file, 'utf8');
  } catch (err) {
    if (err.code === 'ENOENT') return null;
    throw err;
  }
  const env = {};
  for (const line of text.split('\n')) {
    const trimmed = line.trim();
    if (trimmed === '' || trimmed.startsWith('#')) continue;
    const eq = trimmed.indexOf('=');
    if (eq > 0) env[trimmed.slice(0, eq)] = trimmed.slice(eq + 1);
  }
  return env;
}

const watcherEnv = readEnvFile(envFile);
const projectDir =
  (watcherEnv && watcherEnv.PROJECT_DIR) || process.env.PROJECT_DIR || path.join(home, 'shmastra');

// PM2 looks for a bare script name in the app's cwd, not on PATH: resolve it here.
function onPath(name) {
  for (const dir of (process.env.PATH || '').split(path.delimiter)) {
    if (dir === '') continue;
    const candidate = path.join(dir, name);
    try {
      fs.accessSync(candidate, fs.constants.X_OK);
      return candidate;
    } catch (_) {
      // not here
    }
  }
  return null;
}

// Only variables that are set: PM2 would pass `undefined` on as the string "undefined".
function defined(env) {
  return Object.fromEntries(Object.entries(env).filter(([, v]) => v !== undefined && v !== ''));
}

const logs = path.join(projectDir, '.logs');

// Each app's output in the project's `.logs/`, with timestamps.
function logFiles(name) {
  return {
    out_file: path.join(logs, `${name}-out.log`),
    error_file: path.join(logs, `${name}-error.log`),
    merge_logs: true,
    time: true,
  };
}

function shellApp(name, command) {
  return {
    name,
    cwd: projectDir,
    script: 'sh',
    args: ['-c', command],
    interpreter: 'none',
    autorestart: true,
    exp_backoff_restart_delay: 500,
    ...logFiles(name),
  };
}

const apps = [
  shellApp('shmastra', process.env.SHMASTRA_CMD || 'pnpm dev'),
  shellApp('healer', process.env.HEALER_CMD || 'pnpm run healer'),
];

if (watcherEnv) {
  apps.push({
    name: 'project-watcher',
    cwd: projectDir,
    script:
      process.env.PROJECT_WATCHER_BIN ||
      onPath('project-watcher') ||
      '/usr/local/bin/project-watcher',
    args: ['watch', '--log-format', 'json'],
    // A native binary: PM2 must exec it, not hand it to node.
    interpreter: 'none',
    env: defined({
      PROJECT_DIR: projectDir,
      PROJECT_TOKEN: watcherEnv.PROJECT_TOKEN,
      PROJECT_REMOTE: watcherEnv.PROJECT_REMOTE,
      PROJECT_BRANCH: watcherEnv.PROJECT_BRANCH,
      WATCHER_DEBOUNCE: process.env.WATCHER_DEBOUNCE,
      WATCHER_MAX_DELAY: process.env.WATCHER_MAX_DELAY,
    }),
    // PM2 stops with SIGINT; the watcher then commits what is pending and pushes within its
    // --shutdown-timeout (8 s). Give it that and more before PM2 falls back to SIGKILL.
    kill_signal: 'SIGINT',
    kill_timeout: 15000,
    autorestart: true,
    // Exit 2 (bad configuration) and 3 (another watcher holds the repository) will not get
    // better by restarting.
    stop_exit_codes: [2, 3],
    // Crash loops back off exponentially (100 ms doubling, capped by PM2 at 15 s) instead of
    // spinning; the delay resets once the watcher stays up.
    exp_backoff_restart_delay: 100,
    ...logFiles('project-watcher'),
  });
}

module.exports = { apps };
