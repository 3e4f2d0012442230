//! Moving snapshots between hosts: export one as a tar stream, import one from a tar stream.
//!
//! Export runs the backend's archive writer on a blocking thread and hands its bytes to the response
//! through a bounded channel (64 KiB pieces, four in flight: a slow client slows the walk, never the
//! server's memory). The last kilobyte, which holds the end-of-archive marker, is held back until the
//! `snapshot.export` audit row (with its byte count) is written, so no client ever holds a complete
//! archive whose export is not on record; a failure after the first byte ends the stream with an
//! error, so the client sees a broken download rather than a short archive.
//!
//! Import feeds the request body to the backend's unpacker on a blocking thread (never more than a
//! chunk of it in memory); the backend refuses unsafe or oversized archives and leaves nothing behind.
//! The record and its `snapshot.import` audit row are written in one transaction; a refusal gets an
//! audit row too, with its error code as the outcome.

use std::collections::BTreeMap;
use std::io;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use paddock_runtime::{ExportOptions, ImportLimits, RuntimeError, TransferSummary};
use paddock_store::{NewSnapshot, QuotaRequest, SnapshotKind, SnapshotRecord, StoreError};
use paddock_types::api::{ErrorCode, SnapshotInfo};
use paddock_types::SnapshotId;
use tokio::sync::mpsc;
use tokio_util::io::{StreamReader, SyncIoBridge};

use crate::core::access::info;
use crate::core::audit::{self, AuditAction, AuditEntry};
use crate::core::time::now_ms;
use crate::plan::labels::{check_snapshot_labels, MAX_NAME_LEN};
use crate::{ByteStream, Principal, SandboxService, ServiceError};

/// Size of the pieces an export is sent in.
const CHUNK: usize = 64 * 1024;
/// Bytes of an export held back until its audit row is written (the end-of-archive marker is 1 KiB).
const HOLD_BACK: usize = 1024;
/// Most members an imported archive may have.
const MAX_IMPORT_ENTRIES: u64 = 1_000_000;

/// What the export's writer hands the response.
enum Piece {
    Data(Bytes),
    Failed(ServiceError),
}

