//! D-Bus at the message level: which method calls a process wrote to a bus
//! (or to systemd's private socket) and whether their replies came (stall
//! pattern 4, runc → systemd calls that never return).
//!
//! - [`header`] parses a message header, both endiannesses, never the body;
//! - [`stream`] reassembles one direction of a connection from the captured
//!   prefixes of its syscalls: SASL skipped, messages split or batched
//!   anywhere, bodies skipped by count, sync lost and regained;
//! - [`calls`] pairs METHOD_CALLs with their METHOD_RETURN or ERROR.
//!
//! Everything here reads untrusted bytes: nothing panics, and nothing is
//! buffered beyond a bounded header or SASL line.

pub mod calls;
pub mod header;
pub mod stream;

pub use calls::{Answered, Call, Calls, Connection, OutstandingCall, Side};
pub use header::{HeaderError, Message, MessageKind};
pub use stream::{Direction, Fed, Stream};
