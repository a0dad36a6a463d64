//! `plegwatch report DIR`: re-renders an incident bundle from its `incident.json`.

use crate::sinks::report::{self, render};
use clap::{Args, ValueEnum};
use std::io::{IsTerminal, Write};
use std::path::PathBuf;

/// What to render.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// The flamegraph of blocked time (inferno SVG).
    Svg,
    /// Folded stacks, blocked nanoseconds (flamegraph.pl, speedscope).
    Folded,
    /// A gzipped pprof profile (go tool pprof, Pyroscope, Parca); binary.
    Pprof,
    /// The bundle's incident.json.
    Json,
    /// The incidents and their blocked time in words.
    Text,
    /// The wait-for graph of each incident (chain.svg).
    #[value(alias = "chain-svg")]
    Chain,
    /// The self-contained page (index.html), with latency.json's tables when
    /// it is beside incident.json.
    Html,
}

/// Re-render a bundle written by `watch --report-dir` (a bundle directory,
/// or its incident.json).
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  plegwatch report /var/lib/plegwatch/reports/20261123T230015Z-pid1097-incident-2
  plegwatch report DIR --format svg --output blocked.svg
  plegwatch report DIR --format html --output incident.html
  plegwatch report DIR --format pprof --output profile.pb.gz && go tool pprof -top profile.pb.gz")]
pub struct ReportArgs {
    /// The bundle directory (or its incident.json).
    pub bundle: PathBuf,
    /// What to render.
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Write here instead of stdout.
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// Runs `report`; the error is one line.
pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    let b = report::load(&args.bundle)?;
    let body = match args.format {
        Format::Svg => render::svg(&b)?,
        Format::Folded => render::folded_text(&b).into_bytes(),
        Format::Pprof => render::pprof_gz(&b)?,
        Format::Json => render::json(&b)?,
        Format::Text => render::text(&b).into_bytes(),
        Format::Chain => render::chain(&b)?.into_bytes(),
        Format::Html => render::html(&b, report::load_latency(&args.bundle).as_ref())?.into_bytes(),
    };
    match &args.output {
        Some(path) => std::fs::write(path, &body).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?,
        None => {
            let mut out = std::io::stdout().lock();
            if args.format == Format::Pprof && out.is_terminal() {
                anyhow::bail!("a pprof profile is binary: give --output FILE or redirect stdout");
            }
            out.write_all(&body).and_then(|()| out.flush())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::cli::{Cli, Command};
    use clap::Parser;

    #[test]
    fn formats_parse_and_bad_ones_are_refused() {
        let parse = |a: &[&str]| Cli::try_parse_from(std::iter::once("plegwatch").chain(a.iter().copied()));
        let Command::Report(r) = parse(&["report", "d", "--format", "pprof"]).unwrap().command else { panic!() };
        assert_eq!(r.format, super::Format::Pprof);
        assert!(parse(&["report", "d", "--format", "png"]).is_err());
        let Command::Report(r) = parse(&["report", "/nonexistent/bundle"]).unwrap().command else { panic!() };
        let e = format!("{:#}", super::run(r).unwrap_err());
        assert!(e.contains("/nonexistent/bundle/incident.json") && !e.contains('\n'), "{e}");
    }
}
