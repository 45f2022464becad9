//! Durations in messages and log lines, written as people write them (both binaries).

use std::time::Duration;

/// A duration as people write it: `15m`, `1h 30m`, `1s 500ms`, `1d` (whole milliseconds),
/// in the units humantime (and every flag taking a duration) reads back.
pub fn short_duration(duration: Duration) -> String {
    let mut rest = duration.as_millis();
    let mut parts = Vec::new();
    for (unit, name) in [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
        (1, "ms"),
    ] {
        if rest >= unit {
            parts.push(format!("{}{name}", rest / unit));
            rest %= unit;
        }
    }
    if parts.is_empty() {
        "0s".to_owned()
    } else {
        parts.join(" ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_read_as_people_write_them() {
        for (duration, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(15 * 60), "15m"),
            (Duration::from_secs(5400), "1h 30m"),
            (Duration::from_millis(1500), "1s 500ms"),
            (Duration::from_secs(2 * 86_400 + 1), "2d 1s"),
            (Duration::from_secs(86_400), "1d"),
        ] {
            assert_eq!(short_duration(duration), text);
            assert_eq!(humantime::parse_duration(text), Ok(duration), "{text}");
        }
    }
}
