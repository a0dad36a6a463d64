//! Deadlines and timing bounds on a slow clock.
//!
//! Every bound a scenario asserts on plegwatch's timing ("flagged within 1 s of `--warn`")
//! and every deadline it waits for something by holds on this machine kind. In a guest
//! under QEMU's TCG emulation the same work takes several times as long, and unevenly, so
//! `cargo xtask test --kernel` sets [`SCALE_ENV`], by which those bounds and deadlines are
//! multiplied ([`scaled`]). Nothing else changes: the scenarios run the same steps and
//! assert the same facts.

use std::time::Duration;

/// The multiplier, a number from 1 to 20 (default 1): how much slower than this machine
/// kind the clock the scenarios run under is.
pub const SCALE_ENV: &str = "PLEGWATCH_TEST_TIME_SCALE";

/// [`SCALE_ENV`]'s value, 1 when unset; a value that is not a number from 1 to 20 fails
/// the test, naming it.
pub fn scale() -> f64 {
    match std::env::var(SCALE_ENV) {
        Err(_) => 1.0,
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(s) if (1.0..=20.0).contains(&s) => s,
            _ => panic!("{SCALE_ENV}={v:?}: want a number from 1 to 20"),
        },
    }
}

/// `d` on the scenarios' clock: `d` times [`scale`].
pub fn scaled(d: Duration) -> Duration {
    d.mul_f64(scale())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unset_is_one() {
        if std::env::var_os(SCALE_ENV).is_none() {
            assert_eq!(scaled(Duration::from_secs(3)), Duration::from_secs(3));
        }
    }
}
