//! `plegwatch doctor`.

use crate::doctor;
use clap::Args;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Prints the report; fails with a one-line reason when something required is missing.
pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let report = doctor::run();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", doctor::render(&report));
    }
    match report.problem {
        None => Ok(()),
        Some(p) => anyhow::bail!("this node is not ready for plegwatch: {p}"),
    }
}
