//! The device resolver: a umount or sync wait → the block device its writeback goes
//! to, with that device's state now (requests in flight, write rate).
//!
//! The kernel-wait source finds each wait's device once (its mount, or its path's
//! filesystem) and the block-I/O source says what the device is doing; the edge is
//! exact, as both come from the kernel.

use super::model::{Edge, EdgeKind, Exactness, HeldBy, Terminal, WaitKey};

/// A wait's writeback device and its state now.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceFact {
    pub wait: WaitKey,
    /// The device as a chain's end (its numbers, name, requests in flight and rate).
    pub device: Terminal,
    /// How the device was found (the mount, or the path's filesystem).
    pub how: String,
}

/// One exact `device` edge per fact.
pub fn device_edges(facts: &[DeviceFact]) -> Vec<Edge> {
    facts
        .iter()
        .map(|f| Edge {
            from: f.wait,
            to: HeldBy::Terminal(f.device.clone()),
            kind: EdgeKind::Device,
            evidence: format!("{}; block:block_rq_issue/complete count its requests", f.how),
            exactness: Exactness::Exact,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::model::HolderId;

    #[test]
    fn each_fact_is_an_exact_edge_to_its_device_with_how_it_was_found() {
        let wait = WaitKey::Kernel { tid: 7, start_ns: 1 };
        let device = Terminal { id: Some(HolderId::Device(8, 0)), kind: "device", pid: None, comm: None, what: "block device 8:0".into() };
        let edges = device_edges(&[DeviceFact { wait, device: device.clone(), how: "the mount's device".into() }]);
        assert_eq!(edges.len(), 1);
        assert_eq!(edges[0].from, wait);
        assert_eq!(edges[0].to, HeldBy::Terminal(device));
        assert_eq!(edges[0].kind, EdgeKind::Device);
        assert_eq!(edges[0].exactness, Exactness::Exact);
        assert!(edges[0].evidence.starts_with("the mount's device; "), "{}", edges[0].evidence);
    }
}
