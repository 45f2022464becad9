// The Shmastra control API's TypeScript client: every route of `shmastra-cloud serve`'s
// `/api/v1/`, typed from its OpenAPI document (`openapi.json`, generated into `schema.ts` by
// `npm run generate`). No runtime dependency beyond the platform's `fetch`.

import type { components } from "./schema.js";

type Schemas = components["schemas"];
export type SandboxView = Schemas["SandboxView"];
export type SandboxState = Schemas["SandboxState"];
export type Operation = Schemas["Operation"];
export type OperationState = Schemas["OperationState"];
export type HistoryView = Schemas["HistoryView"];
export type SaveView = Schemas["SaveView"];
export type ManifestView = Schemas["ManifestView"];
export type LoginLink = Schemas["LoginLink"];
export type RotatedToken = Schemas["RotatedToken"];
export type RestoreRequest = Schemas["RestoreRequest"];
export type ErrorDetail = Schemas["ErrorDetail"];
export type FieldProblem = Schemas["FieldProblem"];

/** An error answer of the API: its HTTP status, `code`, `message` and, for a form, every
 * field's problem. */
export class ShmastraError extends Error {
  readonly status: number;
  readonly code: string;
  readonly problems: FieldProblem[];

  constructor(status: number, detail: ErrorDetail) {
    super(detail.message);
    this.name = "ShmastraError";
    this.status = status;
    this.code = detail.code;
    this.problems = detail.problems ?? [];
  }
}

/** An operation that ended in `failed`. */
export class OperationFailed extends Error {
  readonly operation: Operation;

  constructor(operation: Operation) {
    super(operation.error?.message ?? `operation ${operation.id} failed`);
    this.name = "OperationFailed";
    this.operation = operation;
  }
}

export interface ClientOptions {
  /** Where `serve` is reached, e.g. `https://cloud.example`. */
  baseUrl: string;
  /** One of the server's `SHMASTRA_API_KEY` keys. */
  apiKey: string;
  /** Defaults to the global `fetch`. */
  fetch?: typeof fetch;
}

export interface OperationOptions {
  /** Sent as `Idempotency-Key`: a retry with the same key gets the first request's operation. */
  idempotencyKey?: string;
}

export interface WaitOptions {
  /** Give up after this long (default 10 minutes). */
  timeoutMs?: number;
  /** Time between polls (default 500 ms). */
  intervalMs?: number;
}

/** A client of one server's control API. */
export class ShmastraClient {
  readonly #base: string;
  readonly #key: string;
  readonly #fetch: typeof fetch;

  constructor(options: ClientOptions) {
    this.#base = options.baseUrl.replace(/\/+$/, "");
    this.#key = options.apiKey;
    this.#fetch = options.fetch ?? globalThis.fetch;
  }

  /** The sandbox's status, as the workspace page shows it (`status` is `null` before anything
   * happened to it). */
  sandbox(user: string): Promise<SandboxView> {
    return this.#call("GET", `/users/${enc(user)}/sandbox`);
  }

  /** Brings the user's sandbox up: made and restored from the saved branch with the restore
   * form's `secrets` (the names `manifest()` lists), or checked when it exists. */
  provision(
    user: string,
    body: { secrets?: Record<string, string> } = {},
    options: OperationOptions = {},
  ): Promise<Operation> {
    return this.#call("POST", `/users/${enc(user)}/sandbox`, body, options);
  }

  /** Syncs the sandbox to the saved branch (after a push made elsewhere). */
  sync(user: string, options: OperationOptions = {}): Promise<Operation> {
    return this.#call("POST", `/users/${enc(user)}/sync`, undefined, options);
  }

  /** Goes back to an earlier save (a commit id, an RFC 3339 time or a duration ago), the whole
   * project or only `paths`. */
  restore(user: string, body: RestoreRequest, options: OperationOptions = {}): Promise<Operation> {
    return this.#call("POST", `/users/${enc(user)}/restore`, body, options);
  }

  /** An operation, as its status URL answers. */
  operation(user: string, id: string): Promise<Operation> {
    return this.#call("GET", `/users/${enc(user)}/operations/${enc(id)}`);
  }

