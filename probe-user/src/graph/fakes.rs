//! Test doubles for the resolvers' unit tests: a `/proc` that says what each
//! test tells it, and Go call facts.

use super::model::WaitKey;
use super::resolvers::{CallRole, GoCallFact, Procs};
use std::collections::HashMap;

/// Children, states and connections as a test sets them.
#[derive(Default)]
pub struct FakeProcs {
    pub children: HashMap<u32, Vec<u32>>,
    pub states: HashMap<u32, char>,
    /// The state of a process not in `states`.
    pub default_state: Option<char>,
    pub connected: Vec<(u32, u32)>,
    /// Every client is connected to every server.
    pub all_connected: bool,
}

impl Procs for FakeProcs {
    fn children(&mut self, pid: u32) -> Vec<u32> {
        self.children.get(&pid).cloned().unwrap_or_default()
    }
    fn state(&mut self, pid: u32) -> Option<char> {
        self.states.get(&pid).copied().or(self.default_state)
    }
    fn comm(&mut self, pid: u32) -> Option<String> {
        Some(format!("p{pid}"))
    }
    fn connected(&mut self, client: u32, server: u32) -> bool {
        self.all_connected || self.connected.contains(&(client, server))
    }
}

/// An open Go call of function id `func` on goroutine `g` of `tgid` (a Status
/// lock holder holds lock 0xc000).
pub fn go_call(tgid: u32, g: u64, func: u32, role: CallRole, start_ns: u64, container: Option<&str>) -> GoCallFact {
    GoCallFact {
        key: WaitKey::Go { tgid, g, func, start_ns },
        tgid,
        g,
        role,
        receiver: if role == CallRole::StatusHolder { 0xc000 } else { 0 },
        container: container.map(String::from),
        start_ns,
        function: "f",
        late: false,
    }
}
