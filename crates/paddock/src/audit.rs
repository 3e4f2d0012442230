//! `paddock audit`: the audit log through the API (filtered, every page), and `paddock audit verify`,
//! which checks the hash chain on the server host by reading the database itself, so that the check
//! does not depend on the server it audits.

use std::process::ExitCode;

use anyhow::Context;
use paddock_store::Store;
use paddock_types::api::{AuditPage, AuditQuery, AuditVerification, BrokenAuditRow};
use reqwest::Method;

use crate::cli::AuditArgs;
use crate::client::{block_on, print_json, ApiClient, Table};

/// Rows per request.
const PAGE: u64 = 1000;

/// `paddock audit [filters]`.
pub fn list(client: ApiClient, args: AuditArgs) -> anyhow::Result<ExitCode> {
    let records = block_on(async move {
        let mut records = Vec::new();
        let mut after_seq = None;
        loop {
            let wanted = args.limit.map_or(PAGE, |l| (l - records.len() as u64).min(PAGE));
            let query = AuditQuery {
                tenant: None,
                sandbox: args.sandbox.clone(),
                action: args.action.clone(),
                since: args.since.clone(),
                until: None,
                after_seq,
                limit: Some(wanted as u32),
            };
            let page: AuditPage = client
                .json(client.request(Method::GET, &["v1", "audit"]).query(&query))
                .await?;
            records.extend(page.records);
            let full = args.limit.is_some_and(|l| records.len() as u64 >= l);
            match page.next_after_seq {
                Some(next) if !full => after_seq = Some(next),
                _ => break,
            }
        }
        Ok(records)
    })?;
    if args.json {
        print_json(&AuditPage {
            records,
            next_after_seq: None,
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new([
        "SEQ", "TIME", "TENANT", "KEY", "ACTION", "SANDBOX", "OUTCOME", "DETAIL",
    ]);
    for r in &records {
        table.row([
            r.seq.to_string(),
            r.time.clone(),
            r.tenant.clone().unwrap_or_else(|| "-".into()),
            r.key_id.clone().unwrap_or_else(|| "-".into()),
            r.action.clone(),
            r.sandbox_id.clone().unwrap_or_else(|| "-".into()),
            r.outcome.clone(),
            r.detail.to_string(),
        ]);
    }
    table.print();
    Ok(ExitCode::SUCCESS)
}

/// `paddock audit verify`: exit status 1 when the chain is broken.
pub fn verify(db: &std::path::Path, json: bool) -> anyhow::Result<ExitCode> {
    if !db.exists() {
        anyhow::bail!(
            "no paddock database at {} (run this on the server host, with the server's state directory)",
            db.display()
        );
    }
    let store =
        Store::open_read_only(db).with_context(|| format!("failed to open the database {}", db.display()))?;
    let result = store.verify_audit().context("failed to read the audit log")?;
    let verification = AuditVerification {
        ok: result.is_intact(),
        rows_checked: result.rows_checked,
        rows_pruned: result.rows_pruned,
        prune_anchors: result.prune_anchors,
        first_broken: result.first_broken.map(|b| BrokenAuditRow {
            seq: b.seq,
            reason: b.reason,
        }),
    };
    if json {
        print_json(&verification)?;
    } else {
        match &verification.first_broken {
            None if verification.rows_pruned == 0 => {
                println!("audit log intact: {} rows", verification.rows_checked)
            }
            None => println!(
                "audit log intact: {} rows; {} network rows removed by retention were crossed through \
                 the hashes recorded by {} audit.prune rows",
                verification.rows_checked, verification.rows_pruned, verification.prune_anchors
            ),
            Some(b) => println!("audit log BROKEN at row {}: {}", b.seq, b.reason),
        }
    }
    Ok(if verification.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
