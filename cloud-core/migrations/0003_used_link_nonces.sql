-- The nonces of sign-in links already redeemed, so a link signs in once across all replicas.
-- Each is kept until an hour past its link's expiry (the redeeming replica's clock decides
-- expiry; the margin covers clocks that differ from the database's).
CREATE TABLE used_link_nonces (
    nonce      text PRIMARY KEY,
    expires_at bigint NOT NULL
);
CREATE INDEX used_link_nonces_by_expiry ON used_link_nonces (expires_at);
