//! Who is calling, and the one check of what a key may do beyond its tenant's sandboxes.

use paddock_types::api::ErrorCode;

use crate::ServiceError;

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

/// What a key may be allowed beyond using its tenant's sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Permission {
    /// Manage keys and tenants, read every tenant's audit rows and the metrics.
    Admin,
    /// Change a live sandbox's network policy and secrets.
    ChangeNetwork,
    /// Set and delete the tenant's approval policies (an admin may too).
    Approve,
}

impl Permission {
    /// The `forbidden` refusal of `doing` (`changing a sandbox's network`) without it.
    pub(crate) fn refusal(self, doing: &str) -> ServiceError {
        let message = match self {
            Permission::Admin => format!("{doing} needs an admin key"),
            Permission::ChangeNetwork => format!(
                "{doing} needs a key that may change networks (this key was made with change_network false)"
            ),
            Permission::Approve => {
                format!("{doing} needs an approver or admin key (this key was made without approver)")
            }
        };
        ServiceError::new(ErrorCode::Forbidden, message)
    }
}

impl Principal {
    /// Whether this key has `permission`.
    pub(crate) fn may(&self, permission: Permission) -> bool {
        match permission {
            Permission::Admin => self.admin,
            Permission::ChangeNetwork => self.change_network,
            Permission::Approve => self.approver || self.admin,
        }
    }

    /// Refuses `doing` with `forbidden` unless this key has `permission`. Callers check it before
    /// any lookup, so the answer does not depend on what the request names, and a refusal writes
    /// no audit row (nothing was attempted).
    pub(crate) fn require(&self, permission: Permission, doing: &str) -> Result<(), ServiceError> {
        if self.may(permission) {
            Ok(())
        } else {
            Err(permission.refusal(doing))
        }
    }
}

/// The tenant of the bootstrap admin key, which also owns the templates the server's
/// configuration has it build.
pub const ADMIN_TENANT: &str = "admin";
