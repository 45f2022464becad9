-- Each user's sandbox at the provider (an E2B sandbox id), so every replica finds the same one,
-- and the create in flight: a replica that finds no sandbox claims the create for a lease, and
-- every other replica waits for it (or for the lease to run out) instead of creating another.
CREATE TABLE user_sandboxes (
    user_id        text PRIMARY KEY,
    sandbox_id     text,
    -- The claim creating the user's sandbox now, and until when it holds.
    creator        text,
    creating_until bigint,
    updated_at     bigint NOT NULL
);
