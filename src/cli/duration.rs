//! Durations on the command line, in `humantime`'s forms: `20s`, `1500ms`, `2m`, `1h`,
//! `1h 30m`, `2min`; at most [`DURATION_MAX`].

use std::time::Duration;

/// Longest duration accepted on the command line; everything longer is a typo.
pub const DURATION_MAX: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// Longest duration text echoed back in an error, in characters.
const ECHO_MAX_CHARS: usize = 64;

/// A command-line duration that was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DurationError {
    /// Not a duration at all (no unit, an unknown unit, no number).
    #[error("`{text}` is not a duration (a number and a unit: 20s, 1500ms, 2m, 1h)")]
    Invalid {
        /// The text (shortened when very long).
        text: String,
        /// What `humantime` says.
        #[source]
        source: humantime::DurationError,
    },
    /// Longer than [`DURATION_MAX`].
    #[error("`{text}` is longer than {max_days} days")]
    TooLong {
        /// The text (shortened when very long).
        text: String,
        /// [`DURATION_MAX`] in days.
        max_days: u64,
    },
}

/// Parses a duration: numbers with units (`ms`, `s`, `m`, `h` and `humantime`'s other units),
/// several of which add up (`1m 30s`).
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    let echo = || text.chars().take(ECHO_MAX_CHARS).collect::<String>();
    let duration = humantime::parse_duration(text).map_err(|source| DurationError::Invalid {
        text: echo(),
        source,
    })?;
    if duration > DURATION_MAX {
        return Err(DurationError::TooLong {
            text: echo(),
            max_days: DURATION_MAX.as_secs() / 86_400,
        });
    }
    Ok(duration)
}

/// Parses an acquisition window: a duration as [`parse_duration`], or `forever` for a standby
/// that waits as long as it lives ([`vvm::config::ACQUISITION_FOREVER`]).
pub fn parse_acquire(text: &str) -> Result<Duration, DurationError> {
    if text.trim() == "forever" {
        return Ok(vvm::config::ACQUISITION_FOREVER);
    }
    parse_duration(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_is_a_duration_or_forever() {
        assert_eq!(
            parse_acquire("forever").unwrap(),
            vvm::config::ACQUISITION_FOREVER
        );
        assert_eq!(
            parse_acquire(" forever ").unwrap(),
            vvm::config::ACQUISITION_FOREVER
        );
        assert_eq!(parse_acquire("120s").unwrap(), Duration::from_secs(120));
        assert!(parse_acquire("Forever").is_err());
        assert!(parse_acquire("never").is_err());
    }

    #[test]
    fn units_and_sums() {
        for (text, duration) in [
            ("20s", Duration::from_secs(20)),
            ("1500ms", Duration::from_millis(1_500)),
            ("2m", Duration::from_secs(120)),
            ("1h", Duration::from_secs(3_600)),
            ("1m 30s", Duration::from_secs(90)),
            (" 200ms ", Duration::from_millis(200)),
            ("30days", DURATION_MAX),
        ] {
            assert_eq!(parse_duration(text).unwrap(), duration, "{text}");
        }
    }

    #[test]
    fn bad_values_are_typed_errors() {
        for bad in ["", "20", "s", "20x", "1.2.3s", "-1s"] {
            assert!(
                matches!(parse_duration(bad), Err(DurationError::Invalid { .. })),
                "{bad}"
            );
        }
        for long in ["99999999h", "30days 1s", "999999999999999999999s"] {
            assert!(
                matches!(
                    parse_duration(long),
                    Err(DurationError::TooLong { max_days: 30, .. })
                        | Err(DurationError::Invalid { .. })
                ),
                "{long}"
            );
        }
        assert!(matches!(
            parse_duration("31days"),
            Err(DurationError::TooLong { max_days: 30, .. })
        ));
        let error = parse_duration("20x").unwrap_err();
        assert!(error.to_string().contains("`20x`"), "{error}");
        assert!(std::error::Error::source(&error).is_some());
    }
}
