//! What a Go call's `stall` line says of its goroutine's kernel side: the kernel wait
//! its goroutine (or, failing that, its entry thread) is in, and the container its CRI
//! handler names. Who holds the call is not decided here: the wait-for graph links it
//! (`graph::resolvers::go_edges`), and the line takes its holder from there.

use super::{attach::ProbedFunc, targets::Role, GoOpen};
use serde_json::Value;
use std::collections::HashMap;

/// The kernel waits open at the last scan.
pub struct KernelWaits<'a> {
    /// By thread: a small JSON object (kind, syscall, phase, waited_s).
    pub by_tid: &'a HashMap<u32, Value>,
    /// By (process, goroutine) for processes of probed Go binaries: (tid, the same object).
    pub by_g: &'a HashMap<(u32, u64), (u32, Value)>,
}

impl KernelWaits<'_> {
    /// The kernel wait call `o`'s goroutine is in, else its entry thread's (a goroutine
    /// stays on its thread for a whole syscall; the entry thread may run another since).
    pub fn of_call(&self, o: &GoOpen) -> Option<&Value> {
        self.by_g.get(&(o.tgid, o.g)).map(|(_, w)| w).or_else(|| self.by_tid.get(&o.tid))
    }
}

/// The container a call on goroutine `o.g` works on: the argument of the CRI handler
/// open on the same goroutine (its request's container id).
pub fn container_of(o: &GoOpen, open: &[GoOpen], funcs: &HashMap<u32, ProbedFunc>) -> Option<String> {
    open.iter()
        .filter(|c| c.tgid == o.tgid && c.g == o.g && c.arg.is_some())
        .find(|c| funcs.get(&c.func).is_some_and(|f| f.role == Role::CriHandler))
        .and_then(|c| c.arg.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::gowatch::targets::Arg;
    use serde_json::json;
    use std::path::PathBuf;

    fn funcs() -> HashMap<u32, ProbedFunc> {
        let f = |symbol, role, arg| ProbedFunc {
            symbol,
            role,
            arg,
            recv: None,
            target: "containerd",
            binary: PathBuf::from("/usr/bin/containerd"),
        };
        let container = Some(Arg { name: "container", reg: 3, off: 0, getters: &[], gogo: &[] });
        HashMap::from([
            (1, f("github.com/containerd/containerd/pkg/cri/store/container.(*statusStorage).UpdateSync", Role::LockHold, None)),
            (2, f("github.com/containerd/containerd/pkg/cri/server.(*criService).UpdateContainerResources", Role::CriHandler, container)),
        ])
    }

    fn call(tgid: u32, g: u64, func: u32, arg: Option<&str>) -> GoOpen {
        GoOpen {
            g,
            func,
            tgid,
            tid: tgid,
            comm: "containerd".into(),
            start_ns: 1_000,
            receiver: 0xc000,
            arg: arg.map(String::from),
            start: Default::default(),
        }
    }

    #[test]
    fn the_cri_handler_on_the_same_goroutine_names_the_container() {
        let funcs = funcs();
        let open = vec![
            call(7, 0x10, 2, Some("abc123")),
            call(7, 0x10, 1, None),
            call(7, 0x20, 2, Some("other")),
            call(8, 0x10, 2, Some("elsewhere")),
        ];
        assert_eq!(container_of(&open[1], &open, &funcs).as_deref(), Some("abc123"));
        // Another goroutine's, or another process's, handler does not count.
        assert_eq!(container_of(&call(9, 0x10, 1, None), &open, &funcs), None);
    }

    #[test]
    fn the_goroutines_own_kernel_wait_comes_before_its_entry_threads() {
        let by_tid = HashMap::from([(7, json!({"syscall": "read"}))]);
        let by_g = HashMap::from([((7, 0x10), (99, json!({"syscall": "fdatasync"})))]);
        let waits = KernelWaits { by_tid: &by_tid, by_g: &by_g };
        assert_eq!(waits.of_call(&call(7, 0x10, 1, None)).map(|w| w["syscall"].clone()), Some(json!("fdatasync")));
        assert_eq!(waits.of_call(&call(7, 0x20, 1, None)).map(|w| w["syscall"].clone()), Some(json!("read")));
    }
}
