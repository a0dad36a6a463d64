//! What the daemon offers other programs: its HTTP endpoint (`http`), and the
//! node-problem-detector check that asks it (`check`).

pub mod check;
pub mod http;
