//! The environment variables the cloud side reads, and which of them are the server's own
//! secrets: no child it starts (a sandbox's command, the sync command) ever inherits those.

/// The signing secret of project tokens, sign-in links and sessions, shared by `token mint`
/// and `serve`.
pub const TOKEN_SECRET_ENV: &str = "SHMASTRA_TOKEN_SECRET";
/// The directory of token generations (`serve` and `token` read it).
pub const TOKEN_STATE_ENV: &str = "SHMASTRA_TOKEN_STATE";
/// The GitLab service account's token; its absence turns GitLab off.
pub const SERVICE_TOKEN_ENV: &str = "GITLAB_SERVICE_TOKEN";
/// The numeric id of the group that holds one project per user.
pub const GROUP_ID_ENV: &str = "GITLAB_GROUP_ID";
/// The GitLab REST API root, for self-hosted instances.
pub const API_URL_ENV: &str = "GITLAB_API_URL";
/// The template of each user's project path in the group (`<group>/<user>` by default).
pub const PROJECT_PATH_ENV: &str = "GITLAB_PROJECT_PATH";
/// The expected `X-Gitlab-Token` of the push webhook.
pub const WEBHOOK_SECRET_ENV: &str = "GITLAB_WEBHOOK_SECRET";

/// The E2B API key; set, each user's sandbox runs at E2B.
pub const E2B_API_KEY_ENV: &str = "E2B_API_KEY";

/// The server's own secrets: removed from what a `LocalSandbox` command inherits, and refused
/// as `--sync-env` names.
pub const SERVER_SECRET_VARS: [&str; 4] = [
    TOKEN_SECRET_ENV,
    SERVICE_TOKEN_ENV,
    WEBHOOK_SECRET_ENV,
    E2B_API_KEY_ENV,
];
