-- The state every replica of shmastra-cloud shares. Times are milliseconds since the Unix
-- epoch on the database's clock, so replicas with skewed clocks still agree on leases.

CREATE FUNCTION shmastra_now_ms() RETURNS bigint
    LANGUAGE sql VOLATILE
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;

-- One row per user: the newest push, whether a run is owed, and who runs it now.
CREATE TABLE sync_jobs (
    user_id       text PRIMARY KEY,
    refname       text    NOT NULL,
    new_oid       text    NOT NULL,
    -- A run is owed: set by every event, cleared when a run is claimed.
    pending       boolean NOT NULL,
    -- When the owed run was first asked for: claims take the oldest first.
    pending_since bigint  NOT NULL,
    -- The claim running it now (unique per claim), and until when that claim holds.
    owner         text,
    lease_until   bigint
);
CREATE INDEX sync_jobs_claimable ON sync_jobs (pending_since) WHERE pending OR owner IS NOT NULL;

-- Branch updates the proxy saw applied: a GitLab webhook for one of them is an echo.
CREATE TABLE recent_pushes (
    user_id text   NOT NULL,
    refname text   NOT NULL,
    new_oid text   NOT NULL,
    seen_at bigint NOT NULL,
    PRIMARY KEY (user_id, refname, new_oid)
);
CREATE INDEX recent_pushes_by_user_age ON recent_pushes (user_id, seen_at);

-- GitLab delivery ids (Idempotency-Key, X-Gitlab-Event-UUID) already handled.
CREATE TABLE webhook_deliveries (
    id      text PRIMARY KEY,
    seen_at bigint NOT NULL
);
CREATE INDEX webhook_deliveries_by_age ON webhook_deliveries (seen_at);

-- Each sandbox's status as JSON, with the time of its last change. `version` grows with every
-- change across all rows, so a replica follows changes by asking for versions past its last.
CREATE SEQUENCE change_versions;
CREATE TABLE sandbox_statuses (
    sandbox    text PRIMARY KEY,
    status     text   NOT NULL,
    changed_at bigint NOT NULL,
    version    bigint NOT NULL
);
CREATE INDEX sandbox_statuses_by_version ON sandbox_statuses (version);

-- Each revoked user's project token generation (absent: generation 0).
CREATE TABLE token_generations (
    user_id    text PRIMARY KEY,
    generation bigint NOT NULL,
    version    bigint NOT NULL
);
CREATE INDEX token_generations_by_version ON token_generations (version);
