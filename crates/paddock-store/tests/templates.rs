//! Template records: a template is kept while a sandbox (live or stopped) or a snapshot was made
//! from it; its charge becomes what it holds once built.

mod support;

use paddock_store::{NewSnapshot, NewTemplate, SandboxState, SnapshotKind, Store, TemplateDeletion};
use support::{labels, new_sandbox};

fn template(id: &str) -> NewTemplate {
    NewTemplate {
        id: id.to_owned(),
        tenant: "acme".into(),
        name: format!("name-{id}"),
        source: "registry.test/img:v1".into(),
        created_at_ms: 1,
        storage_bytes: 1 << 30,
    }
}

#[test]
fn sandboxes_and_snapshots_of_a_template_keep_it() {
    let s = Store::open_in_memory().expect("open");
    s.ensure_tenant("acme", 0).expect("tenant");
    s.insert_template(&template("tp-1")).expect("insert");
    s.transaction(|tx| tx.finish_template("tp-1", "{}", 4096, None))
        .expect("built");
    let record = s.find_template("acme", "tp-1").expect("find").expect("there");
    assert!(record.ready);
    assert_eq!(
        record.storage_bytes, 4096,
        "the reservation is replaced by what it holds"
    );

    let sandbox = paddock_store::NewSandbox {
        spec_json: r#"{"template_id":"tp-1"}"#.to_owned(),
        ..new_sandbox("sb-a", Some("acme"), SandboxState::Running)
    };
    s.insert_sandbox(&sandbox).expect("sandbox");
    let snapshot = NewSnapshot {
        id: "sn-a".into(),
        tenant: "acme".into(),
        sandbox_id: Some("sb-a".into()),
        kind: SnapshotKind::Snapshot,
        name: None,
        labels: labels(&[]),
        created_at_ms: 2,
        storage_bytes: 0,
        template_id: Some("tp-1".into()),
    };
    s.insert_snapshot(&snapshot).expect("snapshot");
    assert_eq!(
        s.get_snapshot("sn-a")
            .expect("get")
            .expect("there")
            .template_id
            .as_deref(),
        Some("tp-1")
    );
    assert_eq!(
        s.delete_template_unless_used("tp-1", 3).expect("delete"),
        TemplateDeletion::InUse(vec!["sb-a".into(), "sn-a".into()])
    );
    // The sandbox ends: its snapshot still holds the template's files' layout.
    assert!(s
        .transition_sandbox("sb-a", &[SandboxState::Running], SandboxState::Killed, 4, None)
        .expect("kill"));
    assert_eq!(
        s.delete_template_unless_used("tp-1", 5).expect("delete"),
        TemplateDeletion::InUse(vec!["sn-a".into()])
    );
    assert!(s.mark_snapshot_deleted("sn-a", 6).expect("delete snapshot"));
    assert_eq!(
        s.delete_template_unless_used("tp-1", 7).expect("delete"),
        TemplateDeletion::Deleted
    );
    assert_eq!(
        s.delete_template_unless_used("tp-1", 8).expect("delete"),
        TemplateDeletion::Absent
    );
}
