//! Network flags shared by `paddock run`, `paddock sandbox create` and `paddock sandbox network`.

use clap::Args;
use paddock_types::{Cidr, DomainPattern, EgressRule, EgressTarget, NetworkPolicy, PortRange};

/// A network policy from flags. A sandbox gets a network when any of them is given.
#[derive(Debug, Clone, Default, Args)]
pub struct NetworkArgs {
    /// Allow a domain (`pypi.org`, `*.pythonhosted.org`, `*` for every name), optionally on ports:
    /// `NAME[:PORTS]`, PORTS being `443` or `8000-8100` joined by `,` (repeatable).
    #[arg(long = "allow-domain", value_name = "DOMAIN[:PORTS]", value_parser = parse_domain_rule)]
    pub allow_domains: Vec<EgressRule>,
    /// Allow an address or network (`10.1.2.0/24:443`), optionally on ports (repeatable).
    #[arg(long = "allow-cidr", value_name = "CIDR[:PORTS]", value_parser = parse_cidr_rule)]
    pub allow_cidrs: Vec<EgressRule>,
    /// Deny a domain even where an allow rule matches (repeatable).
    #[arg(long = "deny-domain", value_name = "DOMAIN[:PORTS]", value_parser = parse_domain_rule)]
    pub deny_domains: Vec<EgressRule>,
    /// Deny an address or network even where an allow rule matches (repeatable).
    #[arg(long = "deny-cidr", value_name = "CIDR[:PORTS]", value_parser = parse_cidr_rule)]
    pub deny_cidrs: Vec<EgressRule>,
    /// Give the sandbox a network even with no allow rule (every attempt is refused and recorded).
    #[arg(long)]
    pub network: bool,
}

impl NetworkArgs {
    /// Whether any network flag was given.
    pub fn any(&self) -> bool {
        self.network
            || !self.allow_domains.is_empty()
            || !self.allow_cidrs.is_empty()
            || !self.deny_domains.is_empty()
            || !self.deny_cidrs.is_empty()
    }

    /// The policy, when any network flag was given.
    pub fn policy(&self) -> anyhow::Result<Option<NetworkPolicy>> {
        if !self.any() {
            return Ok(None);
        }
        let allow = self
            .allow_domains
            .iter()
            .chain(&self.allow_cidrs)
            .cloned()
            .collect();
        let deny = self
            .deny_domains
            .iter()
            .chain(&self.deny_cidrs)
            .cloned()
            .collect();
        Ok(Some(NetworkPolicy::new(allow, deny)?))
    }
}

fn parse_ports(s: &str) -> Result<Vec<PortRange>, String> {
    s.split(',')
        .map(|p| p.parse::<PortRange>().map_err(|e| e.to_string()))
        .collect()
}

/// `NAME` or `NAME:PORTS`.
pub fn parse_domain_rule(s: &str) -> Result<EgressRule, String> {
    let (name, ports) = match s.rsplit_once(':') {
        Some((name, ports)) => (name, parse_ports(ports)?),
        None => (s, Vec::new()),
    };
    let pattern: DomainPattern = name
        .parse()
        .map_err(|e: paddock_types::NetworkPolicyError| e.to_string())?;
    Ok(EgressRule::new(EgressTarget::Domain(pattern), ports))
}

/// `CIDR`, `CIDR:PORTS`, or `[IPV6-CIDR]:PORTS`.
pub fn parse_cidr_rule(s: &str) -> Result<EgressRule, String> {
    let whole = match s.parse::<Cidr>() {
        Ok(c) => return Ok(EgressRule::new(EgressTarget::Cidr(c), Vec::new())),
        Err(e) => e,
    };
    if let Some((net, ports)) = s.rsplit_once(':') {
        if let Ok(ports) = parse_ports(ports) {
            let net = net.trim_start_matches('[').trim_end_matches(']');
            let cidr: Cidr = net
                .parse()
                .map_err(|e: paddock_types::NetworkPolicyError| e.to_string())?;
            return Ok(EgressRule::new(EgressTarget::Cidr(cidr), ports));
        }
    }
    Err(whole.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_from_flags() {
        let r = parse_domain_rule("*.pythonhosted.org").expect("pattern");
        assert!(r.covers_all_ports());
        let r = parse_domain_rule("pypi.org:443,8000-8100").expect("ports");
        assert!(r.covers_port(443) && r.covers_port(8050) && !r.covers_port(80));
        let r = parse_cidr_rule("10.1.2.0/24:443").expect("cidr");
        assert_eq!(r.cidr().map(|c| c.to_string()), Some("10.1.2.0/24".into()));
        assert!(r.covers_port(443) && !r.covers_port(80));
        assert!(parse_cidr_rule("2001:db8::/32").expect("v6").covers_all_ports());
        assert!(parse_cidr_rule("[2001:db8::/32]:443")
            .expect("v6 port")
            .covers_port(443));
        for bad in ["10.0.0.1/8", "a.com", "10.0.0.0/8:0", "10.0.0.0/8:x"] {
            assert!(parse_cidr_rule(bad).is_err(), "{bad}");
        }
        // A lone `*` is every name (the operator's deny list and private addresses still apply).
        let any = parse_domain_rule("*:443").expect("every name");
        assert!(any.covers_port(443) && !any.covers_port(80));
        for bad in ["**", "*.", "a..b", "a.com:0", "1.2.3.4"] {
            assert!(parse_domain_rule(bad).is_err(), "{bad}");
        }
    }
}
