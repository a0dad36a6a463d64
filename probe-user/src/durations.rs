//! Durations on the command line: `150ms`, `10s`, `2m`, `1h`, `1m30s`, or a bare
//! number of seconds (`30`, `2.5`).

use std::time::Duration;

/// Parses a duration flag; the error is one line fit for clap.
pub fn parse(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    if t.is_empty() {
        return Err("empty duration: expected e.g. 10s, 2m, 150ms".into());
    }
    if let Ok(secs) = t.parse::<f64>() {
        if !secs.is_finite() || secs < 0.0 {
            return Err(format!(
                "invalid duration {s:?}: must be a non-negative number of seconds"
            ));
        }
        return Ok(Duration::from_secs_f64(secs));
    }
    humantime::parse_duration(t)
        .map_err(|e| format!("invalid duration {s:?} ({e}): expected e.g. 10s, 2m, 150ms"))
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
        for bad in ["", "ten", "10x", "-3", "s10", "NaN"] {
            let e = parse(bad).unwrap_err();
            assert!(!e.contains('\n'), "{e}");
            assert!(e.contains("duration"), "{e}");
        }
    }
}
