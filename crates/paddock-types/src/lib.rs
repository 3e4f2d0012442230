//! Domain data of paddock: sandbox, snapshot and volume ids, sizes, limits, mounts, the network
//! policy, the sandbox spec, and recipes (the Dockerfile subset templates are built from).
//!
//! Everything here is plain data, parsed once at the edge (`FromStr`, and serde goes through the same
//! parsers) so the rest of the code never handles an unvalidated id, size or path. No I/O, no tokio.

mod id;
mod limit_bounds;
mod limits;
mod link;
mod mounts;
mod network;
mod size;
mod spec;
mod template;
mod volumes;

pub use id::{SandboxId, SandboxIdError, SnapshotId, SnapshotIdError, TemplateId, TemplateIdError};
pub use limit_bounds::{
    check_limits, clamp_limits, HostFacts, LimitError, MIN_DISK, MIN_MEMORY, MIN_PIDS, PID_MAX_LIMIT,
};
pub use limits::{CpuQuota, Limits};
pub use link::{ConntrackLimits, EgressPorts, NetworkLink, NetworkSpec, CA_BUNDLE_PATH, EGRESS_CA_PATH};
pub use mounts::{MountSpec, MountSpecError, SandboxPath, SandboxPathError};
pub use network::{
    Cidr, DomainName, DomainPattern, EgressRule, EgressTarget, NetworkPolicy, NetworkPolicyError, PortRange,
    MAX_RULES,
};
pub use size::{ByteSize, SizeError};
pub use spec::{EnvVar, EnvVarError, RootfsSpec, SandboxSpec, UserSpec, UserSpecError, VolumeSource};
pub use template::ImageConfig;
pub use volumes::{
    check_volume_mounts, VolumeId, VolumeIdError, VolumeMount, VolumeMountError, VolumeName, VolumeNameError,
    MAX_VOLUME_MOUNTS,
};

pub mod api;
pub mod diff;
pub mod recipe;
