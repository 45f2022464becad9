-- How each user's last sync run ended, so a caller whose event another replica's run covered
-- learns that run's outcome. `events` counts the user's events; a claim covers those up to
-- the count when it was taken, and `finished` is that count for the last finished run.
ALTER TABLE sync_jobs
    ADD COLUMN events   bigint NOT NULL DEFAULT 0,
    ADD COLUMN finished bigint,
    -- The run's `SyncOutcome` as JSON.
    ADD COLUMN outcome  text;
