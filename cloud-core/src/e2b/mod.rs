//! E2B, written against its published sources rather than a crate (the crates.io clients are
//! abandoned or tied to another framework): the control plane ([`api`], REST with
//! `X-API-Key`), the in-sandbox daemon envd ([`envd`], Connect-RPC JSON streaming for
//! commands, `/files` for files; framing in [`rpc`]), what their errors mean ([`error`]), the
//! settings ([`E2bSettings`], from the same variables the SDKs read), and over them the
//! [`crate::SandboxProvider`] a deployment uses: [`E2bProvider`] and its [`E2bSandbox`].

pub mod api;
pub mod envd;
pub mod error;
pub mod provider;
pub mod rpc;
pub mod sandbox;

use std::time::Duration;

use reqwest::Url;
use secrecy::SecretString;

pub use api::{Connected, ControlPlane, NewSandbox, SandboxAccess, SandboxInfo, SandboxState};
pub use envd::{Envd, StreamTimeouts};
pub use error::E2bError;
pub use provider::{E2bLifecycle, E2bProvider};
pub use sandbox::E2bSandbox;

use crate::gitlab::RetryPolicy;

/// The API key (`X-API-Key`); set, it turns E2B on. One of the server's secrets.
pub const API_KEY_ENV: &str = crate::env_names::E2B_API_KEY_ENV;
/// The template new sandboxes are made from.
pub const TEMPLATE_ENV: &str = "E2B_TEMPLATE";
/// The control plane's URL (else `https://api.<domain>`).
pub const API_URL_ENV: &str = "E2B_API_URL";
/// E2B's domain (else `e2b.app`).
pub const DOMAIN_ENV: &str = "E2B_DOMAIN";
/// envd's URL for every sandbox (tests, self-hosted E2B).
pub const SANDBOX_URL_ENV: &str = "E2B_SANDBOX_URL";
/// The SDKs' default domain (`ConnectionConfig.domain`).
pub const DEFAULT_DOMAIN: &str = "e2b.app";
/// Domains that serve every sandbox at `sandbox.<domain>`, routed by the `E2b-Sandbox-*`
/// headers (`supportedDomains` in the JS SDK's `connectionConfig.ts`); elsewhere a sandbox is
/// `<port>-<id>.<domain>`.
const SHARED_HOST_DOMAINS: [&str; 4] = ["e2b.app", "e2b.dev", "e2b.pro", "e2b-staging.dev"];

/// How the cloud reaches E2B.
#[derive(Clone)]
pub struct E2bSettings {
    /// `E2B_API_KEY`.
    pub api_key: SecretString,
    /// `E2B_API_URL`, else `https://api.<domain>`.
    pub api_url: Url,
    /// `E2B_DOMAIN`, else `e2b.app`.
    pub domain: String,
    /// `E2B_SANDBOX_URL`: every sandbox's envd at this one URL (tests, self-hosted E2B).
    pub sandbox_url: Option<Url>,
    /// `E2B_TEMPLATE`: what new sandboxes are made from.
    pub template: String,
    /// The limit of one control-plane request (the SDK's 60 s).
    pub request_timeout: Duration,
    /// envd's keepalive, idle and request limits.
    pub streams: StreamTimeouts,
    /// How 429s, 5xx and lost connections are retried.
    pub retry: RetryPolicy,
}

impl std::fmt::Debug for E2bSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("E2bSettings")
            .field("api_key", &"***")
            .field("api_url", &self.api_url.as_str())
            .field("domain", &self.domain)
            .field("sandbox_url", &self.sandbox_url.as_ref().map(Url::as_str))
            .field("template", &self.template)
            .finish_non_exhaustive()
    }
}

/// Why the E2B settings cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum E2bSettingsError {
    /// Some E2B variables are set, but not all that are needed.
    #[error(
        "{set} is set but {missing} is not: set {missing} too to drive E2B sandboxes, or unset {set}"
    )]
    Incomplete {
        /// One that is set.
        set: &'static str,
        /// The one missing.
        missing: &'static str,
    },
    /// A URL variable does not parse.
    #[error("{name} is not a URL: {value:?} ({reason})")]
    BadUrl {
        /// The variable.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why it does not parse.
        reason: String,
    },
}

