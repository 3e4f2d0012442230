//! Policy as data plus pure functions: the operator's configuration and the decision.

mod decide;
mod operator;

pub use decide::{allowed_by_domain, decide, decide_name, Decision, Destination, Rule};
pub use operator::{OperatorAllow, OperatorDenial, OperatorDeny, OperatorPolicy};
