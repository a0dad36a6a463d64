//! Block devices as the last hop of a chain: for a wait on writeback (a
//! umount's sync, an fsync), the device it waits on, with the requests in
//! flight there and the write rate over the last seconds.
//!
//! The kernel counts per device (`probe-ebpf/src/block.rs`); each scan sums
//! the CPUs and keeps a short history of bytes written to turn into a rate.

use crate::{
    graph::model::{HolderId, Terminal},
    kernel::loader::{take_map, WatchError},
};
use aya::maps::{MapData, PerCpuHashMap};
use plegwatch_abi::{block_maps, DevIo};
use std::collections::{HashMap, VecDeque};

/// How far back the write rate looks.
pub const RATE_WINDOW_NS: u64 = 5_000_000_000;

/// A device as the kernel names it in `dev_t` (major << 20 | minor).
pub fn kernel_dev(dev: (u32, u32)) -> u32 {
    (dev.0 << 20) | (dev.1 & 0xf_ffff)
}

/// One device now.
#[derive(Clone, Debug, PartialEq)]
pub struct DevState {
    pub dev: (u32, u32),
    pub name: Option<String>,
    pub in_flight: u64,
    /// Bytes written per second over the window (none before two samples).
    pub write_bps: Option<f64>,
    pub window_s: f64,
}

impl DevState {
    /// The device as a chain's end.
    pub fn terminal(&self) -> Terminal {
        let name = self.name.as_deref().map(|n| format!(" ({n})")).unwrap_or_default();
        let rate = match self.write_bps {
            Some(bps) => format!(", {} written over the last {:.0} s", human_rate(bps), self.window_s),
            None => String::new(),
        };
        Terminal {
            id: Some(HolderId::Device(self.dev.0, self.dev.1)),
            kind: "device",
            pid: None,
            comm: None,
            what: format!("block device {}:{}{name}: {} requests in flight{rate}", self.dev.0, self.dev.1, self.in_flight),
        }
    }
}

/// `1.0 MiB/s`, `512 KiB/s`, `0 B/s`.
pub fn human_rate(bps: f64) -> String {
    if bps >= 1024.0 * 1024.0 {
        format!("{:.1} MiB/s", bps / (1024.0 * 1024.0))
    } else if bps >= 1024.0 {
        format!("{:.0} KiB/s", bps / 1024.0)
    } else {
        format!("{bps:.0} B/s")
    }
}

/// The rate of a cumulative counter over its samples: (ns, value), oldest first.
pub fn rate(samples: &VecDeque<(u64, u64)>) -> Option<f64> {
    let (t0, v0) = *samples.front()?;
    let (t1, v1) = *samples.back()?;
    (t1 > t0).then(|| v1.saturating_sub(v0) as f64 / ((t1 - t0) as f64 / 1e9))
}

/// The kernel's per-device counters and their recent history.
pub struct DeviceIo {
    map: PerCpuHashMap<MapData, u32, DevIo>,
    /// Per kernel dev_t: (sample ns, bytes written so far).
    written: HashMap<u32, VecDeque<(u64, u64)>>,
    /// Per kernel dev_t: requests in flight at the last sample.
    in_flight: HashMap<u32, u64>,
    names: HashMap<u32, Option<String>>,
}

impl DeviceIo {
    pub fn new(ebpf: &mut aya::Ebpf) -> Result<Self, WatchError> {
        Ok(DeviceIo { map: take_map(ebpf, block_maps::DEV_IO)?, written: HashMap::new(), in_flight: HashMap::new(), names: HashMap::new() })
    }

    /// Reads the counters (one map walk over at most `DEV_IO_MAX` devices).
    pub fn sample(&mut self, now_ns: u64) {
        for (dev, per_cpu) in self.map.iter().filter_map(Result::ok) {
            let (mut issued, mut completed, mut written) = (0u64, 0u64, 0u64);
            for v in per_cpu.iter() {
                issued += v.issued;
                completed += v.completed;
                written += v.write_bytes;
            }
            self.in_flight.insert(dev, issued.saturating_sub(completed));
            let h = self.written.entry(dev).or_default();
            h.push_back((now_ns, written));
            while h.front().is_some_and(|(t, _)| now_ns.saturating_sub(*t) > RATE_WINDOW_NS) {
                h.pop_front();
            }
        }
    }

    /// A device's state now, if the kernel has seen I/O on it.
    pub fn state(&mut self, dev: (u32, u32)) -> Option<DevState> {
        let k = kernel_dev(dev);
        let in_flight = *self.in_flight.get(&k)?;
        let h = self.written.get(&k);
        let window_s = h.and_then(|h| Some((h.back()?.0 - h.front()?.0) as f64 / 1e9)).unwrap_or(0.0);
        let name = self.names.entry(k).or_insert_with(|| dev_name(dev)).clone();
        Some(DevState { dev, name, in_flight, write_bps: h.and_then(rate), window_s })
    }
}

/// `DEVNAME` from `/sys/dev/block/MAJ:MIN/uevent` (`loop1`, `vda`).
fn dev_name(dev: (u32, u32)) -> Option<String> {
    let text = std::fs::read_to_string(format!("/sys/dev/block/{}:{}/uevent", dev.0, dev.1)).ok()?;
    text.lines().find_map(|l| l.strip_prefix("DEVNAME=")).map(String::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_devices_read_as_words() {
        let h: VecDeque<(u64, u64)> = [(0, 0), (2_000_000_000, 1 << 20), (4_000_000_000, 4 << 20)].into_iter().collect();
        assert_eq!(rate(&h), Some(1024.0 * 1024.0));
        assert_eq!(rate(&[(5, 9)].into_iter().collect()), None, "one sample: no rate yet");
        assert_eq!(kernel_dev((7, 1)), (7 << 20) | 1);
        let s = DevState { dev: (7, 1), name: Some("loop1".into()), in_flight: 3, write_bps: Some(1024.0 * 1024.0), window_s: 5.0 };
        assert_eq!(s.terminal().what, "block device 7:1 (loop1): 3 requests in flight, 1.0 MiB/s written over the last 5 s");
        assert_eq!(human_rate(512.0 * 1024.0), "512 KiB/s");
    }
}
