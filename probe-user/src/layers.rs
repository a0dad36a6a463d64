//! The data flows one way, checked on the sources themselves: kernel and
//! proto (a crate of its own, `probe-user/proto`) → observe → sources → graph → events → sinks, with the engine
//! (the scheduler) running the loop and the CLI on top. Reading the `use`
//! lines (comments and test modules left out):
//! - no two top-level modules import each other, directly or through others;
//! - `graph` (the model, resolvers and incidents) imports only the vocabulary
//!   it needs, never a source, the kernel or `/proc`;
//! - `sinks` read events and never call back into the engine;
//! - no source takes a sink: sources hand their events back to the scheduler;
//! - nothing but `cli` and `sinks` writes to stdout or stderr (logs go
//!   through `tracing`, set up by `logging`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each top-level module's code, without comments and test modules.
fn modules() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("src is readable").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
                continue;
            }
            if p.extension().and_then(|x| x.to_str()) != Some("rs") {
                continue;
            }
            let rel = p.strip_prefix(&root).expect("under src");
            let top = rel.components().next().and_then(|c| c.as_os_str().to_str()).unwrap_or("").trim_end_matches(".rs").to_string();
            if matches!(top.as_str(), "lib" | "main" | "layers") || rel.file_name().and_then(|f| f.to_str()) == Some("tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&p).expect("readable");
            let code = text.split("#[cfg(test)]").next().unwrap_or("");
            let code: String = code.lines().filter(|l| !l.trim_start().starts_with("//")).map(|l| format!("{l}\n")).collect();
            out.entry(top).or_default().push_str(&code);
        }
    }
    out
}

/// The crate's top-level modules `code` refers to (`crate::x`, `use crate::{x, ...}`).
fn imports(code: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(block) = rest.strip_prefix('{') {
            // `crate::{a, b::{c, d}, e::f}`: the names at depth 0.
            let mut depth = 0;
            let mut word = String::new();
            let mut at_start = true;
            for ch in block.chars() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => at_start = true,
                    c if depth == 0 && at_start && (c.is_alphanumeric() || c == '_') => word.push(c),
                    _ => {
                        if !word.is_empty() {
                            out.insert(std::mem::take(&mut word));
                        }
                        if depth == 0 && !ch.is_whitespace() {
                            at_start = false;
                        }
                    }
                }
            }
            if !word.is_empty() {
                out.insert(word);
            }
        } else {
            let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            out.insert(name);
        }
    }
    out.retain(|m| known.contains(m));
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules();
    let known: BTreeSet<String> = mods.keys().cloned().collect();
    mods.iter()
        .map(|(m, code)| {
            let mut i = imports(code, &known);
            i.remove(m);
            (m.clone(), i)
        })
        .collect()
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let g = graph();
    // Every module's reach, by a walk from it; a module that reaches itself is on a cycle.
    for start in g.keys() {
        let mut seen = BTreeSet::new();
        let mut todo: Vec<&String> = g[start].iter().collect();
        while let Some(m) = todo.pop() {
            assert_ne!(m, start, "{start} is on an import cycle: {g:#?}");
            if seen.insert(m.clone()) {
                todo.extend(g.get(m).into_iter().flatten());
            }
        }
    }
}

#[test]
fn the_graph_and_the_sinks_import_only_what_they_may() {
    let g = graph();
    let may = |m: &str, allowed: &[&str]| {
        let extra: Vec<&String> = g[m].iter().filter(|i| !allowed.contains(&i.as_str())).collect();
        assert!(extra.is_empty(), "{m} imports {extra:?}; it may import only {allowed:?}");
    };
    may("graph", &["levels", "syscalls"]);
    may("sinks", &["events", "graph", "levels", "latency", "style", "syscalls"]);
    may("events", &["clock", "graph", "latency", "levels", "syscalls"]);
}

#[test]
fn each_layer_imports_only_the_layers_before_it() {
    let g = graph();
    let vocabulary = ["clock", "durations", "latency", "levels", "syscalls"];
    let may = |m: &str, layers: &[&str]| {
        let extra: Vec<&String> = g[m].iter().filter(|i| !layers.contains(&i.as_str()) && !vocabulary.contains(&i.as_str())).collect();
        assert!(extra.is_empty(), "{m} imports {extra:?}; besides the vocabulary it may import only {layers:?}");
    };
    // The pure parsers stand alone by construction: `proto` is the crate
    // `plegwatch-proto` (probe-user/proto), which cannot name this one.
    // The kernel layer names its probes in the `ready` event.
    may("kernel", &["events"]);
    // Cached lookups serve the graph's `Procs` and read sockets with the parsers.
    may("observe", &["proto", "graph"]);
    // Sources read the kernel, use the lookups and parsers, and hand open waits to the
    // graph and events back to the scheduler: never the sinks, the engine or the CLI.
    may("sources", &["kernel", "proto", "observe", "graph", "events"]);
    may("engine", &["kernel", "proto", "observe", "sources", "graph", "events"]);
}

#[test]
fn no_source_takes_a_sink() {
    // A source hands its events back (`Vec<Event>`); the scheduler passes them on.
    let code = &modules()["sources"];
    for bad in ["Sink", "sink.emit", ".emit(&"] {
        assert!(!code.contains(bad), "a source names `{bad}`: sources hand events back, they never write to a sink");
    }
}

#[test]
fn only_the_cli_and_the_sinks_print() {
    for (m, code) in modules() {
        // `logging` sets up the log writer (stderr): logs are not output.
        if matches!(m.as_str(), "cli" | "sinks" | "logging") {
            continue;
        }
        for bad in ["println!", "print!(", "eprintln!", "eprint!(", "stdout()", "stderr()"] {
            assert!(!code.contains(bad), "{m} writes output ({bad}): the engine hands events to sinks");
        }
    }
}

#[test]
fn imports_are_read_from_use_lines() {
    let known: BTreeSet<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
    let got = imports("use crate::{a::{x, y}, b, c::z};\nlet q = crate::d::f();", &known);
    assert_eq!(got, known);
}
