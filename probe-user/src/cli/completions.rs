//! `plegwatch completions SHELL` (clap_complete) and `plegwatch man`
//! (clap_mangen): both generated from the command line's own definition, so
//! they never drift from `--help`.

use clap::{Args, CommandFactory, ValueEnum};
use std::io::Write;

/// The shells a completion script is written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// Print a shell completion script.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  plegwatch completions bash > /usr/share/bash-completion/completions/plegwatch
  plegwatch completions zsh > \"${fpath[1]}/_plegwatch\"
  plegwatch completions fish > ~/.config/fish/completions/plegwatch.fish")]
pub struct CompletionsArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: Shell,
}

/// Print the man page.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  plegwatch man | man -l -
  plegwatch man > /usr/local/share/man/man1/plegwatch.1")]
pub struct ManArgs {}

/// The completion script for `shell`.
pub fn completion(shell: Shell) -> Vec<u8> {
    let mut cmd = super::Cli::command();
    let mut out = Vec::new();
    match shell {
        Shell::Bash => clap_complete::generate(clap_complete::Shell::Bash, &mut cmd, "plegwatch", &mut out),
        Shell::Zsh => clap_complete::generate(clap_complete::Shell::Zsh, &mut cmd, "plegwatch", &mut out),
        Shell::Fish => clap_complete::generate(clap_complete::Shell::Fish, &mut cmd, "plegwatch", &mut out),
    }
    out
}

/// The man page (roff): the command, its options and subcommands, examples
/// and the exit codes.
pub fn man_page() -> std::io::Result<Vec<u8>> {
    let cmd = super::Cli::command().after_help(None::<&str>).after_long_help(None::<&str>).long_version(None::<&str>);
    let man = clap_mangen::Man::new(cmd.clone());
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    man.render_subcommands_section(&mut out)?;
    // Each subcommand's own options, as `plegwatch SUB --help` gives them.
    for sub in cmd.get_subcommands().filter(|s| s.get_name() != "help") {
        let mut roff = clap_mangen::roff::Roff::new();
        roff.control("SH", [format!("PLEGWATCH {}", sub.get_name().to_uppercase()).as_str()]);
        roff.text([clap_mangen::roff::roman(sub.get_about().map(|a| a.to_string()).unwrap_or_default())]);
        for arg in sub.get_arguments().filter(|a| !a.is_hide_set() && !a.is_global_set()) {
            let name = match (arg.get_short(), arg.get_long()) {
                (Some(s), Some(l)) => format!("-{s}, --{l}"),
                (None, Some(l)) => format!("--{l}"),
                (Some(s), None) => format!("-{s}"),
                (None, None) => format!("<{}>", arg.get_id().as_str().to_uppercase()),
            };
            roff.control("TP", []);
            roff.text([clap_mangen::roff::bold(name)]);
            roff.text([clap_mangen::roff::roman(arg.get_help().map(|h| h.to_string()).unwrap_or_default())]);
        }
        roff.to_writer(&mut out)?;
    }
    let mut roff = clap_mangen::roff::Roff::new();
    roff.control("SH", ["EXAMPLES"]);
    for line in super::EXAMPLES.lines().skip(1).take_while(|l| !l.is_empty()) {
        roff.control("TP", []);
        roff.text([clap_mangen::roff::roman(line.trim())]);
    }
    roff.control("SH", ["EXIT STATUS"]);
    for (code, what) in super::EXIT_CODES {
        roff.control("TP", []);
        roff.text([clap_mangen::roff::bold(code.to_string())]);
        roff.text([clap_mangen::roff::roman(*what)]);
    }
    roff.to_writer(&mut out)?;
    man.render_version_section(&mut out)?;
    Ok(out)
}

/// Runs `completions`.
pub fn run_completions(args: CompletionsArgs) -> anyhow::Result<()> {
    write_stdout(&completion(args.shell))
}

/// Runs `man`.
pub fn run_man(_: ManArgs) -> anyhow::Result<()> {
    write_stdout(&man_page()?)
}

fn write_stdout(body: &[u8]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    out.write_all(body).and_then(|()| out.flush())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subcommands() -> Vec<String> {
        super::super::Cli::command().get_subcommands().map(|s| s.get_name().to_string()).collect()
    }

    #[test]
    fn every_completion_names_every_subcommand() {
        let subs = subcommands();
        assert!(subs.len() >= 8, "{subs:?}");
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let script = String::from_utf8(completion(shell)).unwrap();
            for s in &subs {
                assert!(script.contains(s.as_str()), "{shell:?} completion lacks {s}");
            }
            let flag = |f: &str| if shell == Shell::Fish { format!("-l {f}") } else { format!("--{f}") };
            assert!(
                script.contains(&flag("color")) && script.contains(&flag("warn")) && script.contains(&flag("from")),
                "{shell:?}: global and subcommand flags"
            );
        }
    }

    /// The bash script parses (`bash -n`), where bash is installed.
    #[test]
    fn the_bash_completion_is_valid_bash() {
        let Ok(bash) = which_bash() else { return };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("plegwatch.bash");
        std::fs::write(&path, completion(Shell::Bash)).unwrap();
        let st = std::process::Command::new(bash).arg("-n").arg(&path).status().unwrap();
        assert!(st.success(), "bash -n on the completion script: {st}");
    }

    fn which_bash() -> Result<&'static str, ()> {
        ["/bin/bash", "/usr/bin/bash"].into_iter().find(|p| std::path::Path::new(p).exists()).ok_or(())
    }

    #[test]
    fn the_man_page_has_every_subcommand_its_flags_and_the_exit_codes() {
        let page = String::from_utf8(man_page().unwrap()).unwrap();
        assert!(page.starts_with(".ie") || page.contains(".TH plegwatch"), "{}", &page[..200.min(page.len())]);
        for s in subcommands() {
            assert!(page.contains(&s), "man page lacks {s}");
        }
        for needle in ["EXIT STATUS", "EXAMPLES", "PLEGWATCH WATCH", "\\-\\-warn", "\\-\\-from", "bad input"] {
            assert!(page.contains(needle), "man page lacks {needle}");
        }
        // man(1) renders it without complaint, where man is installed.
        if std::path::Path::new("/usr/bin/groff").exists() {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("plegwatch.1");
            std::fs::write(&path, &page).unwrap();
            let out = std::process::Command::new("/usr/bin/groff").args(["-man", "-Tutf8", "-ww", "-z"]).arg(&path).output().unwrap();
            assert!(out.status.success() && out.stderr.is_empty(), "groff: {}", String::from_utf8_lossy(&out.stderr));
        }
    }
}
