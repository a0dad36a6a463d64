//! Method calls of one D-Bus connection, and whether they were answered
//! (stall pattern 4: runc's call to systemd that never gets its reply).
//!
//! A METHOD_CALL written without NO_REPLY_EXPECTED stays outstanding, keyed
//! by its serial, until a METHOD_RETURN or ERROR with that reply_serial is
//! read. Calls read (the process serves them, as systemd does) are kept the
//! same way until the process writes their answer.
//!
//! The connection's unique name comes from the bus's messages to it: the
//! reply to `Hello` (its body holds the name, but bodies are never read, and
//! its DESTINATION field holds it too), else any message the bus addressed
//! to a `:` name.

use super::{
    header::{Message, MessageKind},
    stream::{Direction, Fed, Stream},
};
use std::{
    collections::{HashMap, VecDeque},
    time::Duration,
};

/// At most this many open calls per connection and direction; the oldest
/// are dropped (and counted) past it.
pub const MAX_OPEN_CALLS: usize = 4096;
/// How many name signals a connection remembers.
pub const MAX_NAME_SIGNALS: usize = 64;

pub const BUS_NAME: &str = "org.freedesktop.DBus";

/// A METHOD_CALL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub serial: u32,
    pub flags: u8,
    pub destination: Option<String>,
    /// Who sent it, for calls read (set by the bus).
    pub sender: Option<String>,
    pub path: Option<String>,
    pub interface: Option<String>,
    pub member: Option<String>,
    pub at_ns: u64,
}

impl Call {
    fn from_message(m: &Message, now_ns: u64) -> Self {
        Call {
            serial: m.serial,
            flags: m.flags,
            destination: m.destination.clone(),
            sender: m.sender.clone(),
            path: m.path.clone(),
            interface: m.interface.clone(),
            member: m.member.clone(),
            at_ns: now_ns,
        }
    }

    /// `org.freedesktop.systemd1.Manager.StartTransientUnit`.
    pub fn method(&self) -> String {
        match (&self.interface, &self.member) {
            (Some(i), Some(m)) => format!("{i}.{m}"),
            (None, Some(m)) => m.clone(),
            (Some(i), None) => i.clone(),
            (None, None) => String::new(),
        }
    }
}

/// An open call and its age.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutstandingCall {
    pub call: Call,
    pub age: Duration,
}

/// A call answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    pub call: Call,
    /// MethodReturn or Error.
    pub reply: MessageKind,
    pub error_name: Option<String>,
    pub latency: Duration,
}

/// A NameOwnerChanged / NameAcquired / NameLost signal from the bus, header
/// only (the names themselves are in the body, which is never read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NameSignal {
    pub member: String,
    pub serial: u32,
    pub destination: Option<String>,
    pub at_ns: u64,
}

/// Open calls keyed by (peer, serial); the peer is the other side's name
/// for calls read, and `None` for calls written (their serials are ours).
#[derive(Clone, Debug, Default)]
struct OpenCalls {
    by_key: HashMap<(Option<String>, u32), Call>,
    dropped: u64,
}

impl OpenCalls {
    fn insert(&mut self, key: (Option<String>, u32), call: Call) {
        if self.by_key.len() >= MAX_OPEN_CALLS && !self.by_key.contains_key(&key) {
            let oldest = self.by_key.iter().min_by_key(|(_, c)| c.at_ns).map(|(k, _)| k.clone());
            if let Some(k) = oldest {
                self.by_key.remove(&k);
                self.dropped += 1;
            }
        }
        self.by_key.insert(key, call);
    }

    fn sorted(&self, now_ns: u64) -> Vec<OutstandingCall> {
        let mut v: Vec<_> = self
            .by_key
            .values()
            .map(|c| OutstandingCall { call: c.clone(), age: Duration::from_nanos(now_ns.saturating_sub(c.at_ns)) })
            .collect();
        v.sort_by_key(|o| (o.call.at_ns, o.call.serial));
        v
    }
}

/// The calls of one connection, fed with its parsed messages.
#[derive(Clone, Debug, Default)]
pub struct Calls {
    written: OpenCalls,
    read: OpenCalls,
    unique_name: Option<String>,
    hello_serial: Option<u32>,
    name_signals: VecDeque<NameSignal>,
}

impl Calls {
    pub fn new() -> Self {
        Self::default()
    }

