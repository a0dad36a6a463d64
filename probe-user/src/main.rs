//! The `plegwatch` binary: parse, set up logging, run, and turn any error into
//! one line on stderr with a non-zero exit.

use clap::Parser as _;
use plegwatch::{
    cli::{Cli, Command, doctor, report, watch},
    logging,
};

fn main() {
    let cli = Cli::parse();
    logging::init(cli.log_format);
    let result = match cli.command {
        Command::Doctor(args) => doctor::run(args),
        Command::Report(args) => report::run(args),
        Command::Watch(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(anyhow::Error::from)
            .and_then(|rt| rt.block_on(watch::run(args))),
    };
    if let Err(e) = result {
        eprintln!("plegwatch: error: {}", format!("{e:#}").replace('\n', " "));
        std::process::exit(1);
    }
}
