//! Policy as data plus pure functions: the operator's configuration, the decision, and the allow rules
//! the operator's deny list makes useless. No I/O here: the proxy and the control plane apply them.

mod decide;
mod operator;
mod shadow;

pub use decide::{allowed_by_domain, decide, decide_name, Decision, Destination, Rule};
pub use operator::{OperatorAllow, OperatorDenial, OperatorDeny, OperatorPolicy};
pub use shadow::{shadowed_allow_rules, ShadowedRule};
