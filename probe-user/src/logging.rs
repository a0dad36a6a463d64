//! Logs go to stderr, as human text or JSON; aya's `log` records are kept.

use tracing_subscriber::{EnvFilter, fmt};

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The default level: `warn` on a terminal (a person watching wants the
/// incidents, not the start-up chatter), `info` for a log collector; each `-v`
/// raises it one step.
pub fn default_level(verbose: u8, terminal: bool) -> &'static str {
    match (verbose, terminal) {
        (0, true) => "warn",
        (0, false) | (1, _) => "info",
        (2, _) => "debug",
        _ => "trace",
    }
}

/// Sets up logging; the level comes from `PLEGWATCH_LOG`, else [`default_level`].
pub fn init(format: LogFormat, verbose: u8, color: crate::style::ColorChoice) {
    let _ = tracing_log::LogTracer::init();
    use std::io::IsTerminal as _;
    let stderr = std::io::stderr();
    let filter = EnvFilter::try_from_env("PLEGWATCH_LOG")
        .unwrap_or_else(|_| EnvFilter::new(default_level(verbose, stderr.is_terminal())));
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(color.for_stream(&stderr))
        .with_target(false);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn quiet_on_a_terminal_and_each_v_raises_it() {
        use super::default_level;
        assert_eq!(default_level(0, true), "warn");
        assert_eq!(default_level(0, false), "info");
        assert_eq!(default_level(1, true), "info");
        assert_eq!(default_level(2, true), "debug");
        assert_eq!(default_level(2, false), "debug");
    }
}
