//! ttrpc frame headers followed by the kernel through any cutting of the byte stream.
//!
//! plegwatch reads only the 10-byte headers of ttrpc frames on sockets connected to a
//! containerd shim socket (`…/s/<64 hex>`), following each stream from syscall to syscall:
//! payload bytes still to skip, and a header cut in two by the end of a `write` or `read`. If
//! it loses its place it must say so (`ttrpc_lost_step`) rather than misread payload as
//! headers.
//!
//! The test plays both ends over a real unix socket named like a shim's, under a plegwatch
//! started first (so the client's `connect()` classifies it): the client writes requests with
//! their header cut at every offset and payloads of many lengths (including one longer than a
//! 4 KiB read), then a pipelined batch, and reads the responses in pieces of 1 to 64 bytes, so
//! that response headers arrive cut across reads, and a batch of them in one read. The server
//! end (an accepted socket, not tracked) answers every request. At the end plegwatch's summary
//! must count at least as many requests written and responses read as the client made (other
//! processes on the node only add to it), and no connection that lost step.
//!
//! `a_stream_out_of_step_is_dropped_and_counted`: bytes that are no header (HTTP on a
//! shim-named socket) must be counted as a connection that lost step.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::thread;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Plegwatch};

/// Requests made one at a time, header cut at `i % 11`.
const SINGLE: u32 = 1200;
/// Requests written back to back, then answered together.
const BATCH: u32 = 40;
const PAYLOADS: [usize; 9] = [0, 1, 9, 10, 11, 100, 4095, 4097, 9000];
const READ_PIECES: [usize; 7] = [1, 3, 7, 10, 11, 13, 64];

fn header(len: usize, stream: u32, kind: u8) -> [u8; 10] {
    let mut h = [0u8; 10];
    h[..4].copy_from_slice(&(len as u32).to_be_bytes());
    h[4..8].copy_from_slice(&stream.to_be_bytes());
    h[8] = kind;
    h
}

/// Reads one whole frame (the server end: plain, untracked).
fn read_frame(s: &mut UnixStream) -> Result<(u32, Vec<u8>)> {
    let mut h = [0u8; 10];
    s.read_exact(&mut h)?;
    let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]) as usize;
    let stream = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    let mut p = vec![0u8; len];
    s.read_exact(&mut p)?;
    Ok((stream, p))
}

/// Answers every request with a response of a payload length that cycles too.
fn serve(mut s: UnixStream) -> Result<u32> {
    let mut answered = 0u32;
    loop {
        let (stream, _) = match read_frame(&mut s) {
            Ok(f) => f,
            Err(e) if e.downcast_ref::<std::io::Error>().is_some_and(|e| e.kind() == std::io::ErrorKind::UnexpectedEof) => {
                return Ok(answered)
            }
            Err(e) => return Err(e),
        };
        let len = PAYLOADS[(stream as usize / 2) % PAYLOADS.len()] % 200;
        let mut out = header(len, stream, 2).to_vec();
        out.extend(std::iter::repeat_n(0x5a, len));
        s.write_all(&out)?;
        answered += 1;
    }
}

/// Reads `n` bytes in pieces of the sizes in [`READ_PIECES`], from `*turn` on.
fn read_in_pieces(s: &mut UnixStream, n: usize, turn: &mut usize) -> Result<()> {
    let mut buf = [0u8; 64];
    let mut left = n;
    while left > 0 {
        let want = READ_PIECES[*turn % READ_PIECES.len()].min(left);
        *turn += 1;
        let got = s.read(&mut buf[..want])?;
        ensure!(got > 0, "server closed early");
        left -= got;
    }
    Ok(())
}

fn response_len(stream: u32) -> usize {
    10 + PAYLOADS[(stream as usize / 2) % PAYLOADS.len()] % 200
}

