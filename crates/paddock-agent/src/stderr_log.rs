//! A minimal `tracing` subscriber that writes one line per event to stderr.
//!
//! Bounded: a line is cut at [`MAX_LINE`] bytes, and after [`MAX_BYTES`] in all one notice is written
//! and every later line dropped. Stderr is the sandbox's `agent.log` in the host's run directory (a
//! tmpfs shared by every sandbox), and lines can carry what a workload chose (paths, commands), so no
//! sandbox may fill it.
//!
//! `tracing-subscriber` would pull in regex and friends; the agent is PID 1 of every sandbox and
//! must stay small, and it needs nothing but `level target: message key=value` lines. Spans are
//! accepted and ignored.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Installs the stderr logger for events up to `max_level` as the global default. Does nothing if a
/// subscriber is installed already.
pub fn install_stderr_log(max_level: Level) {
    let _ = tracing::subscriber::set_global_default(StderrLog {
        max_level,
        budget: Budget::default(),
    });
}

/// The longest line written; longer ones are cut (at a character boundary) and marked.
pub const MAX_LINE: usize = 4096;
/// What one agent writes to its log in all.
pub const MAX_BYTES: u64 = 256 * 1024;
/// Written once, when the log is full.
const FULL_NOTICE: &str = "paddock-agent WARN paddock_agent: log limit reached; later lines are dropped\n";

/// Bytes written so far, against [`MAX_BYTES`].
#[derive(Debug, Default)]
struct Budget(AtomicU64);

/// What to do with a line.
#[derive(Debug, PartialEq, Eq)]
enum Admit {
    Write,
    /// The line does not fit: write the notice instead (once).
    Notice,
    Drop,
}

impl Budget {
    /// Takes `len` bytes from the budget if they fit (the notice always fits: it is reserved).
    fn admit(&self, len: usize) -> Admit {
        let len = len as u64;
        let room = MAX_BYTES - FULL_NOTICE.len() as u64;
        let mut used = self.0.load(Ordering::Relaxed);
        loop {
            if used > room {
                return Admit::Drop;
            }
            let (next, admit) = if used + len <= room {
                (used + len, Admit::Write)
            } else {
                (MAX_BYTES, Admit::Notice)
            };
            match self
                .0
                .compare_exchange_weak(used, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return admit,
                Err(now) => used = now,
            }
        }
    }
}

/// `line` cut to [`MAX_LINE`] bytes (ending `...\n`), or as it is.
fn bounded(mut line: String) -> String {
    if line.len() > MAX_LINE {
        let mut end = MAX_LINE - 4;
        while !line.is_char_boundary(end) {
            end -= 1;
        }
        line.truncate(end);
        line.push_str("...\n");
    }
    line
}

struct StderrLog {
    max_level: Level,
    budget: Budget,
}

impl Subscriber for StderrLog {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        *metadata.level() <= self.max_level
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::from_level(self.max_level))
    }

    fn new_span(&self, _span: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _span: &Id, _values: &Record<'_>) {}

    fn record_follows_from(&self, _span: &Id, _follows: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let meta = event.metadata();
        let mut line = format!("paddock-agent {} {}:", meta.level(), meta.target());
        event.record(&mut LineVisitor(&mut line));
        line.push('\n');
        let line = bounded(line);
        let text = match self.budget.admit(line.len()) {
            Admit::Write => line.as_str(),
            Admit::Notice => FULL_NOTICE,
            Admit::Drop => return,
        };
        // A full or closed stderr must not take the agent down; the line is dropped.
        let _ = std::io::stderr().write_all(text.as_bytes());
    }

    fn enter(&self, _span: &Id) {}

    fn exit(&self, _span: &Id) {}
}

struct LineVisitor<'a>(&'a mut String);

impl Visit for LineVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, " {value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_takes_lines_until_its_budget_then_one_notice_then_nothing() {
        let budget = Budget::default();
        let line = 1000;
        let fitting = (MAX_BYTES as usize - FULL_NOTICE.len()) / line;
        for _ in 0..fitting {
            assert_eq!(budget.admit(line), Admit::Write);
        }
        assert_eq!(budget.admit(line), Admit::Notice);
        assert_eq!(budget.admit(1), Admit::Drop);
        assert_eq!(budget.admit(line), Admit::Drop);
        let written = fitting * line + FULL_NOTICE.len();
        assert!(written as u64 <= MAX_BYTES, "{written}");
    }

    #[test]
    fn a_long_line_is_cut_at_a_character_boundary() {
        let short = "paddock-agent WARN x: short\n".to_owned();
        assert_eq!(bounded(short.clone()), short);
        let long = format!("paddock-agent WARN x: {}\n", "é".repeat(MAX_LINE));
        let cut = bounded(long);
        assert!(cut.len() <= MAX_LINE, "{}", cut.len());
        assert!(cut.ends_with("...\n"));
    }

    #[test]
    fn levels_filter_events() {
        let log = StderrLog {
            max_level: Level::INFO,
            budget: Budget::default(),
        };
        assert_eq!(
            log.max_level_hint(),
            Some(tracing::level_filters::LevelFilter::INFO)
        );
    }
}
