//! `paddock keys ...`: API keys managed on the server host, directly in the server's database (SQLite's
//! write-ahead log lets this run beside a live server). Each change appends its audit row.

use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use paddock_store::{ApiKeyRecord, KeyPermissions, NewAuditEntry, Store};
use paddock_types::api::{CreatedKey, ErrorCode, KeyInfo, KeyList};

use crate::cli::KeysCommand;
use crate::client::{print_json, ApiFailure, Table};
use crate::serve_config::ServeConfig;

/// Runs a `keys` subcommand against the database of the configured state directory.
pub fn keys(config: &ServeConfig, command: KeysCommand) -> anyhow::Result<ExitCode> {
    let path = config.database_path();
    if !path.exists() {
        anyhow::bail!(
            "no paddock database at {} (has `paddock serve` run with this state directory?)",
            path.display()
        );
    }
    let store =
        Store::open(&path).with_context(|| format!("failed to open the database {}", path.display()))?;
    match command {
        KeysCommand::Create {
            tenant,
            name,
            admin,
            no_change_network,
            approver,
            e2b,
            json,
        } => {
            let permissions = KeyPermissions {
                admin,
                change_network: !no_change_network,
                // An admin may do everything an approver may: its key says so.
                approver: approver || admin,
            };
            let output = if json {
                KeyOutput::Json
            } else if e2b {
                KeyOutput::E2b
            } else {
                KeyOutput::Plain
            };
            create(&store, &tenant, name.as_deref(), permissions, output)
        }
        KeysCommand::List { tenant, json } => list(&store, tenant.as_deref(), json),
        KeysCommand::Revoke { id } => revoke(&store, &id),
    }
}

/// How `keys create` prints the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyOutput {
    Plain,
    E2b,
    Json,
}

