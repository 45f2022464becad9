//! TLS to PostgreSQL through rustls, as libpq's `sslmode` asks: `disable` (plaintext),
//! `prefer` (TLS when the server offers it, the certificate not checked), `require` (TLS or no
//! connection; the certificate checked against `sslrootcert` when one is given, else not),
//! `verify-ca` (the chain checked against `sslrootcert`, else the system's roots, which
//! `SSL_CERT_FILE`/`SSL_CERT_DIR` can replace), `verify-full` (the chain and the host name).
//! With no `sslmode` in the URL: `prefer` for a loopback host or a socket, `require` for any
//! other host (every managed PostgreSQL speaks TLS).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use deadpool_postgres::tokio_postgres::config::{Config, Host, SslMode as PgSslMode};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};
use rustls_pki_types::pem::PemObject;

use super::StoreError;

/// libpq's `sslmode` values (`allow` is taken as `prefer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// What a database URL asks of TLS, split from what tokio-postgres reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsRequest {
    /// The URL without `sslmode` and `sslrootcert`.
    pub rest: String,
    pub mode: Option<SslMode>,
    pub root_cert: Option<PathBuf>,
}

fn bad(message: impl Into<String>) -> StoreError {
    StoreError::Unavailable(format!("bad database URL: {}", message.into()))
}

fn mode_of(value: &str) -> Result<SslMode, StoreError> {
    Ok(match value {
        "disable" => SslMode::Disable,
        "allow" | "prefer" => SslMode::Prefer,
        "require" => SslMode::Require,
        "verify-ca" => SslMode::VerifyCa,
        "verify-full" => SslMode::VerifyFull,
        other => {
            return Err(bad(format!(
                "sslmode={other:?} is not one of disable, allow, prefer, require, verify-ca, verify-full"
            )));
        }
    })
}

/// Splits `sslmode` and `sslrootcert` out of `url` (`postgres://...?sslmode=...` or
/// `host=... sslmode=...`).
pub(crate) fn split(url: &str) -> Result<TlsRequest, StoreError> {
    let mut mode = None;
    let mut root_cert = None;
    let mut take = |key: &str, value: &str| -> Result<bool, StoreError> {
        match key {
            "sslmode" => mode = Some(mode_of(value)?),
            "sslrootcert" => root_cert = Some(PathBuf::from(value)),
            _ => return Ok(false),
        }
        Ok(true)
    };
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        let mut parsed = reqwest::Url::parse(url).map_err(|e| bad(e.to_string()))?;
        let mut kept = Vec::new();
        for (key, value) in parsed.query_pairs() {
            if !take(&key, &value)? {
                kept.push((key.into_owned(), value.into_owned()));
            }
        }
        if kept.is_empty() {
            parsed.set_query(None);
        } else {
            parsed.query_pairs_mut().clear().extend_pairs(kept);
        }
        Ok(TlsRequest {
            rest: parsed.into(),
            mode,
            root_cert,
        })
    } else {
        let mut kept = Vec::new();
        for word in url.split_whitespace() {
            let taken = match word.split_once('=') {
                Some((key, value)) => take(key.trim(), value.trim_matches('\''))?,
                None => false,
            };
            if !taken {
                kept.push(word);
            }
        }
        Ok(TlsRequest {
            rest: kept.join(" "),
            mode,
            root_cert,
        })
    }
}

/// The mode for a URL that names none: `prefer` when every host is this machine, else
/// `require`.
pub(crate) fn default_mode(config: &Config) -> SslMode {
    let local = config.get_hosts().iter().all(|host| match host {
        Host::Unix(_) => true,
        Host::Tcp(name) => {
            name.eq_ignore_ascii_case("localhost")
                || name
                    .trim_matches(['[', ']'])
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    }) && config.get_hostaddrs().iter().all(|ip| ip.is_loopback());
    if local {
        SslMode::Prefer
    } else {
        SslMode::Require
    }
}

/// What tokio-postgres is told: whether TLS is tried, and whether it is required.
pub(crate) fn pg_mode(mode: SslMode) -> PgSslMode {
    match mode {
        SslMode::Disable => PgSslMode::Disable,
        SslMode::Prefer => PgSslMode::Prefer,
        SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => PgSslMode::Require,
    }
}

/// The rustls client for `mode` (never called for `disable`).
pub(crate) fn client_config(
    mode: SslMode,
    root_cert: Option<&Path>,
) -> Result<ClientConfig, StoreError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Unavailable(format!("TLS setup: {e}")))?;
    let checks_chain = match mode {
        SslMode::Disable | SslMode::Prefer => false,
        SslMode::Require => root_cert.is_some(),
        SslMode::VerifyCa | SslMode::VerifyFull => true,
    };
    let config = if !checks_chain {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(Unverified(provider)))
            .with_no_client_auth()
    } else {
        let roots = Arc::new(roots(root_cert)?);
        let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider)
            .build()
            .map_err(|e| StoreError::Unavailable(format!("TLS setup: {e}")))?;
        if mode == SslMode::VerifyFull {
            builder.with_webpki_verifier(webpki).with_no_client_auth()
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyName(webpki)))
                .with_no_client_auth()
        }
    };
    Ok(config)
}

