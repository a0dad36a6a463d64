//! Logs go to stderr, as human text or JSON; aya's `log` records are kept.

use tracing_subscriber::{fmt, EnvFilter};

/// How logs are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// The default level: `warn` on a terminal (a person watching wants the
/// incidents, not the start-up chatter), `info` for a log collector; each `-v`
/// raises it one step. A command whose output is itself the report of what
/// it tried (`doctor`) logs errors only by default: its report already says
/// which probe attached how, so the log lines would say it twice.
pub fn default_level(verbose: u8, terminal: bool, reports_itself: bool) -> &'static str {
    match (verbose, terminal) {
        (0, _) if reports_itself => "error",
        (0, true) => "warn",
        (0, false) | (1, _) => "info",
        (2, _) => "debug",
        _ => "trace",
    }
}

/// Sets up logging; the level comes from `PLEGWATCH_LOG`, else [`default_level`].
pub fn init(format: LogFormat, verbose: u8, color: crate::style::ColorChoice, reports_itself: bool) {
    let _ = tracing_log::LogTracer::init();
    use std::io::IsTerminal as _;
    let stderr = std::io::stderr();
    let filter = EnvFilter::try_from_env("PLEGWATCH_LOG")
        .unwrap_or_else(|_| EnvFilter::new(default_level(verbose, stderr.is_terminal(), reports_itself)));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(color.for_stream(&stderr)).with_target(false);
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
        assert_eq!(default_level(0, true, false), "warn");
        assert_eq!(default_level(0, false, false), "info");
        assert_eq!(default_level(1, true, false), "info");
        assert_eq!(default_level(2, true, false), "debug");
        assert_eq!(default_level(2, false, false), "debug");
    }

    #[test]
    fn doctor_logs_errors_only_unless_asked() {
        use super::default_level;
        assert_eq!(default_level(0, false, true), "error");
        assert_eq!(default_level(0, true, true), "error");
        assert_eq!(default_level(1, false, true), "info");
    }
}
