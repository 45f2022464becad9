//! The cloud side's configuration, read from the environment once and validated up front, so a
//! bad setting fails at start-up with a message instead of at the first user request.

use std::time::Duration;

use reqwest::Url;
use secrecy::SecretString;

use crate::env_names::{
    API_URL_ENV, GROUP_ID_ENV, PROJECT_PATH_ENV, SERVICE_TOKEN_ENV, TOKEN_SECRET_ENV,
};
use crate::project_path::{ProjectPath, ProjectPathError};
use crate::token::{TokenSecretError, TokenSigner};

/// GitLab.com's REST API root.
pub const DEFAULT_API_URL: &str = "https://gitlab.com/api/v4";

/// A setting that cannot work. Every variant names the variable to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// `GITLAB_SERVICE_TOKEN` without `GITLAB_GROUP_ID`.
    #[error(
        "{SERVICE_TOKEN_ENV} is set but {GROUP_ID_ENV} is not: set it to the numeric id of the group that holds the user projects"
    )]
    GroupIdMissing,
    /// `GITLAB_GROUP_ID` is not a positive number.
    #[error(
        "{GROUP_ID_ENV}={value:?} is not a group id: use the group's numeric id (shown on the group's page and under Settings > General)"
    )]
    GroupIdInvalid {
        /// The value set.
        value: String,
    },
    /// `GITLAB_API_URL` is not an http(s) URL of an API root.
    #[error("{API_URL_ENV}={value:?} is not usable: {reason}")]
    ApiUrlInvalid {
        /// The value set.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// `SHMASTRA_TOKEN_SECRET` cannot sign tokens.
    #[error(transparent)]
    TokenSecret(#[from] TokenSecretError),
    /// `GITLAB_PROJECT_PATH` is not a template of a user's project path.
    #[error("{PROJECT_PATH_ENV}: {0}")]
    ProjectPath(#[from] ProjectPathError),
}

/// GitLab settings. `Debug` never shows the service token.
#[derive(Clone)]
pub struct Config {
    /// The REST API root, e.g. `https://gitlab.com/api/v4`.
    pub api_url: Url,
    /// The group that holds the user projects.
    pub group_id: u64,
    /// The service account's token (`api` scope, Maintainer of the group).
    pub service_token: SecretString,
    /// The project token secret, when this process also mints or verifies tokens.
    pub token_secret: Option<SecretString>,
    /// The limit on each HTTP request to GitLab, connection included.
    pub request_timeout: Duration,
    /// Where each user's project is in the group (`GITLAB_PROJECT_PATH`, `serve
    /// --project-path`; default `<group>/<user>`).
    pub project_path: ProjectPath,
}

impl Config {
    /// Settings from explicit values, validated as [`Config::from_env`] validates them.
    pub fn new(
        api_url: &str,
        group_id: u64,
        service_token: SecretString,
    ) -> Result<Config, ConfigError> {
        Ok(Config {
            api_url: parse_api_url(api_url)?,
            group_id,
            service_token,
            token_secret: None,
            request_timeout: Duration::from_secs(20),
            project_path: ProjectPath::default(),
        })
    }

    /// Reads `GITLAB_SERVICE_TOKEN`, `GITLAB_GROUP_ID`, `GITLAB_API_URL`, `GITLAB_PROJECT_PATH`
    /// and `SHMASTRA_TOKEN_SECRET`. `Ok(None)` when no service token is set: GitLab is off.
    pub fn from_env() -> Result<Option<Config>, ConfigError> {
        Config::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Config::from_env`] over any variable source (tests pass a map instead of mutating the
    /// process environment).
    pub(crate) fn from_vars(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Config>, ConfigError> {
        let set = |name: &str| {
            var(name)
                .map(|v| v.trim().to_owned())
                .filter(|v| !v.is_empty())
        };
        let Some(service_token) = set(SERVICE_TOKEN_ENV) else {
            return Ok(None);
        };
        let service_token = SecretString::from(service_token);
        let group_id = match set(GROUP_ID_ENV) {
            None => return Err(ConfigError::GroupIdMissing),
            Some(value) => match value.parse::<u64>() {
                Ok(id) if id > 0 => id,
                _ => return Err(ConfigError::GroupIdInvalid { value }),
            },
        };
        let api_url = set(API_URL_ENV).unwrap_or_else(|| DEFAULT_API_URL.to_owned());
        let mut config = Config::new(&api_url, group_id, service_token)?;
        if let Some(template) = set(PROJECT_PATH_ENV) {
            config.project_path = ProjectPath::parse(&template)?;
        }
        if let Some(secret) = var(TOKEN_SECRET_ENV).filter(|v| !v.is_empty()) {
            let secret = SecretString::from(secret);
            TokenSigner::from_secret(&secret)?;
            config.token_secret = Some(secret);
        }
        Ok(Some(config))
    }

    /// The project token signer, or why there is none.
    pub fn token_signer(&self) -> Result<TokenSigner, ConfigError> {
        let secret = self
            .token_secret
            .as_ref()
            .ok_or(TokenSecretError::Missing)?;
        Ok(TokenSigner::from_secret(secret)?)
    }
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("api_url", &self.api_url.as_str())
            .field("group_id", &self.group_id)
            .field("service_token", &"[redacted]")
            .field(
                "token_secret",
                &self.token_secret.as_ref().map(|_| "[redacted]"),
            )
            .field("request_timeout", &self.request_timeout)
            .field("project_path", &self.project_path.to_string())
            .finish()
    }
}

fn parse_api_url(value: &str) -> Result<Url, ConfigError> {
    let invalid = |reason: &str| ConfigError::ApiUrlInvalid {
        value: value.to_owned(),
        reason: reason.to_owned(),
    };
    let url = Url::parse(value)
        .map_err(|e| invalid(&format!("{e} (expected e.g. {DEFAULT_API_URL})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(invalid("the scheme must be http or https"));
    }
    if url.cannot_be_a_base() || url.host().is_none() {
        return Err(invalid("it has no host"));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(invalid(
            "credentials do not belong in the URL; set GITLAB_SERVICE_TOKEN",
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(invalid("it must not have a query or fragment"));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;
    use std::collections::HashMap;

    fn from(vars: &[(&str, &str)]) -> Result<Option<Config>, ConfigError> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_vars(|name| map.get(name).cloned())
    }

    #[test]
    fn no_service_token_means_off() {
        assert!(from(&[]).unwrap().is_none());
        assert!(
            from(&[(SERVICE_TOKEN_ENV, "  "), (GROUP_ID_ENV, "7")])
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn defaults_and_explicit_values() {
        let config = from(&[(SERVICE_TOKEN_ENV, "glpat-x\n"), (GROUP_ID_ENV, " 42 ")])
            .unwrap()
            .unwrap();
        assert_eq!(config.api_url.as_str(), DEFAULT_API_URL);
        assert_eq!(config.group_id, 42);
        assert_eq!(config.service_token.expose_secret(), "glpat-x");
        assert!(config.token_signer().is_err());

        let config = from(&[
            (SERVICE_TOKEN_ENV, "glpat-x"),
            (GROUP_ID_ENV, "42"),
            (API_URL_ENV, "https://git.example.com/gitlab/api/v4"),
            (TOKEN_SECRET_ENV, "0123456789abcdef0123456789abcdef"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(
            config.api_url.as_str(),
            "https://git.example.com/gitlab/api/v4"
        );
        assert!(config.token_signer().is_ok());
    }

    #[test]
    fn bad_values_are_configuration_errors() {
        let token = (SERVICE_TOKEN_ENV, "glpat-x");
        assert_eq!(from(&[token]).unwrap_err(), ConfigError::GroupIdMissing);
        for bad in ["abc", "-1", "0", "my-group", "1.5"] {
            assert!(
                matches!(
                    from(&[token, (GROUP_ID_ENV, bad)]),
                    Err(ConfigError::GroupIdInvalid { .. })
                ),
                "{bad}"
            );
        }
        for bad in [
            "gitlab.com/api/v4",
            "ftp://gitlab.com/api/v4",
            "https://user:pw@gitlab.com/api/v4",
            "https://gitlab.com/api/v4?x=1",
        ] {
            assert!(
                matches!(
                    from(&[token, (GROUP_ID_ENV, "1"), (API_URL_ENV, bad)]),
                    Err(ConfigError::ApiUrlInvalid { .. })
                ),
                "{bad}"
            );
        }
        assert_eq!(
            from(&[token, (GROUP_ID_ENV, "1"), (TOKEN_SECRET_ENV, "short")]).unwrap_err(),
            ConfigError::TokenSecret(TokenSecretError::TooShort { len: 5 })
        );
    }

    #[test]
    fn debug_hides_secrets() {
        let mut config =
            Config::new(DEFAULT_API_URL, 1, SecretString::from("glpat-very-secret")).unwrap();
        config.token_secret = Some(SecretString::from("signing-secret-signing-secret-xx"));
        let shown = format!("{config:?}");
        assert!(
            !shown.contains("very-secret") && !shown.contains("signing-secret"),
            "{shown}"
        );
        assert!(shown.contains("[redacted]"));
    }
}
