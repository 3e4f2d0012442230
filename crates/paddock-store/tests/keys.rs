//! API keys: authentication, revocation, and that no secret reaches the disk.

mod support;

use paddock_store::Store;
use support::TempDb;

const T0: i64 = 1_700_000_000_000;

fn store() -> Store {
    Store::open_in_memory().expect("open store")
}

#[test]
fn created_key_authenticates_and_has_the_documented_shape() {
    let store = store();
    let (record, key) = store.create_api_key("acme", "ci", false, T0).expect("create key");
    let parts: Vec<&str> = key.split('_').collect();
    assert_eq!(parts.len(), 3, "{key}");
    assert_eq!(parts[0], "pdk");
    assert_eq!(parts[1], record.id);
    assert_eq!(parts[1].len(), 12);
    assert_eq!(parts[2].len(), 64);
    assert!(key[4..]
        .bytes()
        .all(|b| b == b'_' || b.is_ascii_digit() || (b'a'..=b'f').contains(&b)));

    assert!(
        store.get_tenant("acme").expect("get").is_some(),
        "creating a key creates its tenant"
    );
    let authed = store
        .authenticate(&key, T0 + 1)
        .expect("authenticate")
        .expect("valid key");
    assert_eq!(authed.id, record.id);
    assert_eq!(authed.tenant, "acme");
    assert_eq!(authed.name, "ci");
    assert!(!authed.admin);
}

#[test]
fn two_keys_differ() {
    let store = store();
    let (a, key_a) = store.create_api_key("acme", "a", false, T0).expect("create");
    let (b, key_b) = store.create_api_key("acme", "b", false, T0).expect("create");
    assert_ne!(a.id, b.id);
    assert_ne!(key_a[17..], key_b[17..], "secrets differ");
}

#[test]
fn wrong_malformed_and_revoked_keys_are_refused() {
    let store = store();
    let (record, key) = store.create_api_key("acme", "ci", true, T0).expect("create key");

    // Right id, wrong secret (flip the last hex digit).
    let mut wrong = key.clone();
    let last = wrong.pop().expect("non-empty");
    wrong.push(if last == '0' { '1' } else { '0' });
    assert_eq!(store.authenticate(&wrong, T0).expect("authenticate"), None);

    // Unknown id, right secret.
    let unknown = format!("pdk_ffffffffffff{}", &key[16..]);
    assert_ne!(unknown, key);
    assert_eq!(store.authenticate(&unknown, T0).expect("authenticate"), None);

    for malformed in [
        "",
        "pdk_",
        "Bearer x",
        &key[..key.len() - 1],
        &key.to_uppercase(),
        &format!("{key} "),
    ] {
        assert_eq!(
            store.authenticate(malformed, T0).expect("authenticate"),
            None,
            "{malformed:?}"
        );
    }

    assert!(store.revoke_api_key(&record.id, T0 + 5).expect("revoke"));
    assert!(
        !store.revoke_api_key(&record.id, T0 + 6).expect("revoke again"),
        "already revoked"
    );
    assert!(!store.revoke_api_key("000000000000", T0).expect("revoke unknown"));
    assert_eq!(store.authenticate(&key, T0 + 7).expect("authenticate"), None);
    let listed = store.list_api_keys(Some("acme")).expect("list");
    assert_eq!(
        listed[0].revoked_at_ms,
        Some(T0 + 5),
        "revocation time is the first one"
    );
}

#[test]
fn last_use_is_recorded_at_most_once_a_minute() {
    let store = store();
    let (_, key) = store.create_api_key("acme", "ci", false, T0).expect("create key");
    let last_used = |store: &Store| store.list_api_keys(None).expect("list")[0].last_used_at_ms;
    assert_eq!(last_used(&store), None);

    store
        .authenticate(&key, T0 + 1_000)
        .expect("auth")
        .expect("valid");
    assert_eq!(last_used(&store), Some(T0 + 1_000));
    let record = store
        .authenticate(&key, T0 + 59_999)
        .expect("auth")
        .expect("valid");
    assert_eq!(
        record.last_used_at_ms,
        Some(T0 + 1_000),
        "not rewritten within a minute"
    );
    assert_eq!(last_used(&store), Some(T0 + 1_000));
    let record = store
        .authenticate(&key, T0 + 61_000)
        .expect("auth")
        .expect("valid");
    assert_eq!(record.last_used_at_ms, Some(T0 + 61_000));
    assert_eq!(last_used(&store), Some(T0 + 61_000));
}

