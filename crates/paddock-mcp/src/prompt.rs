//! The `sandbox_rules` prompt: what a model should know before it works in a sandbox (it is
//! disposable and ends by itself, its network is what its policy allows and nothing else, its
//! limits, how to save and return to its state, how to run long commands), and, given a sandbox,
//! that sandbox's own limits, lifetime and network policy.
//!
//! What it does not do: change anything, or say more than the caller may read (the sandbox is
//! looked up as the caller; another tenant's is not found).

use paddock_control::Principal;
use paddock_types::SandboxId;
use rmcp::model::{ErrorData, GetPromptResult, Prompt, PromptArgument, PromptMessage, Role};

use crate::tools::failure;
use crate::PaddockMcp;

/// The prompt's name.
pub const RULES_PROMPT: &str = "sandbox_rules";

const RULES: &str = "You work in paddock sandboxes: disposable Linux machines. Rules:
- Each sandbox ends by itself when its timeout passes (sandbox_create's timeout_secs, default 600 s); \
extend it with sandbox_extend, and kill it with sandbox_kill when you are done.
- Nothing you do reaches the host or other sandboxes. The network is closed unless the sandbox's \
policy allows a destination (network_get shows it); an address the operator forbids stays \
unreachable whatever the policy says. Do not try to get around a refused connection: report it.
- Memory, CPU, process and disk limits are enforced by the kernel: a process past its memory limit \
is killed. Output of run_command is capped at 256 KiB per stream; `truncated` says when.
- Before a risky change, call checkpoint; if it goes wrong, rollback returns every file to the \
checkpoint, and commit keeps the changes and drops it. snapshot_create keeps a named copy.
- run_command waits for its command (default limit 60 s). For servers and long jobs use \
process_start, then process_read with the offsets it returns, process_write for stdin and \
process_signal to stop it.
- Files: file_read (line ranges for large text), file_write, file_edit (exact replacement of text \
found once), file_list. A file is also the resource paddock://sandbox/<id>/file/<path>.";

/// The prompt as `prompts/list` gives it.
pub(crate) fn rules_prompt() -> Prompt {
    let argument = PromptArgument::new("sandbox_id")
        .with_description("A sandbox whose own limits, lifetime and network policy to include")
        .with_required(false);
    Prompt::new(
        RULES_PROMPT,
        Some("How paddock sandboxes work and what they allow: lifetime, network, limits, checkpoints."),
        Some(vec![argument]),
    )
}

impl PaddockMcp {
    /// The prompt's text, with `sandbox`'s particulars when one is named.
    pub(crate) async fn rules(
        &self,
        p: &Principal,
        sandbox: Option<&str>,
    ) -> Result<GetPromptResult, ErrorData> {
        let mut text = RULES.to_owned();
        if let Some(sandbox) = sandbox {
            let id = sandbox
                .parse::<SandboxId>()
                .map_err(|e| ErrorData::invalid_params(format!("invalid_request: sandbox_id: {e}"), None))?;
            let info = self
                .service
                .get_sandbox(p, &id)
                .await
                .map_err(|e| ErrorData::invalid_params(failure(e), None))?;
            let limits = &info.limits;
            let show = |v: Option<String>| v.unwrap_or_else(|| "none".to_owned());
            text.push_str(&format!(
                "\n\nSandbox {id}: template {template}, user {user}, expires {expires}. Limits: memory {memory}, \
                 cpus {cpus}, processes {pids}, disk {disk}.",
                id = info.id,
                template = info.template,
                user = info.user,
                expires = show(info.expires_at.clone()),
                memory = show(limits.memory.map(|m| m.to_string())),
                cpus = show(limits.cpus.map(|c| f64::from(c).to_string())),
                pids = show(limits.pids.map(|n| n.to_string())),
                disk = show(limits.disk.map(|d| d.to_string())),
            ));
            match self.service.get_network(p, &id).await {
                Ok(network) => {
                    let policy = serde_json::to_string(&network.policy).unwrap_or_default();
                    text.push_str(&format!(" Network policy: {policy}."));
                }
                Err(_) => text.push_str(" It has no network."),
            }
        }
        Ok(
            GetPromptResult::new(vec![PromptMessage::new_text(Role::User, text)])
                .with_description("The rules of paddock sandboxes"),
        )
    }
}
