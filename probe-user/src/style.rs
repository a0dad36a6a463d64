//! How text output looks to a person: whether to colour it (`--color`,
//! `NO_COLOR`, a terminal) and the colour of each level (anstyle). Durations
//! in words are `durations::human_secs`.

use crate::levels::Level;
use anstyle::{AnsiColor, Style};

/// `--color`: when to colour text output and logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// On a terminal, unless `NO_COLOR` is set to something.
    #[default]
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// Whether to colour a stream: `always` and `never` are obeyed; `auto`
    /// colours a terminal unless `NO_COLOR` is set and not empty (no-color.org).
    pub fn enabled(self, no_color_env: Option<&str>, terminal: bool) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => terminal && no_color_env.is_none_or(str::is_empty),
        }
    }

    /// [`Self::enabled`] for this process's `NO_COLOR` and the given stream.
    pub fn for_stream(self, stream: &impl std::io::IsTerminal) -> bool {
        self.enabled(std::env::var("NO_COLOR").ok().as_deref(), stream.is_terminal())
    }
}

/// A level's colour: yellow warn, red critical, bold magenta imminent.
pub fn level_style(level: Level) -> Style {
    match level {
        Level::Warn => Style::new().fg_color(Some(AnsiColor::Yellow.into())),
        Level::Critical => Style::new().fg_color(Some(AnsiColor::Red.into())).bold(),
        Level::Imminent => Style::new().fg_color(Some(AnsiColor::Magenta.into())).bold(),
    }
}

/// The style for resolved and other good news.
pub fn ok_style() -> Style {
    Style::new().fg_color(Some(AnsiColor::Green.into()))
}

/// `text` in `style` when `color`, else as is.
pub fn paint(color: bool, style: Style, text: &str) -> String {
    if color {
        format!("{}{text}{}", style.render(), style.render_reset())
    } else {
        text.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every case of flag × NO_COLOR × terminal.
    #[test]
    fn colour_follows_the_flag_then_no_color_then_the_terminal() {
        use ColorChoice::*;
        let cases = [
            (Auto, None, true, true),
            (Auto, None, false, false),
            (Auto, Some("1"), true, false),
            (Auto, Some(""), true, true),
            (Auto, Some("1"), false, false),
            (Always, None, false, true),
            (Always, Some("1"), false, true),
            (Always, Some("1"), true, true),
            (Never, None, true, false),
            (Never, None, false, false),
            (Never, Some("1"), true, false),
        ];
        for (choice, env, tty, want) in cases {
            assert_eq!(choice.enabled(env, tty), want, "{choice:?} NO_COLOR={env:?} tty={tty}");
        }
    }

    #[test]
    fn paint_adds_escapes_only_when_asked() {
        assert_eq!(paint(false, level_style(Level::Critical), "CRITICAL"), "CRITICAL");
        let p = paint(true, level_style(Level::Critical), "CRITICAL");
        assert!(p.starts_with('\u{1b}') && p.contains("CRITICAL") && p.ends_with("\u{1b}[0m"), "{p:?}");
    }
}
