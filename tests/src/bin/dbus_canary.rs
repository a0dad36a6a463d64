//! A D-Bus client for the `no_body_bytes` scenario, which carries secrets in message bodies.
//!
//! ```text
//! dbus_canary --bus PATH --frozen NAME
//! ```
//!
//! Reads two lines from stdin (never from its arguments, which plegwatch may read): a hex
//! string, the body canary, and a member name, the header canary. Opens two connections to
//! the bus at PATH (SASL EXTERNAL, then `Hello`). The first calls the second with that member
//! and a body of signature `say`: the hex string and the bytes it encodes; the second reads
//! the call and replies with the same body; the first reads the reply and checks it carries
//! the hex. So a body with the canary is written and read on both connections. Then the
//! first calls NAME (a frozen service) the same way, prints `PID TID sent serial=N` and blocks
//! reading its connection: the call is never answered.
//!
//! Hand-written marshalling (little-endian, the few types needed): the scenario crate has no
//! D-Bus library, and the point is to control every byte that goes on the wire.

use std::io::{self, BufRead, Read, Write};
use std::os::unix::net::UnixStream;
use std::process::ExitCode;

const METHOD_CALL: u8 = 1;
const METHOD_RETURN: u8 = 2;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dbus_canary: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (mut bus, mut frozen) = (None, None);
    while let Some(flag) = args.next() {
        let v = args.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--bus" => bus = Some(v),
            "--frozen" => frozen = Some(v),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    let (bus, frozen) = (bus.ok_or("--bus is required")?, frozen.ok_or("--frozen is required")?);
    let mut lines = io::stdin().lock().lines();
    let mut line =
        || -> Result<String, String> { Ok(lines.next().ok_or("stdin ended")?.map_err(|e| format!("stdin: {e}"))?.trim().to_string()) };
    let hex = line()?;
    let member = line()?;
    let raw = (0..hex.len())
        .step_by(2)
        .map(|i| hex.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or("stdin: not hex"))
        .collect::<Result<Vec<u8>, _>>()?;
    let mut body = W::default();
    body.string(&hex);
    body.bytes(&raw);
    let body = body.0;

    let mut a = Conn::open(&bus)?;
    let mut b = Conn::open(&bus)?;
    let serial = a.call(&b.name.clone(), "/canary", &member, &body)?;
    let call = b.read_until(|m| m.kind == METHOD_CALL && m.member.as_deref() == Some(&*member))?;
    b.reply(&call, &body)?;
    let reply = a.read_until(|m| m.kind == METHOD_RETURN && m.reply_serial == Some(serial))?;
    if !reply.body.windows(hex.len()).any(|w| w == hex.as_bytes()) {
        return Err("the reply does not carry the body".into());
    }
    let serial = a.call(&frozen, "/x", &member, &body)?;
    // SAFETY: getpid(2) and gettid(2) take no arguments and cannot fail.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    println!("{pid} {tid} sent serial={serial}");
    io::stdout().flush().map_err(|e| e.to_string())?;
    let m = a.read_until(|m| m.reply_serial == Some(serial))?;
    Err(format!("the frozen service answered: {:?}", m.kind))
}

/// A message as read: what the client needs of it.
struct Msg {
    kind: u8,
    serial: u32,
    reply_serial: Option<u32>,
    sender: Option<String>,
    member: Option<String>,
    body: Vec<u8>,
}

struct Conn {
    s: UnixStream,
    serial: u32,
    name: String,
}

impl Conn {
    fn open(path: &str) -> Result<Self, String> {
        let mut s = UnixStream::connect(path).map_err(|e| format!("connect {path}: {e}"))?;
        // SAFETY: getuid(2) cannot fail.
        let uid = unsafe { libc::getuid() }.to_string();
        let uid_hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
        s.write_all(format!("\0AUTH EXTERNAL {uid_hex}\r\n").as_bytes()).map_err(|e| e.to_string())?;
        let mut ok = Vec::new();
        while !ok.ends_with(b"\r\n") {
            let mut c = [0u8; 1];
            s.read_exact(&mut c).map_err(|e| format!("auth: {e}"))?;
            ok.push(c[0]);
        }
        if !ok.starts_with(b"OK ") {
            return Err(format!("auth refused: {}", String::from_utf8_lossy(&ok)));
        }
        s.write_all(b"BEGIN\r\n").map_err(|e| e.to_string())?;
        let mut c = Conn { s, serial: 0, name: String::new() };
        let serial = c.send(
            METHOD_CALL,
            &[(1, 'o', "/org/freedesktop/DBus"), (2, 's', "org.freedesktop.DBus"), (3, 's', "Hello"), (6, 's', "org.freedesktop.DBus")],
            None,
            &[],
        )?;
        let reply = c.read_until(|m| m.reply_serial == Some(serial))?;
        let len = reply.body.get(..4).map(|l| u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize).ok_or("Hello's reply is empty")?;
        c.name = String::from_utf8_lossy(reply.body.get(4..4 + len).ok_or("Hello's reply is short")?).into_owned();
        Ok(c)
    }

