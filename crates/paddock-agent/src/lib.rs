//! paddock-agent