#[test]
fn listing_and_counting_admin_keys() {
    let store = store();
    let (admin1, _) = store.create_api_key("ops", "root", true, T0).expect("create");
    store
        .create_api_key("ops", "root2", true, T0 + 1)
        .expect("create");
    store.create_api_key("acme", "ci", false, T0 + 2).expect("create");
    assert_eq!(store.count_admin_keys().expect("count"), 2);
    assert_eq!(store.list_api_keys(None).expect("list").len(), 3);
    let ops: Vec<String> = store
        .list_api_keys(Some("ops"))
        .expect("list")
        .into_iter()
        .map(|k| k.name)
        .collect();
    assert_eq!(ops, ["root", "root2"]);
    assert!(store.list_api_keys(Some("nobody")).expect("list").is_empty());

    store.revoke_api_key(&admin1.id, T0 + 3).expect("revoke");
    assert_eq!(
        store.count_admin_keys().expect("count"),
        1,
        "revoked keys do not count"
    );
}

#[test]
fn records_carry_no_secret() {
    let store = store();
    let (record, key) = store.create_api_key("acme", "ci", true, T0).expect("create key");
    let secret = &key[17..];
    let debug = format!("{record:?}");
    let json = serde_json::to_string(&record).expect("serialize");
    for shown in [&debug, &json] {
        assert!(!shown.contains(secret), "{shown}");
        assert!(!shown.contains("hash"), "{shown}");
    }
}

#[test]
fn no_plaintext_secret_on_disk() {
    let db = TempDb::new();
    let store = db.open();
    let (_, key) = store.create_api_key("acme", "ci", true, T0).expect("create key");
    store.authenticate(&key, T0).expect("auth").expect("valid");
    let secret_hex = &key[17..];
    let mut secret_bytes = [0u8; 32];
    hex::decode_to_slice(secret_hex, &mut secret_bytes).expect("hex");

    // Look in the database and its WAL while the store is open, then again after it checkpointed.
    let scan = |when: &str| {
        let mut scanned = 0;
        for entry in std::fs::read_dir(db.dir.path()).expect("list directory") {
            let entry = entry.expect("entry");
            // `<db>-shm` is a dangling symlink guarding against other SQLite builds: nothing to read.
            if entry.file_type().expect("file type").is_symlink() {
                continue;
            }
            let path = entry.path();
            let bytes = std::fs::read(&path).expect("read database file");
            scanned += bytes.len();
            for needle in [secret_hex.as_bytes(), &secret_bytes[..], key.as_bytes()] {
                assert!(
                    !bytes.windows(needle.len()).any(|w| w == needle),
                    "{when}: secret found in {}",
                    path.display()
                );
            }
        }
        assert!(scanned > 0, "{when}: nothing scanned");
    };
    scan("while open");
    drop(store);
    scan("after close");

    // And the hash is what is there instead.
    let stored: Vec<u8> = db
        .raw()
        .query_row("SELECT secret_hash FROM api_keys", [], |r| r.get(0))
        .expect("stored hash");
    use sha2::Digest as _;
    assert_eq!(stored, sha2::Sha256::digest(secret_bytes).to_vec());
}

#[test]
fn the_network_change_permission_is_kept_and_on_by_default() {
    let store = store();
    let (plain, plain_key) = store.create_api_key("acme", "ci", false, T0).expect("create");
    assert!(
        plain.change_network,
        "keys may change networks unless made otherwise"
    );
    let limited = paddock_store::KeyPermissions {
        admin: false,
        change_network: false,
        approver: false,
    };
    let (record, key) = store
        .create_api_key_with("acme", "agent", limited, T0)
        .expect("create");
    assert!(!record.change_network && !record.admin);
    let authed = store
        .authenticate(&key, T0 + 1)
        .expect("authenticate")
        .expect("valid key");
    assert!(!authed.change_network);
    let authed = store
        .authenticate(&plain_key, T0 + 1)
        .expect("authenticate")
        .expect("valid key");
    assert!(authed.change_network);
    let listed = store.list_api_keys(Some("acme")).expect("list");
    let by_name = |n: &str| {
        listed
            .iter()
            .find(|k| k.name == n)
            .expect("listed")
            .change_network
    };
    assert_eq!((by_name("ci"), by_name("agent")), (true, false));
}

#[test]
fn the_approver_permission_is_kept_and_off_by_default_but_for_admin_keys() {
    let store = store();
    let (plain, _) = store.create_api_key("acme", "ci", false, T0).expect("create");
    assert!(!plain.approver, "keys may not approve unless made so");
    let (admin, _) = store.create_api_key("acme", "root", true, T0).expect("create");
    assert!(admin.approver, "admin keys are made approvers");
    let approver = paddock_store::KeyPermissions {
        admin: false,
        change_network: true,
        approver: true,
    };
    let (record, key) = store
        .create_api_key_with("acme", "reviewer", approver, T0)
        .expect("create");
    assert!(record.approver && !record.admin);
    let authed = store
        .authenticate(&key, T0 + 1)
        .expect("authenticate")
        .expect("valid key");
    assert!(authed.approver);
    let listed = store.list_api_keys(Some("acme")).expect("list");
    let by_name = |n: &str| listed.iter().find(|k| k.name == n).expect("listed").approver;
    assert_eq!(
        (by_name("ci"), by_name("root"), by_name("reviewer")),
        (false, true, true)
    );
}
