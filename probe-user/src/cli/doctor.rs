//! `plegwatch doctor`.

use crate::doctor;
use clap::Args;
use std::path::PathBuf;

/// Besides the Go binaries running now and those at their usual paths, the
/// ones named here are checked too (`supported`, `partial` or `unmatched`).
///
/// Examples:
///   plegwatch doctor
///   plegwatch doctor --containerd /opt/containerd-2.3.4/bin/containerd --runc /usr/local/sbin/runc
///   plegwatch doctor --crio /usr/bin/crio
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct DoctorArgs {
    /// Print the report as one JSON object.
    #[arg(long)]
    pub json: bool,
    /// A containerd binary to check (repeatable).
    #[arg(long, value_name = "PATH")]
    pub containerd: Vec<PathBuf>,
    /// A containerd-shim-runc-v2 binary to check (repeatable).
    #[arg(long, value_name = "PATH")]
    pub shim: Vec<PathBuf>,
    /// A runc binary to check (repeatable).
    #[arg(long, value_name = "PATH")]
    pub runc: Vec<PathBuf>,
    /// A kubelet binary to check (repeatable).
    #[arg(long, value_name = "PATH")]
    pub kubelet: Vec<PathBuf>,
    /// A CRI-O (`crio`) binary to check (repeatable).
    #[arg(long, value_name = "PATH")]
    pub crio: Vec<PathBuf>,
}

impl DoctorArgs {
    /// The binaries named on the command line, with their target.
    pub fn named(&self) -> doctor::Named {
        let by = |t: &'static str, v: &[PathBuf]| v.iter().map(move |p| (t, p.clone())).collect::<Vec<_>>();
        let mut all = by("containerd", &self.containerd);
        all.extend(by("containerd-shim", &self.shim));
        all.extend(by("runc", &self.runc));
        all.extend(by("kubelet", &self.kubelet));
        all.extend(by("crio", &self.crio));
        doctor::Named(all)
    }
}

/// Prints the report; fails with a one-line reason when something required is missing.
pub fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let report = doctor::run(&args.named());
    if args.json {
        let mut json = serde_json::to_value(&report)?;
        json["verdict"] = report.verdict().into();
        println!("{json}");
    } else {
        print!("{}", doctor::render(&report));
    }
    match report.problem {
        None => Ok(()),
        Some(p) => anyhow::bail!("this node is not ready for plegwatch: {p}"),
    }
}
