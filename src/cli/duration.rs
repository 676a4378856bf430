//! Durations on the command line: `20s`, `1500ms`, `2m`, `1h`, `0.5s`.

use std::time::Duration;

/// Longest duration accepted on the command line; everything longer is a typo.
const DURATION_MAX: Duration = Duration::from_secs(30 * 24 * 60 * 60);

/// Parses `<number><unit>` with unit `ms`, `s`, `m` or `h`; the number may have a fraction.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{text}` has no unit (use ms, s, m or h, e.g. 20s)"))?;
    let (number, unit) = text.split_at(split);
    let scale_ms = match unit {
        "ms" => 1.0,
        "s" => 1_000.0,
        "m" => 60_000.0,
        "h" => 3_600_000.0,
        _ => return Err(format!("`{unit}` is not a unit (use ms, s, m or h)")),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{number}` is not a number"))?;
    let millis = value * scale_ms;
    if !millis.is_finite() || millis > DURATION_MAX.as_millis() as f64 {
        return Err(format!(
            "`{text}` is longer than {} days",
            DURATION_MAX.as_secs() / 86_400
        ));
    }
    Ok(Duration::from_micros((millis * 1_000.0).round() as u64))
}

/// Parses an acquisition window: a duration as [`parse_duration`], or `forever` for a standby
/// that waits as long as it lives ([`vvm::ACQUISITION_FOREVER`]).
pub fn parse_acquire(text: &str) -> Result<Duration, String> {
    if text.trim() == "forever" {
        return Ok(vvm::ACQUISITION_FOREVER);
    }
    parse_duration(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_is_a_duration_or_forever() {
        assert_eq!(parse_acquire("forever"), Ok(vvm::ACQUISITION_FOREVER));
        assert_eq!(parse_acquire(" forever "), Ok(vvm::ACQUISITION_FOREVER));
        assert_eq!(parse_acquire("120s"), Ok(Duration::from_secs(120)));
        assert!(parse_acquire("Forever").is_err());
        assert!(parse_acquire("never").is_err());
    }

    #[test]
    fn units_and_fractions() {
        assert_eq!(parse_duration("20s"), Ok(Duration::from_secs(20)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1_500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3_600)));
        assert_eq!(parse_duration("0.5s"), Ok(Duration::from_millis(500)));
    }

    #[test]
    fn bad_values_are_errors() {
        for bad in ["", "20", "s", "20x", "1.2.3s", "-1s", "99999999h"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
