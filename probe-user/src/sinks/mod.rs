//! Sinks: where the engine's typed events end up. They read events and
//! format them; they never call back into the engine.
//!
//! - [`JsonSink`]: one JSON object per line (`--json`), the contract in docs/output-contract.md;
//! - [`TextSink`]: human lines, by default one block per incident;
//! - [`LiveSink`]: on a terminal, the open incidents redrawn in place (`live`);
//! - [`ReportSink`]: incident bundles in a directory (`--report-dir`: `report/`);
//! - [`LogSink`]: the daemon's log records (`tracing`);
//! - [`MetricsSink`]: the daemon's OpenMetrics series and `/incidents`;
//! - [`Tee`]: two sinks fed the same events.

pub mod escape;
#[cfg(test)]
mod first_screen;
pub(crate) mod live;
mod log;
pub mod metrics;
pub mod report;
pub mod stdout_writer;
mod text;

pub use live::{LiveSink, LiveState};
pub use log::LogSink;
pub use metrics::{Exposition, MetricsSink};
pub use report::ReportSink;
pub use text::{incident_text, render_text, render_text_with, TextOptions, TextSink};

use crate::events::{Event, Sink};
use std::io::Write;

/// One JSON object per line, flushed at once (readers follow a pipe).
pub struct JsonSink<W: Write>(pub W);

impl<W: Write> Sink for JsonSink<W> {
    fn emit(&mut self, event: &Event) {
        if let Ok(line) = serde_json::to_string(event) {
            let _ = writeln!(self.0, "{line}");
            let _ = self.0.flush();
        }
    }
}

/// Hands every event to both sinks, the first one first.
pub struct Tee<A: Sink, B: Sink>(pub A, pub B);

impl<A: Sink, B: Sink> Sink for Tee<A, B> {
    fn emit(&mut self, event: &Event) {
        self.0.emit(event);
        self.1.emit(event);
    }
}

impl Sink for Box<dyn Sink> {
    fn emit(&mut self, event: &Event) {
        self.as_mut().emit(event);
    }
}

impl<S: Sink + ?Sized> Sink for &mut S {
    fn emit(&mut self, event: &Event) {
        (**self).emit(event);
    }
}
