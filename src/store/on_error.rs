//! `--on-store-error`: what a sidecar answers while its shared store does
//! not (docs/design.md#failover). The memory store never fails; the policy
//! is an option of every store so that a configuration reads the same
//! whichever store a build has.

/// `--on-store-error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnStoreError {
    Allow,
    Deny,
    #[default]
    Local,
}

impl std::str::FromStr for OnStoreError {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow" => Ok(Self::Allow),
            "deny" => Ok(Self::Deny),
            "local" => Ok(Self::Local),
            other => Err(format!(
                "unknown --on-store-error {other:?}: expected allow, deny or local"
            )),
        }
    }
}

impl OnStoreError {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Allow => "allow",
            Self::Deny => "deny",
            Self::Local => "local",
        }
    }
}