/// The blocking side of an export: collects the archive into pieces and sends all but the last
/// [`HOLD_BACK`] bytes as it goes.
struct ChannelWriter {
    tx: mpsc::Sender<Piece>,
    buf: Vec<u8>,
    sent: u64,
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= CHUNK + HOLD_BACK {
            let tail = self.buf.split_off(self.buf.len() - HOLD_BACK);
            let piece = std::mem::replace(&mut self.buf, tail);
            self.sent += piece.len() as u64;
            self.tx
                .blocking_send(Piece::Data(Bytes::from(piece)))
                .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the client went away"))?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The API error of a failed export or import.
fn transfer_error(what: &'static str, e: RuntimeError) -> ServiceError {
    match e {
        RuntimeError::InvalidArchive(message) => {
            ServiceError::new(ErrorCode::InvalidArchive, format!("invalid archive: {message}"))
        }
        RuntimeError::ArchiveTooLarge(message) => ServiceError::new(ErrorCode::PayloadTooLarge, message),
        RuntimeError::Stream { what: "read", source } => ServiceError::new(
            ErrorCode::InvalidRequest,
            format!("reading the request body failed: {source}"),
        ),
        RuntimeError::Stream { source, .. } => ServiceError::new(
            ErrorCode::Unavailable,
            format!("the download was cut off: {source}"),
        ),
        other => ServiceError::from_runtime(what, other),
    }
}

impl SandboxService {
    /// Streams a snapshot of `p`'s tenant as a POSIX tar archive (setuid and setgid bits cleared
    /// unless `options` keep them; the audit row says which, and how many were cleared).
    pub async fn export_snapshot(
        &self,
        p: &Principal,
        id: &SnapshotId,
        options: ExportOptions,
    ) -> Result<ByteStream, ServiceError> {
        let record = self.owned_snapshot(p, id).await?;
        let snapshot = id.clone();
        let (tx, mut rx) = mpsc::channel::<Piece>(4);
        let writer = ChannelWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(CHUNK + HOLD_BACK),
            sent: 0,
        };
        let exporter = self.clone();
        let job = async move {
            exporter
                .on_backend("export a snapshot", move |b| {
                    let mut writer = writer;
                    let result = b.export_snapshot(&snapshot, &options, &mut writer);
                    (result, writer.buf, writer.sent)
                })
                .await
        };
        let service = self.clone();
        let principal = p.clone();
        tokio::spawn(async move {
            let (result, tail, sent) = match job.await {
                Ok(done) => done,
                Err(e) => (
                    Err(RuntimeError::Stream {
                        what: "write",
                        source: io::Error::other(e.message),
                    }),
                    Vec::new(),
                    0,
                ),
            };
            let piece = service
                .finish_export(&principal, &record, &options, result, tail, sent)
                .await;
            let _ = tx.send(piece).await;
        });
        // The first piece tells an error answer (nothing sent yet) from a stream.
        let first = match rx.recv().await {
            Some(Piece::Data(bytes)) => bytes,
            Some(Piece::Failed(e)) => return Err(e),
            None => {
                return Err(ServiceError::internal(
                    "export a snapshot",
                    &"the export ended without an answer",
                ))
            }
        };
        let stream = futures_util::stream::once(async move { Ok(first) }).chain(
            futures_util::stream::unfold(rx, |mut rx| async move {
                match rx.recv().await? {
                    Piece::Data(bytes) => Some((Ok(bytes), rx)),
                    Piece::Failed(e) => {
                        rx.close();
                        Some((Err(io::Error::other(e.message)), rx))
                    }
                }
            }),
        );
        Ok(Box::pin(stream))
    }

    /// Writes the export's audit row, then says what the client gets last: the held-back bytes, or
    /// the error.
    async fn finish_export(
        &self,
        p: &Principal,
        record: &SnapshotRecord,
        options: &ExportOptions,
        result: Result<TransferSummary, RuntimeError>,
        tail: Vec<u8>,
        sent: u64,
    ) -> Piece {
        let (outcome, error, summary) = match result {
            Ok(summary) => ("ok".to_owned(), None, Some(summary)),
            Err(e) => {
                let error = transfer_error("export a snapshot", e);
                (error.code.as_str().to_owned(), Some(error), None)
            }
        };
        let bytes_out = sent + if error.is_none() { tail.len() as u64 } else { 0 };
        let entry = AuditEntry::ok(p, AuditAction::SnapshotExport, record.sandbox_id.as_deref())
            .outcome(outcome)
            .detail(audit::Exported {
                snapshot: record.id.clone(),
                bytes_out,
                entries: summary.map(|s| s.entries),
                keep_setid: options.keep_setid,
                setid_cleared: summary.map(|s| s.setid_cleared),
            });
        match (self.audit(entry).await, error) {
            (_, Some(e)) | (Err(e), None) => Piece::Failed(e),
            (Ok(()), None) => Piece::Data(Bytes::from(tail)),
        }
    }

    /// Creates a read-only snapshot owned by `p`'s tenant from a tar archive (as exports write them).
    pub async fn import_snapshot(
        &self,
        p: &Principal,
        name: Option<String>,
        labels: BTreeMap<String, String>,
        body: ByteStream,
    ) -> Result<SnapshotInfo, ServiceError> {
        if name.as_ref().is_some_and(|n| n.len() > MAX_NAME_LEN) {
            return Err(ServiceError::invalid(
                "name",
                format!("at most {MAX_NAME_LEN} bytes"),
            ));
        }
        check_snapshot_labels(&labels)?;
        let request = QuotaRequest {
            snapshots: 1,
            ..QuotaRequest::default()
        };
        self.precheck_quota(p, AuditAction::SnapshotImport, None, request)
            .await?;
        // An import is charged its archive's size: it may be no larger than the storage the tenant
        // has left (the store checks the real figure again when it records the snapshot).
        let room = self.storage_room(p).await?;
        let max_bytes = self.inner.config.max_import_bytes;
        let limits = ImportLimits {
            max_bytes: room.map_or(max_bytes, |room| room.min(max_bytes)),
            max_entries: MAX_IMPORT_ENTRIES,
        };
        let quota_bound = room.is_some_and(|room| room < max_bytes);
        let snapshot = SnapshotId::from_random(rand::random());
        let received = Arc::new(AtomicU64::new(0));
        let counter = received.clone();
        let counted = body.inspect(move |chunk| {
            if let Ok(chunk) = chunk {
                counter.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            }
        });
        let mut reader = SyncIoBridge::new(StreamReader::new(counted));
        let target = snapshot.clone();
        let unpacked = self
            .on_backend("import a snapshot", move |b| {
                b.import_snapshot(&target, &mut reader, &limits)
            })
            .await?;
        let summary = match unpacked {
            Ok(summary) => summary,
            Err(e) => {
                let error = match e {
                    RuntimeError::ArchiveTooLarge(_) if quota_bound => crate::core::error::quota_exceeded(
                        "max_storage",
                        limits.max_bytes,
                        received.load(Ordering::Relaxed),
                    ),
                    e => transfer_error("import a snapshot", e),
                };
                self.audit(
                    AuditEntry::ok(p, AuditAction::SnapshotImport, None)
                        .outcome(error.code.as_str())
                        .detail(audit::ImportFailed {
                            snapshot: snapshot.to_string(),
                            bytes_in: received.load(Ordering::Relaxed),
                        }),
                )
                .await?;
                return Err(error);
            }
        };
        let new = NewSnapshot {
            id: snapshot.to_string(),
            tenant: p.tenant.clone(),
            sandbox_id: None,
            kind: SnapshotKind::Snapshot,
            name,
            labels,
            created_at_ms: now_ms(),
            // What it holds is at most what was unpacked; the archive's size counts headers too.
            storage_bytes: summary.bytes.max(summary.data_bytes),
            template_id: None,
        };
        let row = AuditEntry::ok(p, AuditAction::SnapshotImport, None)
            .detail(audit::Imported {
                snapshot: snapshot.to_string(),
                bytes_in: summary.bytes,
                entries: summary.entries,
                data_bytes: summary.data_bytes,
            })
            .into_row();
        let (record, defaults) = (new.clone(), self.quota_defaults());
        let stored = self
            .db("record an imported snapshot", move |s| {
                s.transaction(|tx| {
                    tx.insert_snapshot_checked(&record, &defaults)?;
                    audit::append(tx, &row)?;
                    Ok::<_, StoreError>(())
                })
            })
            .await;
        if let Err(e) = stored {
            // Storage without a record is garbage: remove it now rather than at the next start.
            self.free_snapshot_now(snapshot).await;
            return self
                .audit_refusal(p, AuditAction::SnapshotImport, None, Err(e))
                .await;
        }
        Ok(info(&SnapshotRecord {
            id: new.id,
            tenant: new.tenant,
            sandbox_id: None,
            kind: new.kind,
            name: new.name,
            labels: new.labels,
            created_at_ms: new.created_at_ms,
            deleted_at_ms: None,
            storage_bytes: new.storage_bytes,
            template_id: None,
        }))
    }
}