impl E2bSettings {
    /// From the environment as `var` reads it: `None` when no E2B variable is set (the cloud
    /// runs without E2B), an error when some are set but `E2B_API_KEY` or `E2B_TEMPLATE` is
    /// missing.
    pub fn from_env(
        var: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<E2bSettings>, E2bSettingsError> {
        let get = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let names = [
            API_KEY_ENV,
            TEMPLATE_ENV,
            API_URL_ENV,
            DOMAIN_ENV,
            SANDBOX_URL_ENV,
        ];
        let Some(set) = names.into_iter().find(|name| get(name).is_some()) else {
            return Ok(None);
        };
        let api_key = get(API_KEY_ENV).ok_or(E2bSettingsError::Incomplete {
            set,
            missing: API_KEY_ENV,
        })?;
        let template = get(TEMPLATE_ENV).ok_or(E2bSettingsError::Incomplete {
            set: API_KEY_ENV,
            missing: TEMPLATE_ENV,
        })?;
        let domain = get(DOMAIN_ENV).unwrap_or_else(|| DEFAULT_DOMAIN.to_owned());
        let url = |name: &'static str, value: String| {
            Url::parse(value.trim()).map_err(|e| E2bSettingsError::BadUrl {
                name,
                value,
                reason: e.to_string(),
            })
        };
        let api_url = match get(API_URL_ENV) {
            Some(value) => url(API_URL_ENV, value)?,
            None => url(DOMAIN_ENV, format!("https://api.{domain}"))?,
        };
        let sandbox_url = get(SANDBOX_URL_ENV)
            .map(|value| url(SANDBOX_URL_ENV, value))
            .transpose()?;
        Ok(Some(E2bSettings {
            api_key: SecretString::from(api_key.trim().to_owned()),
            api_url,
            domain,
            sandbox_url,
            template: template.trim().to_owned(),
            request_timeout: Duration::from_secs(60),
            streams: StreamTimeouts::default(),
            retry: RetryPolicy::default(),
        }))
    }

    /// Where `sandbox`'s envd answers, as the JS SDK's `getSandboxUrl` picks it:
    /// `E2B_SANDBOX_URL`, else `https://sandbox.<domain>` on E2B's own domains, else
    /// `https://49983-<id>.<domain>`; `domain` is the one the sandbox's create or connect
    /// answer named, else the configured one.
    pub fn envd_url(&self, sandbox: &str, domain: Option<&str>) -> Url {
        if let Some(url) = &self.sandbox_url {
            return url.clone();
        }
        let domain = domain.unwrap_or(&self.domain);
        let host = if SHARED_HOST_DOMAINS.contains(&domain) {
            format!("https://sandbox.{domain}")
        } else {
            format!("https://{}-{sandbox}.{domain}", envd::ENVD_PORT)
        };
        Url::parse(&host).unwrap_or_else(|_| self.api_url.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<E2bSettings>, E2bSettingsError> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        E2bSettings::from_env(|name| vars.get(name).cloned())
    }

    #[test]
    fn nothing_set_is_no_e2b_and_half_set_is_a_clear_error() {
        assert!(settings(&[]).unwrap().is_none());
        assert!(settings(&[(API_KEY_ENV, " ")]).unwrap().is_none());
        let err = settings(&[(API_KEY_ENV, "e2b_x")]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "E2B_API_KEY is set but E2B_TEMPLATE is not: set E2B_TEMPLATE too to drive E2B sandboxes, or unset E2B_API_KEY"
        );
        for name in [TEMPLATE_ENV, API_URL_ENV, DOMAIN_ENV, SANDBOX_URL_ENV] {
            let err = settings(&[(name, "x")]).unwrap_err();
            assert_eq!(
                err,
                E2bSettingsError::Incomplete {
                    set: name,
                    missing: API_KEY_ENV
                }
            );
        }
        let err = settings(&[
            (API_KEY_ENV, "k"),
            (TEMPLATE_ENV, "t"),
            (API_URL_ENV, "not a url"),
        ])
        .unwrap_err();
        assert!(
            matches!(
                err,
                E2bSettingsError::BadUrl {
                    name: API_URL_ENV,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn urls_follow_the_sdks_rules() {
        let s = settings(&[(API_KEY_ENV, "k"), (TEMPLATE_ENV, "shmastra")])
            .unwrap()
            .unwrap();
        assert_eq!(s.api_url.as_str(), "https://api.e2b.app/");
        assert_eq!(s.envd_url("i1", None).as_str(), "https://sandbox.e2b.app/");
        assert_eq!(
            s.envd_url("i1", Some("eu.example")).as_str(),
            "https://49983-i1.eu.example/"
        );
        let s = settings(&[
            (API_KEY_ENV, "k"),
            (TEMPLATE_ENV, "t"),
            (DOMAIN_ENV, "e2b.example"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(s.api_url.as_str(), "https://api.e2b.example/");
        assert_eq!(
            s.envd_url("i1", None).as_str(),
            "https://49983-i1.e2b.example/"
        );
        let s = settings(&[
            (API_KEY_ENV, "k"),
            (TEMPLATE_ENV, "t"),
            (API_URL_ENV, "http://127.0.0.1:9/"),
            (SANDBOX_URL_ENV, "http://127.0.0.1:10"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(s.api_url.as_str(), "http://127.0.0.1:9/");
        assert_eq!(
            s.envd_url("i1", Some("x.y")).as_str(),
            "http://127.0.0.1:10/"
        );
        assert!(!format!("{s:?}").contains("\"k\""));
    }
}
