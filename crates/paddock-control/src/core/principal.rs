//! Who is calling.

/// The authenticated caller of an operation: a tenant, through one of its API keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The tenant acted for; it sees only its own sandboxes.
    pub tenant: String,
    /// The key used (recorded in every audit row).
    pub key_id: String,
    /// Admin keys manage keys and tenants, read every tenant's audit rows and the metrics.
    pub admin: bool,
    /// May change a live sandbox's network policy and secrets (`set_network`); a key made without
    /// this permission is refused there with `forbidden`. Paddock's own principals (recovery, the
    /// operator's templates, a sandbox's door) keep it: they act as keys did before it existed.
    pub change_network: bool,
    /// May set and delete the tenant's approval policies (`set_policy`, `delete_policy`; an admin
    /// may too). Paddock's own principals do not: they never change a policy.
    pub approver: bool,
}

/// The tenant of the bootstrap admin key, which also owns the templates the server's
/// configuration has it build.
pub const ADMIN_TENANT: &str = "admin";
