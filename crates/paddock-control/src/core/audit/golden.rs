//! The golden list of audit actions and their details (`tests/golden/audit_actions.txt`): part of
//! the compatibility contract. Regenerate with `UPDATE_GOLDEN=1 cargo test -p paddock-control
//! audit_actions` and review the diff.

use std::collections::BTreeSet;
use std::fmt::Write;
use std::path::Path;

use super::{AuditAction, CommandDetail, DetailShape, SHAPES};

/// Details not declared in `details.rs`: typed where they are made.
fn declared_elsewhere(action: AuditAction) -> Option<&'static str> {
    match action {
        AuditAction::AuditPrune => Some("written by paddock-store's retention (paddock_store::PRUNE_ACTION)"),
        AuditAction::NetworkConnection => Some(NETWORK_EVENT),
        AuditAction::NetworkDns => Some(NETWORK_EVENT),
        AuditAction::NetworkRefused => {
            Some("the egress proxy's paddock_egress::RefusalRecord, less `type` and `sandbox`")
        }
        _ => None,
    }
}

const NETWORK_EVENT: &str = "the egress proxy's record (paddock_egress::ConnectionRecord or DnsRecord), \
less `type` and `sandbox`, with NetworkFirst's fields, or NetworkAggregate's for an aggregate row";

fn shape_lines(out: &mut String, shape: &DetailShape) {
    if shape.fields.is_empty() {
        writeln!(out, "    {} {{}}", shape.name).expect("a String takes every write");
        return;
    }
    writeln!(out, "    {} {{", shape.name).expect("a String takes every write");
    for (name, ty, attrs) in shape.fields {
        let attrs = if attrs.is_empty() {
            String::new()
        } else {
            format!("  {}", attrs.replace(" (", "(").replace("# [", "#["))
        };
        writeln!(out, "      {name}: {ty}{attrs}").expect("a String takes every write");
    }
    writeln!(out, "    }}").expect("a String takes every write");
}

fn render() -> String {
    let mut out = String::from(
        "# Every audit action paddock writes, with the details its rows carry (a contract: see\n\
         # ARCHITECTURE.md, \"Audit\"). Generated from crates/paddock-control/src/core/audit/;\n\
         # regenerate with UPDATE_GOLDEN=1 cargo test -p paddock-control audit_actions.\n",
    );
    for action in AuditAction::ALL {
        writeln!(out, "\n{}", action.as_str()).expect("a String takes every write");
        if let Some(note) = declared_elsewhere(*action) {
            writeln!(out, "    ({note})").expect("a String takes every write");
        }
        for shape in action.details() {
            shape_lines(&mut out, shape);
        }
    }
    out.push_str("\n# Parts (flattened or nested into the details above)\n");
    for shape in SHAPES.iter().filter(|s| s.actions.is_empty()) {
        shape_lines(&mut out, shape);
    }
    let commands = [
        CommandDetail::Argv(vec!["...".into()]),
        CommandDetail::Shell("...".into()),
    ];
    let commands: Vec<String> = commands
        .iter()
        .map(|c| serde_json::to_string(c).expect("a command serializes"))
        .collect();
    writeln!(out, "    CommandDetail: {}", commands.join(" | ")).expect("a String takes every write");
    out
}

#[test]
fn audit_actions_match_the_golden_list() {
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/audit_actions.txt");
    let actual = render();
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&golden, &actual).expect("write the golden file");
        return;
    }
    let expected = std::fs::read_to_string(&golden).unwrap_or_else(|e| {
        panic!(
            "read {}: {e} (create it with UPDATE_GOLDEN=1 cargo test -p paddock-control audit_actions)",
            golden.display()
        )
    });
    if expected != actual {
        let first_difference = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
        panic!(
            "the audit actions differ from {} from line {}:\n  golden: {:?}\n  actual: {:?}\n\
             Action strings and detail fields are a contract. If the change is intended, regenerate \
             with UPDATE_GOLDEN=1 cargo test -p paddock-control audit_actions and review the diff.",
            golden.display(),
            first_difference + 1,
            expected.lines().nth(first_difference),
            actual.lines().nth(first_difference),
        );
    }
}

#[test]
fn every_action_is_listed_once_and_described() {
    let strings: BTreeSet<&str> = AuditAction::ALL.iter().map(|a| a.as_str()).collect();
    assert_eq!(
        strings.len(),
        AuditAction::ALL.len(),
        "two actions share a string"
    );
    for action in AuditAction::ALL {
        let s = action.as_str();
        assert!(
            s.split_once('.')
                .is_some_and(|(a, b)| !a.is_empty() && !b.is_empty()),
            "{s} is not `area.verb`"
        );
        assert!(
            action.details().next().is_some() || declared_elsewhere(*action).is_some(),
            "{s} has no declared details"
        );
    }
    assert_eq!(AuditAction::AuditPrune.as_str(), paddock_store::PRUNE_ACTION);
    assert_eq!(AuditAction::ProcessExit.area(), "process.");
    assert!(AuditAction::ALL.iter().all(|a| a.as_str().starts_with(a.area())));
}

#[test]
fn detail_names_are_unique() {
    let names: BTreeSet<&str> = SHAPES.iter().map(|s| s.name).collect();
    assert_eq!(names.len(), SHAPES.len());
}