    /// A message the process wrote.
    pub fn on_written(&mut self, m: &Message, now_ns: u64) {
        match m.kind {
            MessageKind::MethodCall => {
                if m.member.as_deref() == Some("Hello") && m.destination.as_deref() == Some(BUS_NAME) {
                    self.hello_serial = Some(m.serial);
                }
                if !m.no_reply_expected() {
                    self.written.insert((None, m.serial), Call::from_message(m, now_ns));
                }
            }
            MessageKind::MethodReturn | MessageKind::Error => {
                if let Some(rs) = m.reply_serial {
                    let key = (m.destination.clone(), rs);
                    if self.read.by_key.remove(&key).is_none() && m.destination.is_some() {
                        // A peer-to-peer connection has no names.
                        self.read.by_key.remove(&(None, rs));
                    }
                }
            }
            MessageKind::Signal => {}
        }
    }

    /// A message the process read. Returns the call it answers, if any.
    pub fn on_read(&mut self, m: &Message, now_ns: u64) -> Option<Answered> {
        if self.unique_name.is_none() {
            if let Some(d) = m.destination.as_deref().filter(|d| d.starts_with(':')) {
                let is_hello_reply = m.reply_serial.is_some() && m.reply_serial == self.hello_serial;
                if is_hello_reply || m.sender.as_deref() == Some(BUS_NAME) || self.hello_serial.is_none() {
                    self.unique_name = Some(d.to_string());
                }
            }
        }
        match m.kind {
            MessageKind::MethodCall => {
                if !m.no_reply_expected() {
                    self.read.insert((m.sender.clone(), m.serial), Call::from_message(m, now_ns));
                }
                None
            }
            MessageKind::MethodReturn | MessageKind::Error => {
                let call = self.written.by_key.remove(&(None, m.reply_serial?))?;
                Some(Answered {
                    latency: Duration::from_nanos(now_ns.saturating_sub(call.at_ns)),
                    call,
                    reply: m.kind,
                    error_name: m.error_name.clone(),
                })
            }
            MessageKind::Signal => {
                let member = m.member.as_deref().unwrap_or_default();
                if m.sender.as_deref() == Some(BUS_NAME)
                    && m.interface.as_deref() == Some(BUS_NAME)
                    && matches!(member, "NameOwnerChanged" | "NameAcquired" | "NameLost")
                {
                    if self.name_signals.len() >= MAX_NAME_SIGNALS {
                        self.name_signals.pop_front();
                    }
                    self.name_signals.push_back(NameSignal {
                        member: member.to_string(),
                        serial: m.serial,
                        destination: m.destination.clone(),
                        at_ns: now_ns,
                    });
                }
                None
            }
        }
    }

    /// Calls written and not yet answered, oldest first.
    pub fn outstanding(&self, now_ns: u64) -> Vec<OutstandingCall> {
        self.written.sorted(now_ns)
    }

    /// Calls read (served by this process) and not yet answered, oldest first.
    pub fn unanswered_incoming(&self, now_ns: u64) -> Vec<OutstandingCall> {
        self.read.sorted(now_ns)
    }

    /// The connection's unique name on the bus (`:1.42`), once seen.
    pub fn unique_name(&self) -> Option<&str> {
        self.unique_name.as_deref()
    }

    /// The latest name signals from the bus, oldest first.
    pub fn name_signals(&self) -> impl Iterator<Item = &NameSignal> {
        self.name_signals.iter()
    }

    /// Calls dropped because more than [`MAX_OPEN_CALLS`] were open
    /// (written, read).
    pub fn dropped(&self) -> (u64, u64) {
        (self.written.dropped, self.read.dropped)
    }
}

/// Which end of the connection the traced process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// It connected (runc, kubelet, a bus client).
    Client,
    /// It accepted (dbus-daemon, systemd on `/run/systemd/private`).
    Server,
}

/// One connection as one process sees it: its two streams and its calls.
#[derive(Clone, Debug)]
pub struct Connection {
    written: Stream,
    read: Stream,
    calls: Calls,
}

impl Connection {
    pub fn new(side: Side) -> Self {
        let (w, r) = match side {
            Side::Client => (Direction::ClientToServer, Direction::ServerToClient),
            Side::Server => (Direction::ServerToClient, Direction::ClientToServer),
        };
        Connection { written: Stream::new(w), read: Stream::new(r), calls: Calls::new() }
    }

