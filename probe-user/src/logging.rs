//! Logs go to stderr, as human text or JSON; aya's `log` records are kept.

use tracing_subscriber::{EnvFilter, fmt};

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Sets up logging; the level comes from `PLEGWATCH_LOG` (default `info`).
pub fn init(format: LogFormat) {
    let _ = tracing_log::LogTracer::init();
    let filter =
        EnvFilter::try_from_env("PLEGWATCH_LOG").unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal as _;
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