#[test]
fn frame_headers_are_followed_across_any_cut() -> Result<()> {
    preflight::require();
    let mut plegwatch = Plegwatch::start(&["--warn", "5s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;

    let dir = tempfile::tempdir()?;
    std::fs::create_dir(dir.path().join("s"))?;
    let path = dir.path().join("s").join("5eed".repeat(16));
    let listener = UnixListener::bind(&path).with_context(|| format!("bind {}", path.display()))?;
    let server = thread::spawn(move || -> Result<u32> {
        let (s, _) = listener.accept()?;
        serve(s)
    });
    let mut c = UnixStream::connect(&path)?;
    let mut turn = 0usize;
    let mut stream = 1u32;
    for i in 0..SINGLE {
        let len = PAYLOADS[i as usize % PAYLOADS.len()];
        let mut frame = header(len, stream, 1).to_vec();
        frame.extend(std::iter::repeat_n(0xa5, len));
        // The header cut at every offset (0: whole), the payload sometimes in two writes.
        let cut = (i % 11) as usize;
        if cut > 0 {
            c.write_all(&frame[..cut])?;
        }
        let rest = &frame[cut..];
        let mid = if i % 3 == 0 { rest.len() / 2 } else { rest.len() };
        c.write_all(&rest[..mid])?;
        c.write_all(&rest[mid..])?;
        read_in_pieces(&mut c, response_len(stream), &mut turn)?;
        stream += 2;
        if i % 100 == 99 {
            // Let plegwatch drain its ring buffer.
            thread::sleep(Duration::from_millis(20));
        }
    }
    // Pipelined: many requests out, then their responses, several in one read.
    let first = stream;
    let mut out = Vec::new();
    for _ in 0..BATCH {
        out.extend_from_slice(&header(3, stream, 1));
        out.extend_from_slice(b"abc");
        stream += 2;
    }
    c.write_all(&out)?;
    let total: usize = (0..BATCH).map(|k| response_len(first + 2 * k)).sum();
    let mut all = vec![0u8; total];
    c.read_exact(&mut all)?;
    drop(c);
    let answered = server.join().map_err(|_| anyhow::anyhow!("server thread panicked"))??;
    let made = SINGLE + BATCH;
    ensure!(answered == made, "the server answered {answered} of {made}");
    thread::sleep(Duration::from_millis(500));

    let events = plegwatch.stop()?;
    let summary = events.iter().find(|e| e.is("summary")).context("no summary")?;
    let seen = |f: &str| summary.u64(&format!("/requests_seen/{f}")).unwrap_or(0);
    let dropped = summary.u64("/dropped_events").unwrap_or(0);
    eprintln!(
        "client made {made} requests; plegwatch saw {} written, {} answered, {} connections lost step, {dropped} records dropped (node-wide)",
        seen("ttrpc_requests"),
        seen("ttrpc_answered"),
        seen("ttrpc_lost_step")
    );
    assert_eq!(seen("ttrpc_lost_step"), 0, "the kernel lost its place in a ttrpc stream: {:?}", summary.get("/requests_seen"));
    assert!(
        u64::from(made) <= seen("ttrpc_requests") && u64::from(made) <= seen("ttrpc_answered"),
        "plegwatch should have seen all {made} requests and their responses (dropped records: {dropped}): {:?}",
        summary.get("/requests_seen")
    );
    Ok(())
}

/// Bytes that are no ttrpc header on a socket named like a shim's (a stream joined out of step,
/// or not ttrpc at all): the kernel drops the socket and counts it, rather than read on.
#[test]
fn a_stream_out_of_step_is_dropped_and_counted() -> Result<()> {
    preflight::require();
    let mut plegwatch = Plegwatch::start(&["--warn", "5s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    let dir = tempfile::tempdir()?;
    std::fs::create_dir(dir.path().join("s"))?;
    let path = dir.path().join("s").join("0bad".repeat(16));
    let listener = UnixListener::bind(&path)?;
    let mut c = UnixStream::connect(&path)?;
    let (mut server, _) = listener.accept()?;
    c.write_all(b"GET / HTTP/1.1\r\n\r\n")?;
    let mut buf = [0u8; 18];
    server.read_exact(&mut buf)?;
    thread::sleep(Duration::from_millis(500));
    let events = plegwatch.stop()?;
    let summary = events.iter().find(|e| e.is("summary")).context("no summary")?;
    let lost = summary.u64("/requests_seen/ttrpc_lost_step").unwrap_or(0);
    assert!(lost >= 1, "bytes that are no ttrpc header were not counted as a stream out of step: {:?}", summary.get("/requests_seen"));
    Ok(())
}