    /// A write-side syscall (`write`, `writev`, `sendto`, `sendmsg`): the
    /// captured prefix and the byte count.
    pub fn on_write(&mut self, captured: &[u8], total_len: usize, now_ns: u64) -> Fed {
        let fed = self.written.feed(captured, total_len);
        for m in &fed.messages {
            self.calls.on_written(m, now_ns);
        }
        fed
    }

    /// A read-side syscall. Returns what it parsed and the calls it answered.
    pub fn on_read(&mut self, captured: &[u8], total_len: usize, now_ns: u64) -> (Fed, Vec<Answered>) {
        let fed = self.read.feed(captured, total_len);
        let answered = fed.messages.iter().filter_map(|m| self.calls.on_read(m, now_ns)).collect();
        (fed, answered)
    }

    pub fn calls(&self) -> &Calls {
        &self.calls
    }

    pub fn written_stream(&self) -> &Stream {
        &self.written
    }

    pub fn read_stream(&self) -> &Stream {
        &self.read
    }

    /// Calls written and not yet answered, oldest first.
    pub fn outstanding(&self, now_ns: u64) -> Vec<OutstandingCall> {
        self.calls.outstanding(now_ns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dbus::header::{
        build::{call, reply, Builder},
        Endian, FIELD_DESTINATION, FIELD_ERROR_NAME, FIELD_INTERFACE, FIELD_MEMBER, FIELD_PATH, FIELD_REPLY_SERIAL, FIELD_SENDER,
        FIELD_SIGNATURE, FLAG_NO_REPLY_EXPECTED,
    };

    fn hello() -> Vec<u8> {
        Builder::new(Endian::Little, MessageKind::MethodCall, 1)
            .str(FIELD_PATH, "o", "/org/freedesktop/DBus")
            .str(FIELD_DESTINATION, "s", BUS_NAME)
            .str(FIELD_INTERFACE, "s", BUS_NAME)
            .str(FIELD_MEMBER, "s", "Hello")
            .build()
    }

    fn hello_reply() -> Vec<u8> {
        Builder::new(Endian::Little, MessageKind::MethodReturn, 1)
            .u32(FIELD_REPLY_SERIAL, 1)
            .str(FIELD_DESTINATION, "s", ":1.42")
            .str(FIELD_SENDER, "s", BUS_NAME)
            .str(FIELD_SIGNATURE, "g", "s")
            .body(b"\x05\0\0\0:1.42\0")
            .build()
    }

    fn bus_signal(member: &str, serial: u32, dest: Option<&str>) -> Vec<u8> {
        let mut b = Builder::new(Endian::Little, MessageKind::Signal, serial)
            .str(FIELD_PATH, "o", "/org/freedesktop/DBus")
            .str(FIELD_INTERFACE, "s", BUS_NAME)
            .str(FIELD_MEMBER, "s", member)
            .str(FIELD_SENDER, "s", BUS_NAME);
        if let Some(d) = dest {
            b = b.str(FIELD_DESTINATION, "s", d);
        }
        b.str(FIELD_SIGNATURE, "g", "s").body(b"\x05\0\0\0:1.42\0").build()
    }

    fn write(c: &mut Connection, b: &[u8], now: u64) -> Fed {
        c.on_write(b, b.len(), now)
    }

    fn read(c: &mut Connection, b: &[u8], now: u64) -> Vec<Answered> {
        c.on_read(b, b.len(), now).1
    }

    #[test]
    fn runc_calls_systemd() {
        let mut c = Connection::new(Side::Client);
        let first = [b"\0AUTH EXTERNAL 30\r\nNEGOTIATE_UNIX_FD\r\nBEGIN\r\n".as_slice(), &hello()].concat();
        write(&mut c, &first, 0);
        assert_eq!(c.outstanding(1).len(), 1, "Hello waits for its reply");
        let got = [b"OK 0123456789abcdef\r\nAGREE_UNIX_FD\r\n".as_slice(), &hello_reply()].concat();
        let a = read(&mut c, &got, 10);
        assert_eq!((a.len(), a[0].call.member.as_deref()), (1, Some("Hello")));
        read(&mut c, &bus_signal("NameAcquired", 2, Some(":1.42")), 11);
        assert_eq!(c.calls().unique_name(), Some(":1.42"));
        let sig: Vec<_> = c.calls().name_signals().map(|s| s.member.as_str()).collect();
        assert_eq!(sig, ["NameAcquired"]);

        write(&mut c, &call(Endian::Little, 2, "StartTransientUnit").build(), 100);
        write(&mut c, &call(Endian::Little, 3, "Subscribe").flags(FLAG_NO_REPLY_EXPECTED).build(), 101);
        write(&mut c, &call(Endian::Little, 4, "SetUnitProperties").build(), 102);
        let out = c.outstanding(1_000);
        assert_eq!(out.iter().map(|o| o.call.serial).collect::<Vec<_>>(), [2, 4]);
        assert_eq!(out[0].age, Duration::from_nanos(900));
        assert_eq!(out[0].call.method(), "org.freedesktop.systemd1.Manager.StartTransientUnit");
        assert_eq!(out[0].call.destination.as_deref(), Some("org.freedesktop.systemd1"));

        let a = read(&mut c, &reply(Endian::Little, 7, 2, ":1.42").build(), 2_000);
        assert_eq!((a[0].call.serial, a[0].reply, a[0].latency), (2, MessageKind::MethodReturn, Duration::from_nanos(1_900)));
        let err = Builder::new(Endian::Little, MessageKind::Error, 8)
            .u32(FIELD_REPLY_SERIAL, 4)
            .str(FIELD_ERROR_NAME, "s", "org.freedesktop.systemd1.UnitExists")
            .str(FIELD_DESTINATION, "s", ":1.42")
            .build();
        let a = read(&mut c, &err, 2_100);
        assert_eq!(a[0].reply, MessageKind::Error);
        assert_eq!(a[0].error_name.as_deref(), Some("org.freedesktop.systemd1.UnitExists"));
        assert!(c.outstanding(3_000).is_empty());
        // A second reply to the same serial answers nothing.
        assert!(read(&mut c, &reply(Endian::Little, 9, 2, ":1.42").build(), 3_000).is_empty());
    }

    #[test]
    fn signal_listener_has_nothing_outstanding() {
        let mut c = Connection::new(Side::Client);
        for i in 0..20 {
            read(&mut c, &bus_signal("NameOwnerChanged", 10 + i, None), i as u64);
        }
        assert!(c.outstanding(1_000).is_empty());
        assert_eq!(c.calls().name_signals().count(), 20);
        for i in 0..100 {
            read(&mut c, &bus_signal("NameOwnerChanged", 100 + i, None), 0);
        }
        assert_eq!(c.calls().name_signals().count(), MAX_NAME_SIGNALS);
        // Signals from anyone but the bus are not name signals.
        let fake = Builder::new(Endian::Little, MessageKind::Signal, 3)
            .str(FIELD_INTERFACE, "s", BUS_NAME)
            .str(FIELD_MEMBER, "s", "NameAcquired")
            .str(FIELD_SENDER, "s", ":1.66")
            .build();
        let mut c = Connection::new(Side::Client);
        read(&mut c, &fake, 0);
        assert_eq!(c.calls().name_signals().count(), 0);
    }

    #[test]
    fn server_side_calls_read_until_answered() {
        // systemd on /run/systemd/private: no bus, no names.
        let mut c = Connection::new(Side::Server);
        read(&mut c, &[b"\0AUTH EXTERNAL 0\r\nBEGIN\r\n".as_slice(), &call(Endian::Little, 5, "StartTransientUnit").build()].concat(), 0);
        let open = c.calls().unanswered_incoming(10);
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].call.serial, 5);
        let answer = Builder::new(Endian::Little, MessageKind::MethodReturn, 1).u32(FIELD_REPLY_SERIAL, 5).build();
        write(&mut c, &[b"OK 00ff\r\n".as_slice(), &answer].concat(), 20);
        assert!(c.calls().unanswered_incoming(30).is_empty());
        assert!(c.outstanding(30).is_empty());
    }

    #[test]
    fn bounded_open_calls() {
        let mut calls = Calls::new();
        let mut c = Connection::new(Side::Client);
        for serial in 1..=(MAX_OPEN_CALLS as u32 + 5) {
            let m = crate::dbus::header::parse(&call(Endian::Little, serial, "X").build()).unwrap();
            calls.on_written(&m, serial as u64);
        }
        assert_eq!(calls.outstanding(0).len(), MAX_OPEN_CALLS);
        assert_eq!(calls.dropped(), (5, 0));
        assert_eq!(calls.outstanding(0)[0].call.serial, 6, "oldest dropped first");
        let _ = write(&mut c, b"", 0);
    }
}
