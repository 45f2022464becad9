// The client against a running `shmastra-cloud serve` (embedded upstream, sandboxes on this
// machine with the real watcher), started by cloud-cli/tests/api.rs, which passes
// SHMASTRA_URL, SHMASTRA_API_KEY, SHMASTRA_SANDBOXES_DIR and SHMASTRA_PATIENCE_MS.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { chownSync, mkdtempSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

import { OperationFailed, ShmastraClient, ShmastraError } from "../src/index.js";

const baseUrl = required("SHMASTRA_URL");
const sandboxes = required("SHMASTRA_SANDBOXES_DIR");
const patience = Number(process.env.SHMASTRA_PATIENCE_MS ?? "60000");

function required(name: string): string {
  const value = process.env[name];
  if (value === undefined || value === "") throw new Error(`${name} is not set`);
  return value;
}

/** Polls `probe` until it returns something, or fails with the last thing seen. */
async function until<T>(what: string, probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + patience;
  for (;;) {
    const seen = await probe();
    if (seen !== undefined) return seen;
    if (Date.now() > deadline) assert.fail(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

function git(dir: string, ...args: string[]): string {
  return execFileSync("git", args, { cwd: dir, encoding: "utf8" }).trim();
}

/** A clone of `user`'s project through the server's git proxy, as on a laptop. */
function laptop(user: string, token: string): string {
  const dir = mkdtempSync(join(tmpdir(), `laptop-${user}-`));
  const url = new URL(`/api/git/${user}.git`, baseUrl);
  url.username = "x";
  url.password = token;
  git(dir, "clone", "-q", url.toString(), ".");
  return dir;
}

test("provision a user, see an edit in history, restore it, sync after an external push", async () => {
  const formValues: Record<string, string> = {};
  // README snippet start
  const shmastra = new ShmastraClient({
    baseUrl: process.env.SHMASTRA_URL!,
    apiKey: process.env.SHMASTRA_API_KEY!,
  });
  // The names the restore form asks for, from the saved project (none for a new user).
  const { names } = await shmastra.manifest("alice");
  const secrets = Object.fromEntries(names.map((name) => [name, formValues[name]]));
  // 202 at once; the operation's status URL says when the sandbox is up.
  const provisioned = await shmastra.wait(await shmastra.provision("alice", { secrets }));
  console.log(provisioned.provision?.outcome); // "created"
  const { status } = await shmastra.sandbox("alice"); // { state: "ready" }
  // README snippet end
  assert.equal(provisioned.provision?.outcome, "created");
  assert.deepEqual(status, { state: "ready" });

  // An edit in the sandbox becomes a save in the history.
  const project = join(sandboxes, "alice", "project");
  // As the sandbox's code would: a sandbox runs as a user of its own when serve is root.
  const edit = (name: string, text: string) => {
    const path = join(project, name);
    writeFileSync(path, text);
    const { uid, gid } = statSync(join(sandboxes, "alice"));
    chownSync(path, uid, gid);
  };
  edit("notes.txt", "first\n");
  const first = await until("the first save of notes.txt", async () => {
    const { saves } = await shmastra.history("alice", 10);
    return saves.find((s) => s.files.includes("notes.txt"));
  });
  assert.equal(first.kind, "autosave");
  edit("notes.txt", "second\n");
  await until("the second save", async () => {
    const { saves } = await shmastra.history("alice", 10);
    return saves[0].commit !== first.commit ? saves[0] : undefined;
  });

  // Back to the first save, for that one file.
  const restored = await shmastra.wait(
    await shmastra.restore("alice", { at: first.commit, paths: ["notes.txt"] }),
  );
  assert.deepEqual(restored.restore?.files, ["notes.txt"]);
  assert.equal(readFileSync(join(project, "notes.txt"), "utf8"), "first\n");
  const restoreCommit = restored.restore?.commit;
  assert.ok(restoreCommit, "a restore save");
  await until("the restore save pushed", async () => {
    const { saves } = await shmastra.history("alice", 1);
    return saves[0]?.commit === restoreCommit ? saves[0] : undefined;
  });

  // A new token: the sandbox's watcher gets it through a provision.
  const rotated = await shmastra.rotateToken("alice");
  assert.ok(rotated.generation >= 1);
  assert.ok(rotated.operation, "the sandbox gets the new token");
  await shmastra.wait(rotated.operation);

  // A push from a laptop, then a sync brings it into the sandbox.
  const clone = laptop("alice", rotated.token);
  writeFileSync(join(clone, "from-laptop.txt"), "pushed elsewhere\n");
  git(clone, "add", "-A");
  git(clone, "commit", "-qm", "from the laptop");
  git(clone, "push", "-q", "origin", "HEAD:main");
  const pushed = git(clone, "rev-parse", "HEAD");
  const synced = await shmastra.wait(await shmastra.sync("alice"));
  assert.equal(synced.sync?.outcome, "synced");
  assert.equal(readFileSync(join(project, "from-laptop.txt"), "utf8"), "pushed elsewhere\n");
  // The project is the sandbox user's: git run by another user asks to be told it is safe.
  assert.equal(
    git(project, "-c", `safe.directory=${project}`, "merge-base", "--is-ancestor", pushed, "HEAD"),
    "",
  );

  // The status as events: the current view first.
  const abort = new AbortController();
  for await (const view of shmastra.events("alice", abort.signal)) {
    assert.equal(view.user, "alice");
    assert.deepEqual(view.status, { state: "ready" });
    break;
  }
  abort.abort();
});

test("a bad key is refused", async () => {
  const wrong = new ShmastraClient({ baseUrl, apiKey: "not-the-servers-key-0123456789abcdef" });
  await assert.rejects(wrong.sandbox("alice"), (e: unknown) => {
    assert.ok(e instanceof ShmastraError);
    assert.equal(e.status, 401);
    assert.equal(e.code, "unauthorized");
    return true;
  });
});

test("a bad form is answered field by field, a good one restores the secrets", async () => {
  const shmastra = new ShmastraClient({ baseUrl, apiKey: required("SHMASTRA_API_KEY") });
  const { token } = await shmastra.rotateToken("bob");
  const clone = laptop("bob", token);
  writeFileSync(
    join(clone, "shmastra.json"),
    '{\n  "version": 1,\n  "env": [\n    "OPENAI_API_KEY"\n  ]\n}\n',
  );
  git(clone, "add", "-A");
  git(clone, "commit", "-qm", "a project that needs a secret");
  git(clone, "push", "-q", "origin", "HEAD:main");

  const { names } = await shmastra.manifest("bob");
  assert.deepEqual(names, ["OPENAI_API_KEY"]);
  await assert.rejects(
    shmastra.provision("bob", { secrets: { OPENAI_KEY: "sk-typo" } }),
    (e: unknown) => {
      assert.ok(e instanceof ShmastraError);
      assert.equal(e.status, 422);
      assert.equal(e.code, "invalid_form");
      const problems = e.problems.map((p) => `${p.field} ${p.problem}`).sort();
      assert.deepEqual(problems, ["secrets.OPENAI_API_KEY missing", "secrets.OPENAI_KEY unexpected"]);
      assert.ok(!JSON.stringify(e.problems).includes("sk-typo"), "a value came back");
      return true;
    },
  );
  // Without the secrets the sandbox waits for them.
  await assert.rejects(shmastra.wait(await shmastra.provision("bob")), (e: unknown) => {
    assert.ok(e instanceof OperationFailed);
    assert.equal(e.operation.error?.code, "invalid_form");
    return true;
  });
  assert.deepEqual((await shmastra.sandbox("bob")).status, {
    state: "needs_secrets",
    names: ["OPENAI_API_KEY"],
  });
  const done = await shmastra.wait(
    await shmastra.provision("bob", { secrets: { OPENAI_API_KEY: "sk-it's #1 = mine" } }),
  );
  assert.equal(done.provision?.outcome, "restored");
  const env = readFileSync(join(sandboxes, "bob", "project", ".env"), "utf8");
  assert.match(env, /^OPENAI_API_KEY=/m);
  assert.ok(env.includes("sk-it"), env);
});
