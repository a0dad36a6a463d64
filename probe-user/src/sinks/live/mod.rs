//! The live view: on a terminal, `plegwatch watch` redraws in place the open
//! incidents, the most PLEG budget used first, each with its chain, under a
//! header line and over a footer of the last few resolved.
//!
//! - [`LiveState`] (`state`): the pure model, built from events, and its rendering;
//! - `screen`: the terminal it takes over, given back on drop;
//! - [`LiveSink`]: the [`Sink`] the engine emits to. It only queues each event
//!   for a drawing thread, so a slow or stuck terminal never holds up the
//!   engine's loop. That thread draws at most every [`FRAME`] (4 times a
//!   second) while anything changes or an incident's clock runs, at least
//!   every [`IDLE_FRAME`] otherwise. At the summary (the engine's last event),
//!   or when the sink is dropped without one, it leaves the alternate screen
//!   and prints, as plain text, the incidents still open and the summary, so
//!   they stay on the terminal. It does not wait for the drop: the engine
//!   detaches its probes between the two, which can take seconds.

mod screen;
pub(crate) mod state;

pub use state::LiveState;

use super::text::render_text;
use crate::events::{Event, Sink};
use screen::Screen;
use std::io::{self, IsTerminal, Write};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The shortest time between two frames.
pub const FRAME: Duration = Duration::from_millis(250);
/// The longest, when nothing changes (the footer's "ago" clocks).
pub const IDLE_FRAME: Duration = Duration::from_secs(1);

enum Msg {
    Event(Box<Event>),
    Stop,
}

/// Draws the live view on stdout's terminal from a thread of its own.
pub struct LiveSink {
    tx: Sender<Msg>,
    drawer: Option<JoinHandle<()>>,
}

impl LiveSink {
    /// Whether stdout is a terminal the view can be drawn on.
    pub fn supported() -> bool {
        io::stdout().is_terminal() && std::env::var("TERM").is_ok_and(|t| !t.is_empty() && t != "dumb")
    }

    /// Starts the drawing thread, in colour or not (`--color`, `NO_COLOR`).
    /// The terminal is taken over at the first event, so that errors before
    /// it (no root, no BTF) print as usual.
    pub fn start(color: bool) -> io::Result<LiveSink> {
        let (tx, rx) = mpsc::channel();
        let drawer = std::thread::Builder::new().name("plegwatch-live".into()).spawn(move || draw_loop(rx, color))?;
        Ok(LiveSink { tx, drawer: Some(drawer) })
    }
}

impl Sink for LiveSink {
    fn emit(&mut self, event: &Event) {
        // Per-wait lines are not shown: the view is made of incidents.
        if matches!(event, Event::Stall(_) | Event::Resolved(_)) {
            return;
        }
        if let Err(mpsc::SendError(Msg::Event(e))) = self.tx.send(Msg::Event(Box::new(crate::sinks::escape::escaped(event).into_owned()))) {
            // The drawing thread is gone (it panicked, and gave the terminal back): plain lines.
            let _ = writeln!(io::stdout().lock(), "{}", render_text(&e));
        }
    }
}

impl Drop for LiveSink {
    fn drop(&mut self) {
        let _ = self.tx.send(Msg::Stop);
        if let Some(d) = self.drawer.take() {
            let _ = d.join();
        }
    }
}

/// Where the drawing thread's output goes.
enum Output {
    /// No event yet.
    Pending,
    Live(Box<Screen>),
    /// The terminal could not be taken over: plain lines.
    Text,
}

