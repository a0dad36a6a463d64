//! The data flows one way, checked on the sources themselves: kernel and
//! proto (a crate of its own, `probe-user/proto`) → observe → sources → graph → events → sinks, with the engine
//! (the scheduler) running the loop and the CLI on top. Reading the `use`
//! lines (comments and test modules left out):
//! - no two top-level modules import each other, directly or through others;
//! - `graph` (the model, resolvers and incidents) imports only the vocabulary
//!   it needs, never a source, the kernel or `/proc`. What it must look up
//!   (children, states, socket peers, pipes, kernel mutexes) it asks through
//!   its own traits (`Procs`, `ChildProcs`, `scan::Lookups`); `observe`
//!   implements them (the graph names the question, the layer below answers),
//!   and the engine joins in what only a source knows (the off-CPU probe's
//!   mutexes);
//! - `sinks` read events and never call back into the engine;
//! - no source takes a sink: sources hand their events back to the scheduler;
//! - nothing but `cli` and `sinks` writes to stdout or stderr (logs go
//!   through `tracing`, set up by `logging`);
//! - the pure parsers (`proto`, the crate `plegwatch-proto`) do no I/O: no
//!   files, no sockets, outside their tests.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each top-level module's code, without comments and test code: `#[cfg(test)]`
/// items anywhere in a file, and the files of modules declared `#[cfg(test)] mod x;`.
fn modules() -> BTreeMap<String, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    // (file, top-level module, its code) and the test-only module files.
    let mut files: Vec<(std::path::PathBuf, String, String)> = Vec::new();
    let mut test_files: BTreeSet<std::path::PathBuf> = BTreeSet::new();
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
            if matches!(top.as_str(), "lib" | "main" | "architecture") {
                continue;
            }
            let text = std::fs::read_to_string(&p).expect("readable");
            let (code, test_mods) = non_test_code(&text);
            // `mod x;` in `a/mod.rs` or `a.rs` is `a/x.rs` or `a/x/mod.rs`.
            let here = match p.file_name().and_then(|f| f.to_str()) {
                Some("mod.rs") => dir.clone(),
                _ => p.with_extension(""),
            };
            for m in test_mods {
                test_files.insert(here.join(format!("{m}.rs")));
                test_files.insert(here.join(&m).join("mod.rs"));
            }
            files.push((p, top, code));
        }
    }
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    for (p, top, code) in files {
        if !test_files.contains(&p) {
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
    may("sinks", &["durations", "events", "graph", "levels", "latency", "style", "syscalls"]);
    may("events", &["clock", "graph", "latency", "levels", "syscalls"]);
}

#[test]
fn each_layer_imports_only_the_layers_before_it() {
    let g = graph();
    let vocabulary = ["clock", "durations", "heap", "latency", "levels", "syscalls"];
    let may = |m: &str, layers: &[&str]| {
        let extra: Vec<&String> = g[m].iter().filter(|i| !layers.contains(&i.as_str()) && !vocabulary.contains(&i.as_str())).collect();
        assert!(extra.is_empty(), "{m} imports {extra:?}; besides the vocabulary it may import only {layers:?}");
    };
    // The pure parsers stand alone by construction: `proto` is the crate
    // `plegwatch-proto` (probe-user/proto), which cannot name this one.
    // The kernel layer names its probes in the `ready` event.
    may("kernel", &["events"]);
    // Cached lookups serve the graph's `Procs`, read sockets with the parsers,
    // and ask the kernel over netlink through `kernel::netlink` (sock_diag).
    may("observe", &["kernel", "proto", "graph"]);
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
fn holders_are_decided_only_in_the_graph() {
    // A stall's holder, cause and chain are hops from `graph::scan::Scanned::links`
    // (set by the scheduler's graph step): no source builds a hop or sets a holder.
    let code = &modules()["sources"];
    for bad in ["Hop {", "holder: Some", ".holder =", "cause: Some", ".cause =", "chain: vec!", ".chain ="] {
        assert!(!code.contains(bad), "a source names `{bad}`: holders are decided once, by the wait-for graph");
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

/// `text` (a source file) without comment lines and `#[cfg(test)]` items: a
/// `mod x;` line (its name is returned, for the file to be left out too), or
/// an item to the brace that closes it.
fn non_test_code(text: &str) -> (String, Vec<String>) {
    let mut code = String::new();
    let mut test_mods = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        if t != "#[cfg(test)]" {
            code.push_str(line);
            code.push('\n');
            continue;
        }
        // The item under the attribute: skip it whole.
        let mut depth = 0usize;
        let mut opened = false;
        for item in lines.by_ref() {
            let it = item.trim();
            if !opened && it.ends_with(';') && !it.contains('{') {
                if let Some(name) = it.trim_start_matches("pub ").strip_prefix("mod ").and_then(|m| m.strip_suffix(';')) {
                    test_mods.push(name.trim().to_string());
                }
                break;
            }
            for ch in item.chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth = depth.saturating_sub(1),
                    _ => {}
                }
            }
            if opened && depth == 0 {
                break;
            }
        }
    }
    (code, test_mods)
}

/// What the parsers' crate may not name outside its tests: files, sockets.
const IO_PATHS: &[&str] = &["std::fs", "std::net", "std::os::unix::net", "libc::socket", "netlink_sys"];
/// The same as words: `File`, or `fs::` after a `use std::{fs, ...}`.
const IO_WORDS: &[&str] = &["File", "fs::"];

/// The I/O `code` names (see [`IO_PATHS`], [`IO_WORDS`]).
fn io_in(code: &str) -> Vec<&'static str> {
    let word_char = |c: char| c.is_alphanumeric() || c == '_';
    let as_word = |w: &str| {
        code.match_indices(w).any(|(i, _)| {
            let before = code[..i].chars().next_back().is_none_or(|c| !word_char(c));
            let after = code[i + w.len()..].chars().next().is_none_or(|c| !word_char(c)) || w.ends_with("::");
            before && after
        })
    };
    IO_PATHS.iter().filter(|p| code.contains(*p)).chain(IO_WORDS.iter().filter(|w| as_word(w))).copied().collect()
}