/// The roots a certificate chain must lead to: `sslrootcert`'s, else the system's.
fn roots(root_cert: Option<&Path>) -> Result<RootCertStore, StoreError> {
    let certs: Vec<CertificateDer<'static>> = match root_cert {
        Some(path) => CertificateDer::pem_file_iter(path)
            .and_then(|certs| certs.collect::<Result<_, _>>())
            .map_err(|e| {
                StoreError::Unavailable(format!("cannot read sslrootcert {}: {e}", path.display()))
            })?,
        None => rustls_native_certs::load_native_certs().map_err(|e| {
            StoreError::Unavailable(format!("cannot read the system's root certificates: {e}"))
        })?,
    };
    let mut store = RootCertStore::empty();
    let (added, _) = store.add_parsable_certificates(certs);
    if added == 0 {
        return Err(StoreError::Unavailable(match root_cert {
            Some(path) => format!("sslrootcert {} holds no certificate", path.display()),
            None => "no trusted root certificates: set SSL_CERT_FILE or sslrootcert".to_owned(),
        }));
    }
    Ok(store)
}

/// `prefer`, and `require` without a root: encryption without knowing whom to (libpq's own
/// meaning of these modes). The handshake's signatures are still checked.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name in it is not compared.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(url: &str, rest: &str, mode: Option<SslMode>, root: Option<&str>) {
        assert_eq!(
            split(url).unwrap(),
            TlsRequest {
                rest: rest.to_owned(),
                mode,
                root_cert: root.map(PathBuf::from),
            },
            "{url}"
        );
    }

    #[test]
    fn sslmode_and_sslrootcert_are_taken_out_of_either_form() {
        check(
            "postgres://u:p@db.example:5432/app?sslmode=verify-full&sslrootcert=/ca.pem&connect_timeout=3",
            "postgres://u:p@db.example:5432/app?connect_timeout=3",
            Some(SslMode::VerifyFull),
            Some("/ca.pem"),
        );
        check(
            "postgresql://db/app?sslmode=require",
            "postgresql://db/app",
            Some(SslMode::Require),
            None,
        );
        check("postgres://db/app", "postgres://db/app", None, None);
        check(
            "host=db user=u sslmode=verify-ca sslrootcert='/etc/ca.pem'",
            "host=db user=u",
            Some(SslMode::VerifyCa),
            Some("/etc/ca.pem"),
        );
        check(
            "postgres://db/app?sslmode=allow",
            "postgres://db/app",
            Some(SslMode::Prefer),
            None,
        );
        assert!(split("postgres://db/app?sslmode=always").is_err());
    }

    #[test]
    fn a_url_without_sslmode_requires_tls_unless_the_host_is_this_machine() {
        for (url, mode) in [
            ("postgres://u@127.0.0.1/app", SslMode::Prefer),
            ("postgres://u@localhost/app", SslMode::Prefer),
            ("postgres://u@[::1]/app", SslMode::Prefer),
            ("host=/run/postgresql user=u", SslMode::Prefer),
            ("postgres://u@db.example.com/app", SslMode::Require),
            ("postgres://u@10.0.0.5/app", SslMode::Require),
            (
                "postgres://u@localhost,db.example.com/app",
                SslMode::Require,
            ),
            ("host=localhost hostaddr=10.0.0.5 user=u", SslMode::Require),
        ] {
            let config: Config = url.parse().unwrap();
            assert_eq!(default_mode(&config), mode, "{url}");
        }
    }
}