fn draw_loop(rx: Receiver<Msg>, color: bool) {
    let mut state = LiveState::default();
    state.monochrome = !color;
    let mut out = Output::Pending;
    let mut last_draw: Option<Instant> = None;
    let mut dirty = false;
    loop {
        let wait = match (&out, last_draw) {
            (Output::Live(_), Some(at)) => {
                let every = if dirty || state.ticking() { FRAME } else { IDLE_FRAME };
                (at + every).saturating_duration_since(Instant::now())
            }
            (Output::Live(_), None) => Duration::ZERO,
            _ => Duration::from_secs(3600),
        };
        match rx.recv_timeout(wait) {
            Ok(Msg::Event(e)) => {
                if matches!(out, Output::Pending) {
                    out = match Screen::enter() {
                        Ok(s) => Output::Live(Box::new(s)),
                        Err(err) => {
                            tracing::warn!("live view: cannot use the terminal ({err}); printing lines");
                            Output::Text
                        }
                    };
                }
                if matches!(out, Output::Text) {
                    let _ = writeln!(io::stdout().lock(), "{}", render_text(&e));
                }
                state.apply(&e, Instant::now());
                dirty = true;
                if let (Event::Summary(_), Output::Live(screen)) = (e.as_ref(), &mut out) {
                    give_back(screen, &state);
                    out = Output::Text;
                }
            }
            Ok(Msg::Stop) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let Output::Live(screen) = &mut out else { continue };
        for l in screen.new_logs() {
            state.note_log(&l);
            dirty = true;
        }
        let now = Instant::now();
        let since = last_draw.map(|at| now.saturating_duration_since(at));
        let due = match since {
            None => true,
            Some(s) => s >= FRAME && (dirty || state.ticking() || s >= IDLE_FRAME),
        };
        if due {
            // A failed frame (a resize racing the draw) is redrawn next time.
            let _ = screen.draw(&state, now);
            last_draw = Some(now);
            dirty = false;
        }
    }
    if let Output::Live(mut screen) = out {
        give_back(&mut screen, &state);
    }
}

/// Leaves the view for good: the terminal as it was, then the logs kept
/// meanwhile and [`exit_text`].
fn give_back(screen: &mut Screen, state: &LiveState) {
    let logs = screen.leave();
    screen::write_logs(&logs);
    let _ = write!(io::stdout().lock(), "{}", exit_text(state, Instant::now()));
}

/// What stays on the terminal after the view: the incidents still open, then
/// the summary, as the text sink prints them.
fn exit_text(state: &LiveState, now: Instant) -> String {
    let mut out = String::new();
    let open = state.open_incidents(now);
    if !open.is_empty() {
        out.push_str(&format!("{} incident(s) still open:\n", open.len()));
    }
    for i in open {
        out.push_str(&render_text(&Event::Incident(Box::new(i))));
        out.push('\n');
    }
    if let Some(s) = state.summary() {
        out.push_str(&render_text(&Event::Summary(s.clone())));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::state::tests::{incident_9770, ready};
    use super::*;
    use crate::events::{ScanSummary, Summary};

    fn summary() -> Summary {
        Summary {
            ran_s: 42.0,
            stalls: 1,
            resolved: 1,
            still_open: 0,
            waits_started: 10,
            dropped_waits: 0,
            dropped_events: 0,
            dropped: vec![],
            syscalls: vec![],
            offcpu_top: vec![],
            go_latency: vec![],
            relists: vec![],
            go_locks: vec![],
            incidents: 2,
            incidents_resolved: 1,
            scans: ScanSummary::default(),
            ..Default::default()
        }
    }

    #[test]
    fn the_exit_text_has_the_open_incidents_then_the_summary() {
        let t0 = Instant::now();
        let mut s = LiveState::default();
        assert_eq!(exit_text(&s, t0), "");
        s.apply(&ready(), t0);
        s.apply(&Event::Incident(Box::new(incident_9770(3, 20.0))), t0);
        s.apply(&Event::Summary(summary()), t0);
        let text = exit_text(&s, t0 + Duration::from_secs(2));
        let (open, incident, sum) =
            (text.find("1 incident(s) still open"), text.find("incident #3 waited 22s"), text.find("summary: ran 42s"));
        assert!(open < incident && incident < sum && open.is_some(), "{text}");
        assert!(text.contains("ROOT 4. umount") && text.contains("incidents: 2 raised, 1 resolved"), "{text}");
        assert!(text.ends_with('\n'));
    }
}
