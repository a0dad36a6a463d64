//! The `plegwatch` binary: parse, set up logging, run, and turn any error into
//! one line on stderr with a non-zero exit.

use clap::Parser as _;
use plegwatch::{
    cli::{self, check, completions, daemon, doctor, explain, report, watch, Cli, Command, UsageError},
    logging,
    sinks::TextOptions,
};

fn main() {
    // Before any thread exists (tokio's, the workers'): see `heap`.
    plegwatch::heap::tune();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            eprintln!("plegwatch: error: {}", cli::one_line(&e.render().to_string()));
            std::process::exit(cli::USAGE_EXIT);
        }
        // --help, --version.
        Err(e) => e.exit(),
    };
    logging::init(cli.log_format, cli.verbose, cli.color, matches!(cli.command, Command::Doctor(_)));
    let stdout_color = cli.color.for_stream(&std::io::stdout());
    let result = match cli.command {
        Command::Explain(args) => explain::run(args, TextOptions { color: stdout_color, ..Default::default() }),
        Command::Completions(args) => completions::run_completions(args),
        Command::Man(args) => completions::run_man(args),
        Command::Doctor(args) => doctor::run(args),
        Command::Report(args) => report::run(args),
        Command::Watch(args) => {
            tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(anyhow::Error::from).and_then(|rt| {
                rt.block_on(watch::run(args, TextOptions { color: stdout_color, verbose: cli.verbose > 0, ..Default::default() }))
            })
        }
        // The scan loop runs on this thread; the HTTP endpoint on the worker,
        // so a scrape never waits for a scan nor a scan for a scrape.
        Command::Daemon(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(daemon::run(args))),
        Command::Check(args) => {
            if let Err(e) = args.levels.thresholds() {
                eprintln!("plegwatch: error: {e}");
                std::process::exit(cli::USAGE_EXIT);
            }
            let code = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt.block_on(check::run(args)),
                Err(e) => {
                    println!("cannot tell: no runtime: {e}");
                    plegwatch::export::check::UNKNOWN
                }
            };
            std::process::exit(code);
        }
    };
    if let Err(e) = result {
        eprintln!("plegwatch: error: {}", format!("{e:#}").replace('\n', " "));
        std::process::exit(if e.is::<UsageError>() { cli::USAGE_EXIT } else { 1 });
    }
}
