//! deploy/prometheus-rules.yaml: `promtool check rules`, then its unit tests
//! (deploy/prometheus-rules.test.yaml) with `promtool test rules`. No root needed.

use std::process::Command;

use plegwatch_scenarios::{canary, preflight};

#[test]
fn alerting_rules_check_and_pass_their_unit_tests() {
    let Some(promtool) = canary::which("promtool") else {
        preflight::skip("prometheus_rules", "no promtool on PATH (Debian package prometheus; `cargo xtask setup`)");
        return;
    };
    let deploy = canary::repo_root().join("deploy");
    for args in [["check", "rules", "prometheus-rules.yaml"], ["test", "rules", "prometheus-rules.test.yaml"]] {
        let out = Command::new(&promtool).args(args).current_dir(&deploy).output().expect("run promtool");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        eprintln!("promtool {}:\n{text}", args.join(" "));
        assert!(out.status.success(), "promtool {} failed:\n{text}", args.join(" "));
        assert!(text.contains("SUCCESS"), "promtool {} said no SUCCESS:\n{text}", args.join(" "));
    }
}
