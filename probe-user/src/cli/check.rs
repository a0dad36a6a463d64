//! `plegwatch check`: a node-problem-detector custom plugin. It asks the
//! daemon running on this node (`--listen`, its local endpoint) for its open
//! incidents; it does not trace by itself.

use crate::{durations, export::check, levels::Level};
use clap::{Args, ValueEnum};
use std::{net::SocketAddr, time::Duration};

/// The level that counts as a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AtLevel {
    Warn,
    Critical,
    Imminent,
}

impl From<AtLevel> for Level {
    fn from(l: AtLevel) -> Level {
        match l {
            AtLevel::Warn => Level::Warn,
            AtLevel::Critical => Level::Critical,
            AtLevel::Imminent => Level::Imminent,
        }
    }
}

/// Exit 0: fine; 1: an incident at `--level` or worse; 2: can't tell (no
/// daemon, or not ready). One line on stdout, naming the root.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  plegwatch check                        exit 1 at critical or worse, from the daemon on 127.0.0.1:9792
  plegwatch check --level imminent --listen 127.0.0.1:19792")]
pub struct CheckArgs {
    /// The daemon's endpoint.
    #[arg(long, value_name = "ADDR", default_value = super::daemon::DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// An incident at this level or worse is a problem.
    #[arg(long, value_enum, default_value = "critical")]
    pub level: AtLevel,
    /// Give up (exit 2) after this long.
    #[arg(long, default_value = "3s", value_parser = durations::parse)]
    pub timeout: Duration,
}

/// Runs the check: prints its line, returns its exit code.
pub async fn run(args: CheckArgs) -> i32 {
    let answer = check::ask(args.listen, args.timeout).await;
    let (code, line) = check::verdict(answer, args.level.into());
    println!("{line}");
    code
}
