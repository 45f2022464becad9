//! `gitlab check` and `gitlab ensure-project`.

use anyhow::anyhow;
use cloud_core::GitLab;
use cloud_core::UserId;
use cloud_core::{Config, SERVICE_TOKEN_ENV};
use serde_json::json;

use crate::outcome::{Failure, Outcome, Success};

pub async fn check() -> Outcome {
    let gitlab = client()?;
    let group = gitlab.check().await.map_err(Failure::runtime)?;
    Ok(Success {
        text: format!(
            "ok: group {} (id {}) at {} is visible to the service account",
            group.full_path,
            group.id,
            gitlab.api_url()
        ),
        json: json!({ "group": group, "api_url": gitlab.api_url().as_str() }),
    })
}

pub async fn ensure_project(user: &str) -> Outcome {
    let user = UserId::parse(user).map_err(Failure::config)?;
    let gitlab = client()?;
    let project = gitlab
        .ensure_user_project(&user)
        .await
        .map_err(Failure::runtime)?;
    Ok(Success {
        text: format!(
            "ok: project {} (id {}) {}",
            project.path_with_namespace, project.id, project.http_url_to_repo
        ),
        json: json!({ "user": user.as_str(), "project": project }),
    })
}

fn client() -> Result<GitLab, Failure> {
    let config = Config::from_env()
        .map_err(Failure::config)?
        .ok_or_else(|| Failure::config(anyhow!("GitLab is off: {SERVICE_TOKEN_ENV} is not set")))?;
    GitLab::new(&config).map_err(Failure::runtime)
}
