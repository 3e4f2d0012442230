//! A minimal `tracing` subscriber that writes one line per event to stderr.
//!
//! `tracing-subscriber` would pull in regex and friends; the agent is PID 1 of every sandbox and
//! must stay small, and it needs nothing but `level target: message key=value` lines. Spans are
//! accepted and ignored.

use std::fmt::Write as _;
use std::io::Write as _;

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Installs the stderr logger for events up to `max_level` as the global default. Does nothing if a
/// subscriber is installed already.
pub fn install_stderr_log(max_level: Level) {
    let _ = tracing::subscriber::set_global_default(StderrLog { max_level });
}

struct StderrLog {
    max_level: Level,
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
        // A full or closed stderr must not take the agent down; the line is dropped.
        let _ = std::io::stderr().write_all(line.as_bytes());
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
    fn levels_filter_events() {
        let log = StderrLog {
            max_level: Level::INFO,
        };
        assert_eq!(
            log.max_level_hint(),
            Some(tracing::level_filters::LevelFilter::INFO)
        );
    }
}
