//! The graph's lookups at one scan: processes, sockets and children's pipes from the
//! `observe` layer (which implements the graph's `Procs` and `ChildProcs`), and the
//! kernel mutexes threads wait on from the off-CPU source.

use crate::{
    graph::{
        children::{ChildProcs, PipeLink},
        resolvers::{MutexWait, Procs},
        scan::Lookups,
    },
    observe::Observe,
    sources::offcpu::OffCpu,
};

pub(super) struct World<'a> {
    pub observe: &'a mut Observe,
    /// None without the off-CPU probe: no thread is then known to wait on a mutex.
    pub offcpu: Option<&'a OffCpu>,
}

impl Procs for World<'_> {
    fn children(&mut self, pid: u32) -> Vec<u32> {
        self.observe.children(pid)
    }
    fn state(&mut self, pid: u32) -> Option<char> {
        self.observe.state(pid)
    }
    fn stuck_since(&mut self, pid: u32, now_ns: u64) -> Option<u64> {
        self.observe.stuck_since(pid, now_ns)
    }
    fn comm(&mut self, pid: u32) -> Option<String> {
        self.observe.comm(pid)
    }
    fn connected(&mut self, client: u32, server: u32) -> bool {
        self.observe.connected(client, server)
    }
}

impl ChildProcs for World<'_> {
    fn child_pipes(&mut self, pid: u32) -> Vec<PipeLink> {
        self.observe.child_pipes(pid)
    }
    fn started_ns(&mut self, pid: u32) -> Option<u64> {
        self.observe.started_ns(pid)
    }
}

impl Lookups for World<'_> {
    fn mutex_wait(&mut self, tid: u32, now_ns: u64) -> Option<MutexWait> {
        self.offcpu?.mutex_wait(tid, now_ns)
    }
}