  /** Polls `operation` until it ends; resolves with it when it succeeded, rejects with
   * `OperationFailed` when it failed. */
  async wait(operation: Operation, options: WaitOptions = {}): Promise<Operation> {
    const deadline = Date.now() + (options.timeoutMs ?? 600_000);
    const interval = options.intervalMs ?? 500;
    let current = operation;
    for (;;) {
      if (current.state === "succeeded") return current;
      if (current.state === "failed") throw new OperationFailed(current);
      if (Date.now() > deadline) {
        throw new Error(`operation ${current.id} still ${current.state} after the timeout`);
      }
      await new Promise((resolve) => setTimeout(resolve, interval));
      current = await this.operation(current.user, current.id);
    }
  }

  /** The newest saves, newest first (default 30, at most 500). */
  history(user: string, limit?: number): Promise<HistoryView> {
    const query = limit === undefined ? "" : `?limit=${limit}`;
    return this.#call("GET", `/users/${enc(user)}/history${query}`);
  }

  /** The names the restore form must ask for, from the saved branch. */
  manifest(user: string): Promise<ManifestView> {
    return this.#call("GET", `/users/${enc(user)}/manifest`);
  }

  /** A one-use sign-in link to the user's workspace page. */
  loginLink(user: string, ttlSeconds?: number): Promise<LoginLink> {
    const body = ttlSeconds === undefined ? {} : { ttl_seconds: ttlSeconds };
    return this.#call("POST", `/users/${enc(user)}/login-links`, body);
  }

  /** Refuses the user's earlier project tokens and returns the new one. */
  rotateToken(user: string): Promise<RotatedToken> {
    return this.#call("POST", `/users/${enc(user)}/token/rotate`);
  }

  /** The sandbox's view at once and at every change, until `signal` aborts. */
  async *events(user: string, signal?: AbortSignal): AsyncGenerator<SandboxView> {
    const response = await this.#fetch(`${this.#base}/api/v1/users/${enc(user)}/sandbox/events`, {
      headers: { authorization: `Bearer ${this.#key}`, accept: "text/event-stream" },
      signal,
    });
    if (!response.ok || response.body === null) throw await errorOf(response);
    const decoder = new TextDecoder();
    let buffered = "";
    for await (const chunk of response.body as unknown as AsyncIterable<Uint8Array>) {
      buffered += decoder.decode(chunk, { stream: true });
      let end: number;
      while ((end = buffered.indexOf("\n\n")) >= 0) {
        const block = buffered.slice(0, end);
        buffered = buffered.slice(end + 2);
        const lines = block.split("\n");
        const event = lines.find((l) => l.startsWith("event:"))?.slice(6).trim();
        const data = lines
          .filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).replace(/^ /, ""))
          .join("\n");
        if (event === "status" && data !== "") yield JSON.parse(data) as SandboxView;
      }
    }
  }

  async #call<T>(method: string, path: string, body?: unknown, options: OperationOptions = {}): Promise<T> {
    const headers: Record<string, string> = { authorization: `Bearer ${this.#key}` };
    if (body !== undefined) headers["content-type"] = "application/json";
    if (options.idempotencyKey !== undefined) headers["idempotency-key"] = options.idempotencyKey;
    const response = await this.#fetch(`${this.#base}/api/v1${path}`, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (!response.ok) throw await errorOf(response);
    return (await response.json()) as T;
  }
}

function enc(segment: string): string {
  return encodeURIComponent(segment);
}

async function errorOf(response: Response): Promise<ShmastraError> {
  const text = await response.text();
  try {
    const body = JSON.parse(text) as { error?: ErrorDetail };
    if (body.error !== undefined) return new ShmastraError(response.status, body.error);
  } catch {
    // Not the API's JSON (a proxy in between): the status and the text say it.
  }
  return new ShmastraError(response.status, {
    code: "http_error",
    message: `HTTP ${response.status}: ${text.slice(0, 200)}`,
    problems: [],
  });
}
