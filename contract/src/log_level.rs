//! The log level both binaries start at: `-q` and `-v` step it from the binary's default,
//! and without them `RUST_LOG` (any `tracing-subscriber` filter) still decides.

/// From the quietest to the most talkative.
const LEVELS: [&str; 5] = ["error", "warn", "info", "debug", "trace"];

/// The filter directive: `default` (one of the levels) moved `verbose - quiet` steps when
/// either flag was given (flags win), else `rust_log` when it is set and not blank, else
/// `default`.
pub fn directive(default: &str, quiet: u8, verbose: u8, rust_log: Option<&str>) -> String {
    if quiet == 0 && verbose == 0 {
        if let Some(filter) = rust_log.filter(|f| !f.trim().is_empty()) {
            return filter.to_owned();
        }
        return default.to_owned();
    }
    let at = LEVELS.iter().position(|l| *l == default).unwrap_or(2) as i32;
    let step = i32::from(verbose) - i32::from(quiet);
    let at = (at + step).clamp(0, LEVELS.len() as i32 - 1);
    LEVELS[at as usize].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_step_the_default_and_rust_log_decides_without_them() {
        assert_eq!(directive("info", 0, 0, None), "info");
        assert_eq!(directive("info", 1, 0, None), "warn");
        assert_eq!(directive("info", 0, 2, None), "trace");
        assert_eq!(directive("warn", 5, 0, None), "error");
        assert_eq!(directive("info", 0, 9, None), "trace");
        assert_eq!(
            directive("info", 0, 0, Some("debug,hyper=warn")),
            "debug,hyper=warn"
        );
        assert_eq!(directive("info", 0, 0, Some(" ")), "info");
        assert_eq!(directive("info", 1, 0, Some("trace")), "warn");
    }
}
