//! Alert levels against kubelet's PLEG budget.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// kubelet's `relistThreshold`: a relist older than this makes the node NotReady.
pub const PLEG_BUDGET: Duration = Duration::from_secs(180);

/// How close a wait is to using up the PLEG budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Level {
    Warn,
    Critical,
    Imminent,
}

impl Level {
    pub fn as_str(self) -> &'static str {
        match self {
            Level::Warn => "warn",
            Level::Critical => "critical",
            Level::Imminent => "imminent",
        }
    }
}

/// The three thresholds, checked to be in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Thresholds {
    pub warn: Duration,
    pub critical: Duration,
    pub imminent: Duration,
}

impl Default for Thresholds {
    fn default() -> Self {
        Thresholds { warn: Duration::from_secs(10), critical: Duration::from_secs(60), imminent: Duration::from_secs(150) }
    }
}

impl Thresholds {
    /// Checks `warn <= critical <= imminent` and `warn > 0`.
    pub fn new(warn: Duration, critical: Duration, imminent: Duration) -> Result<Self, String> {
        if warn.is_zero() {
            return Err("--warn must be greater than 0".into());
        }
        if critical < warn {
            return Err(format!("--critical ({critical:?}) must not be below --warn ({warn:?})"));
        }
        if imminent < critical {
            return Err(format!("--imminent ({imminent:?}) must not be below --critical ({critical:?})"));
        }
        Ok(Thresholds { warn, critical, imminent })
    }

    /// The level a wait of `waited` has reached, if any.
    pub fn level(&self, waited: Duration) -> Option<Level> {
        if waited >= self.imminent {
            Some(Level::Imminent)
        } else if waited >= self.critical {
            Some(Level::Critical)
        } else if waited >= self.warn {
            Some(Level::Warn)
        } else {
            None
        }
    }
}

/// The share of the PLEG budget a wait of `waited` has used (1.0 = all of it).
pub fn budget_used(waited: Duration) -> f64 {
    waited.as_secs_f64() / PLEG_BUDGET.as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_thresholds() {
        let t = Thresholds::default();
        assert_eq!(t.level(Duration::from_millis(9_999)), None);
        assert_eq!(t.level(Duration::from_secs(10)), Some(Level::Warn));
        assert_eq!(t.level(Duration::from_secs(60)), Some(Level::Critical));
        assert_eq!(t.level(Duration::from_secs(150)), Some(Level::Imminent));
        assert!(Level::Warn < Level::Critical && Level::Critical < Level::Imminent);
    }

    #[test]
    fn out_of_order_thresholds_are_refused() {
        let s = Duration::from_secs;
        assert!(Thresholds::new(s(10), s(5), s(150)).is_err());
        assert!(Thresholds::new(s(10), s(60), s(30)).is_err());
        assert!(Thresholds::new(s(0), s(60), s(150)).is_err());
        assert!(Thresholds::new(s(2), s(2), s(2)).is_ok());
    }

    #[test]
    fn budget_is_waited_over_180s() {
        assert!((budget_used(Duration::from_secs(90)) - 0.5).abs() < 1e-9);
    }
}