#[test]
fn the_parsers_do_no_io() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("proto/src");
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).expect("proto/src is readable").flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().and_then(|x| x.to_str()) == Some("rs") {
                files.push(p);
            }
        }
    }
    assert!(files.len() > 10, "proto's sources not found under {}", root.display());
    // Files of modules declared `#[cfg(test)] mod x;` (x.rs, or x/ whole),
    // each beside the file that declares it or in its folder.
    let mut test_only = Vec::new();
    let mut code_of = Vec::new();
    for f in &files {
        let (code, mods) = non_test_code(&std::fs::read_to_string(f).expect("readable"));
        let stem = f.file_stem().and_then(|s| s.to_str()).unwrap_or("");
        let dir = f.parent().expect("in a folder");
        let base = if matches!(stem, "mod" | "lib") { dir.to_path_buf() } else { dir.join(stem) };
        test_only.extend(mods.iter().flat_map(|m| [base.join(format!("{m}.rs")), base.join(m)]));
        code_of.push((f, code));
    }
    let mut checked = 0;
    for (f, code) in code_of {
        if test_only.iter().any(|t| f.starts_with(t)) {
            continue;
        }
        checked += 1;
        let found = io_in(&code);
        let rel = f.strip_prefix(&root).unwrap_or(f);
        assert!(
            found.is_empty(),
            "proto/src/{} names {found:?} outside its tests: the parsers take bytes; plegwatch's observe/ and kernel/ read them",
            rel.display()
        );
    }
    assert!(checked > 10 && checked < files.len(), "{checked} of {} files checked", files.len());
}

#[test]
fn test_code_and_io_are_told_apart() {
    let text = "use std::io;\n#[cfg(test)]\nmod synth;\n// std::fs in a comment\nfn f() {}\n#[cfg(test)]\nmod tests {\n    fn g() { let _ = std::fs::read(\"x\"); }\n}\nfn h() {}\n";
    let (code, mods) = non_test_code(text);
    assert_eq!(code, "use std::io;\nfn f() {}\nfn h() {}\n");
    assert_eq!(mods, ["synth"]);
    assert_eq!(io_in("let f = File::open(p);"), ["File"]);
    assert_eq!(io_in("use std::{fs, io};\nfs::read(p)"), ["fs::"]);
    assert_eq!(io_in("use std::fs::read;"), ["std::fs", "fs::"]);
    assert_eq!(io_in("let s = std::os::unix::net::UnixStream::connect(p);"), ["std::os::unix::net"]);
    assert!(io_in("struct FileExt; fn socket(&self) {} let x = self.fs_id; Profile::new()").is_empty());
}

#[test]
fn imports_are_read_from_use_lines() {
    let known: BTreeSet<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
    let got = imports("use crate::{a::{x, y}, b, c::z};\nlet q = crate::d::f();", &known);
    assert_eq!(got, known);
}