    fn call(&mut self, dest: &str, path: &str, member: &str, body: &[u8]) -> Result<u32, String> {
        self.send(
            METHOD_CALL,
            &[(1, 'o', path), (2, 's', "com.example.Canary"), (3, 's', member), (6, 's', dest), (8, 'g', "say")],
            None,
            body,
        )
    }

    fn reply(&mut self, call: &Msg, body: &[u8]) -> Result<u32, String> {
        let dest = call.sender.clone().ok_or("the call has no sender")?;
        self.send(METHOD_RETURN, &[(6, 's', &dest), (8, 'g', "say")], Some(call.serial), body)
    }

    fn send(&mut self, kind: u8, fields: &[(u8, char, &str)], reply_serial: Option<u32>, body: &[u8]) -> Result<u32, String> {
        self.serial += 1;
        let mut w = W::default();
        w.0.extend_from_slice(&[b'l', kind, 0, 1]);
        w.u32(body.len() as u32);
        w.u32(self.serial);
        w.u32(0); // fields length, set below
        for (code, t, v) in fields {
            w.pad(8);
            w.0.extend_from_slice(&[*code, 1, *t as u8, 0]);
            match t {
                'g' => {
                    w.0.push(v.len() as u8);
                    w.0.extend_from_slice(v.as_bytes());
                    w.0.push(0);
                }
                _ => w.string(v),
            }
        }
        if let Some(r) = reply_serial {
            w.pad(8);
            w.0.extend_from_slice(&[5, 1, b'u', 0]);
            w.u32(r);
        }
        let fields_len = (w.0.len() - 16) as u32;
        w.0[12..16].copy_from_slice(&fields_len.to_le_bytes());
        w.pad(8);
        w.0.extend_from_slice(body);
        self.s.write_all(&w.0).map_err(|e| format!("write: {e}"))?;
        Ok(self.serial)
    }

    fn read_until(&mut self, want: impl Fn(&Msg) -> bool) -> Result<Msg, String> {
        loop {
            let m = self.read()?;
            if want(&m) {
                return Ok(m);
            }
        }
    }

    fn read(&mut self) -> Result<Msg, String> {
        let mut fixed = [0u8; 16];
        self.s.read_exact(&mut fixed).map_err(|e| format!("read: {e}"))?;
        if fixed[0] != b'l' {
            return Err("a big-endian message: not handled".into());
        }
        let word = |i: usize| u32::from_le_bytes([fixed[i], fixed[i + 1], fixed[i + 2], fixed[i + 3]]) as usize;
        let (body_len, fields_len) = (word(4), word(12));
        let hdr_len = (16 + fields_len + 7) & !7;
        let mut rest = vec![0u8; hdr_len - 16 + body_len];
        self.s.read_exact(&mut rest).map_err(|e| format!("read: {e}"))?;
        let fields = &rest[..fields_len];
        let mut m = Msg {
            kind: fixed[1],
            serial: word(8) as u32,
            reply_serial: None,
            sender: None,
            member: None,
            body: rest[hdr_len - 16..].to_vec(),
        };
        // Walk the fields: each at an 8-aligned offset of the message (16 + i).
        let mut i = 0;
        while i + 4 <= fields.len() {
            let (code, sig_len) = (fields[i], fields[i + 1] as usize);
            let t = fields.get(i + 2).copied().unwrap_or(0);
            let mut at = i + 3 + sig_len;
            let value_end;
            match t {
                b's' | b'o' => {
                    at = (at + 3) & !3;
                    let len = fields.get(at..at + 4).map(|l| u32::from_le_bytes([l[0], l[1], l[2], l[3]]) as usize).unwrap_or(0);
                    let v = String::from_utf8_lossy(fields.get(at + 4..at + 4 + len).unwrap_or(&[])).into_owned();
                    match code {
                        3 => m.member = Some(v),
                        7 => m.sender = Some(v),
                        _ => {}
                    }
                    value_end = at + 4 + len + 1;
                }
                b'u' => {
                    at = (at + 3) & !3;
                    let v = fields.get(at..at + 4).map(|l| u32::from_le_bytes([l[0], l[1], l[2], l[3]])).unwrap_or(0);
                    if code == 5 {
                        m.reply_serial = Some(v);
                    }
                    value_end = at + 4;
                }
                b'g' => {
                    let len = fields.get(at).copied().unwrap_or(0) as usize;
                    value_end = at + 1 + len + 1;
                }
                _ => return Err(format!("header field type {t} not handled")),
            }
            i = (value_end + 7) & !7;
        }
        Ok(m)
    }
}

/// A little-endian marshalling buffer, aligned from its start (a message's first byte).
#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn pad(&mut self, to: usize) {
        while !self.0.len().is_multiple_of(to) {
            self.0.push(0);
        }
    }
    fn u32(&mut self, v: u32) {
        self.pad(4);
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn string(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
        self.0.push(0);
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
}
