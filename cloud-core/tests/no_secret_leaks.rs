//! Secret values, the service token and the signing secret never reach a log line, an error
//! message or a `Debug` rendering. The logs are captured at TRACE level while every path that
//! handles them runs, successes and failures alike.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cloud_core::UserId;
use cloud_core::config::Config;
use cloud_core::gitlab::{GitLab, RetryPolicy};
use cloud_core::manifest::Manifest;
use cloud_core::secrets::{RestoreForm, SecretValue, render_env};
use secrecy::SecretString;
use testkit::fake_gitlab::{FakeGitLab, Fault, GROUP_ID, SERVICE_TOKEN};

const WRONG_TOKEN: &str = "glpat-LEAK-wrong-token";
const SIGNING_SECRET: &str = "LEAK-signing-secret-0123456789abcdef";
const VALUES: [&str; 3] = ["LEAK-value-one", "LEAK-value-two", "LEAK-value-extra"];

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

fn assert_clean(what: &str, text: &str) {
    for secret in [SERVICE_TOKEN, WRONG_TOKEN, SIGNING_SECRET]
        .iter()
        .chain(VALUES.iter())
    {
        assert!(!text.contains(secret), "{what} shows {secret:?}:\n{text}");
    }
}

fn client(fake: &FakeGitLab, token: &str) -> GitLab {
    let mut config = Config::new(&fake.api_url(), GROUP_ID, SecretString::from(token)).unwrap();
    config.token_secret = Some(SecretString::from(SIGNING_SECRET));
    assert_clean("Config's Debug", &format!("{config:?}"));
    let retry = RetryPolicy {
        initial_backoff: Duration::from_millis(5),
        ..RetryPolicy::default()
    };
    GitLab::with_retry_policy(&config, retry).unwrap()
}

#[tokio::test]
async fn no_secret_in_logs_errors_or_debug() {
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let mut rendered = Vec::new();

    let fake = FakeGitLab::start().await;
    let err = client(&fake, WRONG_TOKEN).check().await.unwrap_err();
    rendered.push(format!("{err} {err:?}"));

    fake.push_fault(Fault::ServerError);
    fake.push_fault(Fault::TooManyRequests {
        retry_after_secs: 0,
    });
    let gitlab = client(&fake, SERVICE_TOKEN);
    let project = gitlab
        .ensure_user_project(&UserId::parse("alice").unwrap())
        .await
        .unwrap();
    rendered.push(format!("{project:?} {gitlab:?}"));

    let manifest = Manifest::new(["ONE", "TWO"]).unwrap();
    let bad = vec![
        (
            "ONE".to_owned(),
            SecretValue::from(format!("{}\0", VALUES[0])),
        ),
        ("EXTRA".to_owned(), SecretValue::from(VALUES[2])),
        ("ONE".to_owned(), SecretValue::from(VALUES[1])),
    ];
    let err = RestoreForm::validate(&manifest, bad).unwrap_err();
    rendered.push(format!("{err} {err:?}"));

    let good = vec![
        ("ONE".to_owned(), SecretValue::from(VALUES[0])),
        ("TWO".to_owned(), SecretValue::from(VALUES[1])),
    ];
    let form = RestoreForm::validate(&manifest, good).unwrap();
    let env = render_env(&form);
    assert!(
        env.expose().contains(VALUES[0]),
        "the .env text itself must hold the value"
    );
    rendered.push(format!("{form:?} {env:?} {env}"));

    let logs = logs.text();
    for expected in [
        "rejected the service token",
        "retrying",
        "created GitLab project",
        "secrets form rejected",
        "secrets form accepted",
    ] {
        assert!(
            logs.contains(expected),
            "the capture missed {expected:?}:\n{logs}"
        );
    }
    assert_clean("the logs", &logs);
    for text in rendered {
        assert_clean("an error or Debug rendering", &text);
    }
    let sent = fake.requests();
    assert!(
        sent.iter()
            .any(|r| r.private_token.as_deref() == Some(SERVICE_TOKEN)),
        "the token must still reach GitLab"
    );
}