fn create(
    store: &Store,
    tenant: &str,
    name: Option<&str>,
    permissions: KeyPermissions,
    output: KeyOutput,
) -> anyhow::Result<ExitCode> {
    if tenant.is_empty() {
        return Err(crate::UsageError::new("--tenant must not be empty").into());
    }
    let now = now_ms();
    // The key and its audit row commit together.
    let (record, key) = store
        .transaction(|tx| {
            let (record, key) = tx.create_api_key_with(tenant, name.unwrap_or(""), permissions, now)?;
            tx.append_audit(&audit_row("key.create", tenant, &record, now))?;
            Ok::<_, paddock_store::StoreError>((record, key))
        })
        .context("failed to create the key")?;
    let created = CreatedKey {
        id: record.id.clone(),
        tenant: record.tenant.clone(),
        e2b_key: paddock_store::e2b_spelling(&key),
        key,
        admin: record.admin,
        change_network: record.change_network,
        approver: record.approver,
    };
    if output == KeyOutput::Json {
        print_json(&created)?;
    } else {
        match (&created.e2b_key, output) {
            (Some(e2b_key), KeyOutput::E2b) => println!("{e2b_key}"),
            _ => println!("{}", created.key),
        }
        eprintln!(
            "paddock: {}{}key {} for tenant {} created{}; it is shown only this once",
            if created.admin { "admin " } else { "" },
            if created.approver && !created.admin {
                "approver "
            } else {
                ""
            },
            created.id,
            created.tenant,
            if created.change_network {
                ""
            } else {
                " (it may not change sandbox networks)"
            },
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn list(store: &Store, tenant: Option<&str>, json: bool) -> anyhow::Result<ExitCode> {
    let records = store.list_api_keys(tenant).context("failed to list the keys")?;
    let list = KeyList {
        keys: records.iter().map(key_info).collect(),
    };
    if json {
        print_json(&list)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new([
        "ID",
        "TENANT",
        "NAME",
        "ADMIN",
        "APPROVER",
        "CREATED",
        "REVOKED",
        "LAST USED",
    ]);
    let yes_no = |b: bool| if b { "yes" } else { "no" }.to_owned();
    for k in &list.keys {
        table.row([
            k.id.clone(),
            k.tenant.clone(),
            k.name.clone().unwrap_or_default(),
            yes_no(k.admin),
            yes_no(k.approver),
            k.created_at.clone(),
            k.revoked_at.clone().unwrap_or_else(|| "-".into()),
            k.last_used_at.clone().unwrap_or_else(|| "-".into()),
        ]);
    }
    table.print();
    Ok(ExitCode::SUCCESS)
}

fn revoke(store: &Store, id: &str) -> anyhow::Result<ExitCode> {
    let records = store.list_api_keys(None).context("failed to list the keys")?;
    let Some(record) = records.iter().find(|k| k.id == id) else {
        return Err(ApiFailure::new(ErrorCode::KeyNotFound.as_str(), format!("key {id} not found")).into());
    };
    if record.is_revoked() {
        return Err(ApiFailure::new(
            ErrorCode::KeyNotFound.as_str(),
            format!("key {id} is already revoked"),
        )
        .into());
    }
    let now = now_ms();
    // The check, the revocation and its audit row are one transaction: two concurrent revocations
    // cannot both see "another admin key is left".
    let outcome = store
        .transaction(|tx| {
            if record.admin && tx.count_admin_keys()? <= 1 {
                return Ok(Err(ErrorCode::Forbidden));
            }
            if !tx.revoke_api_key(id, now)? {
                return Ok(Err(ErrorCode::KeyNotFound));
            }
            tx.append_audit(&audit_row("key.revoke", &record.tenant, record, now))?;
            Ok::<_, paddock_store::StoreError>(Ok(()))
        })
        .context("failed to revoke the key")?;
    match outcome {
        Ok(()) => {}
        Err(ErrorCode::Forbidden) => {
            return Err(ApiFailure::new(
                ErrorCode::Forbidden.as_str(),
                format!("key {id} is the last active admin key; create another admin key first"),
            )
            .into())
        }
        Err(code) => {
            return Err(ApiFailure::new(code.as_str(), format!("key {id} is already revoked")).into())
        }
    }
    println!("revoked {id}");
    Ok(ExitCode::SUCCESS)
}

fn audit_row(action: &str, tenant: &str, record: &ApiKeyRecord, now: i64) -> NewAuditEntry {
    NewAuditEntry {
        ts_ms: now,
        tenant: Some(tenant.to_owned()),
        key_id: None,
        action: action.to_owned(),
        sandbox_id: None,
        outcome: "ok".to_owned(),
        detail: serde_json::json!({
            "key_id": record.id,
            "admin": record.admin,
            "change_network": record.change_network,
            "approver": record.approver,
            "via": "cli",
        }),
    }
}

fn key_info(r: &ApiKeyRecord) -> KeyInfo {
    KeyInfo {
        id: r.id.clone(),
        tenant: r.tenant.clone(),
        name: (!r.name.is_empty()).then(|| r.name.clone()),
        admin: r.admin,
        change_network: r.change_network,
        approver: r.approver,
        created_at: rfc3339(r.created_at_ms),
        revoked_at: r.revoked_at_ms.map(rfc3339),
        last_used_at: r.last_used_at_ms.map(rfc3339),
    }
}

/// Unix milliseconds as RFC 3339 (UTC, seconds).
pub fn rfc3339(ms: i64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    humantime::format_rfc3339_seconds(t).to_string()
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Makes two keys of `acme` with `permissions` but for one flag, off and on (`set`); checks
    /// the store kept the flag (`stored`) and each `key.create` row's detail `field` says it.
    fn records_a_permission(
        field: &str,
        set: fn(&mut KeyPermissions, bool),
        stored: fn(&paddock_store::ApiKeyRecord) -> bool,
    ) {
        let store = Store::open_in_memory().expect("store");
        for (name, on) in [("off", false), ("on", true)] {
            let mut permissions = KeyPermissions {
                admin: false,
                change_network: true,
                approver: false,
            };
            set(&mut permissions, on);
            create(&store, "acme", Some(name), permissions, KeyOutput::Json).expect("created");
        }
        let keys = store.list_api_keys(Some("acme")).expect("list");
        let key = |name: &str| keys.iter().find(|k| k.name == name).expect("listed");
        assert!(!stored(key("off")) && stored(key("on")), "{field}: {keys:?}");
        let rows = store
            .query_audit(&paddock_store::AuditFilter {
                action: Some("key.create".into()),
                limit: 10,
                ..Default::default()
            })
            .expect("audit");
        let recorded = |name: &str| {
            let row = rows
                .iter()
                .find(|r| r.detail["key_id"] == key(name).id.as_str())
                .expect("its row");
            row.detail[field].clone()
        };
        assert_eq!(
            (recorded("off"), recorded("on")),
            (false.into(), true.into()),
            "{field}"
        );
    }

    #[test]
    fn keys_create_records_the_network_change_permission() {
        records_a_permission(
            "change_network",
            |p, on| p.change_network = on,
            |k| k.change_network,
        );
    }

    #[test]
    fn keys_create_records_the_approver_permission() {
        records_a_permission("approver", |p, on| p.approver = on, |k| k.approver);
    }
}
