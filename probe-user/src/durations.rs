//! Durations on the command line and in the config file: `150ms`, `10s`, `2m`,
//! `1h`, `1m30s`, or a bare number of seconds (`30`, `2.5`); and back to words
//! for people ([`human_secs`]: `850ms`, `2.2s`, `3m05s`, `1h02m`).
//!
//! Every duration plegwatch takes must be greater than zero (a zero warn level,
//! scan interval, run length or timeout means nothing useful) and at most
//! [`MAX`]; the alert levels at most [`MAX_LEVEL`]. Values out of range are
//! refused here, as one line, rather than overflowing later (`--warn 1e20`
//! used to panic converting to a `Duration`; a huge `--duration` would
//! overflow the `Instant` it is added to).

use std::time::Duration;

/// The longest duration any flag takes: one year. Far past any sensible run
/// length or timeout, and far below where adding it to an `Instant` overflows.
pub const MAX: Duration = Duration::from_secs(365 * 24 * 3600);

/// The longest alert level (`--warn`, `--critical`, `--imminent`): one day.
/// kubelet gives a relist 3 minutes (`PLEG_BUDGET`); a level beyond a day
/// would never fire for a wait that matters to PLEG, so a larger value is a
/// mistaken unit (`1e20`, `600000` meaning ms), not an intent.
pub const MAX_LEVEL: Duration = Duration::from_secs(24 * 3600);

/// Parses a duration flag: greater than 0, at most [`MAX`]; the error is one line fit for clap.
pub fn parse(s: &str) -> Result<Duration, String> {
    bounded(s, MAX, "1 year")
}

/// Parses an alert level: greater than 0, at most [`MAX_LEVEL`].
pub fn level(s: &str) -> Result<Duration, String> {
    bounded(s, MAX_LEVEL, "1 day (kubelet's PLEG budget is 3m)")
}

fn bounded(s: &str, max: Duration, max_name: &str) -> Result<Duration, String> {
    let d = any(s, max, max_name)?;
    if d.is_zero() {
        return Err(format!("invalid duration {s:?}: must be greater than 0"));
    }
    if d > max {
        return Err(format!("invalid duration {s:?}: must be at most {max_name}"));
    }
    Ok(d)
}

/// Any well-formed duration, zero included; a number of seconds above `max` is refused here,
/// before it is converted (where it could overflow).
fn any(s: &str, max: Duration, max_name: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration: expected e.g. 10s, 2m, 150ms".into());
    }
    if let Ok(secs) = t.parse::<f64>() {
        if !secs.is_finite() || secs < 0.0 {
            return Err(format!("invalid duration {s:?}: must be a non-negative number of seconds"));
        }
        if secs > max.as_secs_f64() {
            return Err(format!("invalid duration {s:?}: must be at most {max_name}"));
        }
        return Duration::try_from_secs_f64(secs).map_err(|_| format!("invalid duration {s:?}: too large"));
    }
    humantime::parse_duration(t).map_err(|e| format!("invalid duration {s:?} ({e}): expected e.g. 10s, 2m, 150ms"))
}

/// A duration in seconds for people: `850ms` under a second, `2.2s` under a
/// minute (`2s` when whole), `3m05s` under an hour, then `1h02m`.
pub fn human_secs(s: f64) -> String {
    if !s.is_finite() || s < 0.0 {
        return "?".into();
    }
    if s < 1.0 {
        return format!("{:.0}ms", s * 1e3);
    }
    if s < 59.95 {
        let tenths = (s * 10.0).round() as u64;
        return if tenths.is_multiple_of(10) { format!("{}s", tenths / 10) } else { format!("{s:.1}s") };
    }
    let whole = s.round() as u64;
    if whole < 3600 {
        format!("{}m{:02}s", whole / 60, whole % 60)
    } else {
        format!("{}h{:02}m", whole / 3600, (whole % 3600) / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suffixes_and_bare_seconds() {
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("150ms"), Ok(Duration::from_millis(150)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("30"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("2.5"), Ok(Duration::from_millis(2500)));
    }

    #[test]
    fn malformed_is_one_line_error() {
        for bad in ["", "ten", "10x", "-3", "s10", "NaN", "inf", "-inf", "0", "0s", "0.0"] {
            let e = parse(bad).unwrap_err();
            assert!(!e.contains('\n'), "{e}");
            assert!(e.contains("duration"), "{e}");
        }
    }

    #[test]
    fn huge_values_are_refused_not_a_panic() {
        for huge in
            ["1e20", "1e300", "18446744073709551615", "18446744073709551616s", "400d", "100000000000000000000000ns", "9999999999999999999h"]
        {
            let e = parse(huge).unwrap_err();
            assert!(!e.contains('\n') && e.contains(huge), "{huge}: {e}");
        }
        assert_eq!(parse("365d"), Ok(MAX));
    }

    #[test]
    fn levels_stop_at_a_day() {
        assert_eq!(level("24h"), Ok(MAX_LEVEL));
        assert_eq!(level("86400"), Ok(MAX_LEVEL));
        let e = level("25h").unwrap_err();
        assert!(e.contains("\"25h\"") && e.contains("1 day"), "{e}");
        assert!(level("1e20").unwrap_err().contains("1e20"));
        assert!(level("0").unwrap_err().contains("greater than 0"));
        assert_eq!(level("1ms"), Ok(Duration::from_millis(1)));
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(human_secs(0.25), "250ms");
        assert_eq!(human_secs(2.2), "2.2s");
        assert_eq!(human_secs(2.0), "2s");
        assert_eq!(human_secs(10.04), "10s");
        assert_eq!(human_secs(59.9), "59.9s");
        assert_eq!(human_secs(59.97), "1m00s");
        assert_eq!(human_secs(185.0), "3m05s");
        assert_eq!(human_secs(3725.0), "1h02m");
        assert_eq!(human_secs(f64::NAN), "?");
    }
}
