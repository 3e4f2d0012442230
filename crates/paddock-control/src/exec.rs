//! Processes: exec, re-attach, stdin, signals, PTY size.

use bytes::Bytes;
use paddock_types::api::{
    AttachQuery, ErrorCode, ExecRequest, KillRequest, ProcessList, PtySizeBody, SignalRequest, StreamData,
};

use crate::{ExecStream, Principal, SandboxService, ServiceError};

fn pending() -> ServiceError {
    ServiceError::new(ErrorCode::Unsupported, "not implemented yet")
}

/// The bytes of a [`StreamData`] (decoding `data_b64` when that is how they came).
pub fn stream_bytes(data: &StreamData) -> Vec<u8> {
    use base64::Engine as _;
    match (&data.data, &data.data_b64) {
        (Some(text), _) => text.as_bytes().to_vec(),
        (None, Some(b64)) => base64::engine::general_purpose::STANDARD
            .decode(b64)
            .unwrap_or_default(),
        (None, None) => Vec::new(),
    }
}

impl SandboxService {
    /// Starts a process. Foreground: the stream carries its output and exit. Background: it keeps
    /// running on its own; read it later with [`SandboxService::attach_process`].
    pub async fn exec(&self, p: &Principal, id: &str, req: ExecRequest) -> Result<ExecStream, ServiceError> {
        let _ = (p, id, req);
        Err(pending())
    }

    /// Re-attaches to a process (running or finished): replays its output from the offsets, then
    /// follows it (when `follow` is not false).
    pub async fn attach_process(
        &self,
        p: &Principal,
        id: &str,
        pid: u32,
        q: AttachQuery,
    ) -> Result<ExecStream, ServiceError> {
        let _ = (p, id, pid, q);
        Err(pending())
    }

    /// Writes to a process's stdin (which must have been kept open); `close` closes it afterwards.
    pub async fn write_stdin(
        &self,
        p: &Principal,
        id: &str,
        pid: u32,
        data: Bytes,
        close: bool,
    ) -> Result<(), ServiceError> {
        let _ = (p, id, pid, data, close);
        Err(pending())
    }

    /// Sends a signal to one process.
    pub async fn signal_process(
        &self,
        p: &Principal,
        id: &str,
        pid: u32,
        req: SignalRequest,
    ) -> Result<(), ServiceError> {
        let _ = (p, id, pid, req);
        Err(pending())
    }

    /// Signals a process and all its descendants (default SIGKILL).
    pub async fn kill_process(
        &self,
        p: &Principal,
        id: &str,
        pid: u32,
        req: KillRequest,
    ) -> Result<(), ServiceError> {
        let _ = (p, id, pid, req);
        Err(pending())
    }

    /// Resizes a PTY process's terminal.
    pub async fn resize_pty(
        &self,
        p: &Principal,
        id: &str,
        pid: u32,
        size: PtySizeBody,
    ) -> Result<(), ServiceError> {
        let _ = (p, id, pid, size);
        Err(pending())
    }

    /// The sandbox's processes started through the API (running, and finished ones still remembered).
    pub async fn list_processes(&self, p: &Principal, id: &str) -> Result<ProcessList, ServiceError> {
        let _ = (p, id);
        Err(pending())
    }
}
