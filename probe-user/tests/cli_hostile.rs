//! Hostile flags and config, through the built binary (no root needed: each
//! is refused before anything is loaded). Each gives exit code 2, one line on
//! stderr naming the flag or key and the bad value, and never a panic.

use std::process::Command;

/// Runs `plegwatch ARGS`; every case is refused before it would run (the
/// `--duration 3s` on watch and daemon bounds a case wrongly accepted).
fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_plegwatch")).args(args).env("RUST_BACKTRACE", "1").output().expect("run plegwatch");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn bad_values_exit_2_with_one_line_naming_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).expect("write config");
        p.to_string_lossy().into_owned()
    };
    let bad_toml = cfg("bad.toml", "warn = \"5s\nlisten = 1\n");
    let unknown_key = cfg("unknown.toml", "warnn = \"5s\"\n");
    let huge = cfg("huge.toml", "warn = \"1e20\"\n");
    let empty_comm = cfg("comm.toml", "comm = [\"\"]\n");
    let order = cfg("order.toml", "critical = \"5s\"\n");
    let cases: Vec<(Vec<&str>, Vec<&str>)> = vec![
        (vec!["watch", "--warn", "1e20"], vec!["--warn", "1e20"]),
        (vec!["watch", "--warn", "-3"], vec!["--warn", "-3"]),
        (vec!["watch", "--warn", "0"], vec!["--warn", "greater than 0"]),
        (vec!["watch", "--imminent", "2d"], vec!["--imminent", "2d", "1 day"]),
        (vec!["watch", "--duration", "1e300"], vec!["--duration", "1e300"]),
        (vec!["watch", "--comm", ""], vec!["--comm", "empty comm"]),
        (vec!["watch", "--comm", "containerd-shim-runc-v2"], vec!["--comm", "containerd-shim-runc-v2"]),
        (vec!["watch", "--warn", "70s", "--duration", "3s"], vec!["--critical", "--warn", "70s"]),
        (vec!["watch", "--interval", "1s", "--duration", "3s"], vec!["--interval", "1s"]),
        (vec!["watch", "--bogus"], vec!["--bogus"]),
        (vec!["check", "--level", "bogus"], vec!["--level", "bogus", "warn, critical, imminent"]),
        (vec!["check", "--warn", "70s"], vec!["--critical", "70s"]),
        (vec!["report", "x", "--format", "gif"], vec!["--format", "gif"]),
        (vec!["--log-format", "xml", "doctor"], vec!["--log-format", "xml"]),
        (vec!["daemon", "--warn", "1e20"], vec!["--warn", "1e20"]),
        (vec!["daemon", "--listen", "localhost"], vec!["--listen", "localhost"]),
        (vec!["daemon", "--duration", "3s", "--config", &bad_toml], vec!["--config", "bad.toml", "line 1"]),
        (vec!["daemon", "--duration", "3s", "--config", &unknown_key], vec!["--config", "warnn"]),
        (vec!["daemon", "--duration", "3s", "--config", &huge], vec!["--config", "warn = \"1e20\""]),
        (vec!["daemon", "--duration", "3s", "--config", &empty_comm], vec!["--config", "comm = \"\""]),
        (vec!["daemon", "--duration", "3s", "--config", &order], vec!["--critical", "5s"]),
        (vec!["daemon", "--duration", "3s", "--config", "/nonexistent/d.toml"], vec!["--config", "/nonexistent/d.toml"]),
    ];
    for (args, wanted) in &cases {
        let (code, stdout, stderr) = run(args);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(code, Some(2), "{args:?}: exit {code:?}, stderr {stderr:?}");
        assert_eq!(lines.len(), 1, "{args:?}: want one line, got {stderr:?}");
        assert!(lines[0].starts_with("plegwatch: error: "), "{args:?}: {stderr:?}");
        for w in wanted {
            assert!(lines[0].contains(w), "{args:?}: {w:?} not in {stderr:?}");
        }
        assert!(!stderr.contains("panicked") && !stderr.contains("backtrace"), "{args:?}: {stderr:?}");
        assert!(stdout.is_empty(), "{args:?}: stdout {stdout:?}");
    }
}

#[test]
fn help_and_version_still_exit_0() {
    let (code, stdout, _) = run(&["--version"]);
    assert_eq!(code, Some(0));
    assert!(stdout.starts_with("plegwatch "), "{stdout}");
    let (code, stdout, _) = run(&["watch", "--help"]);
    assert_eq!(code, Some(0));
    assert!(stdout.contains("--warn"), "{stdout}");
}
