//! How much a request matters when a server is overloaded: the four levels
//! of Google's SRE book, least critical first. The server throttler serves
//! its queue by them (docs/design.md#the-server-throttler), and so does the
//! queue of reserves waiting for a copy (docs/design.md#waiting-for-a-copy).

/// A request's criticality, least critical first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Criticality {
    Sheddable,
    SheddablePlus,
    #[default]
    Critical,
    CriticalPlus,
}

/// Every level, least critical first.
pub const LEVELS: [Criticality; 4] = [
    Criticality::Sheddable,
    Criticality::SheddablePlus,
    Criticality::Critical,
    Criticality::CriticalPlus,
];

impl Criticality {
    /// Its place among [`LEVELS`].
    pub fn rank(self) -> usize {
        self as usize
    }

    /// A header's or a field's value: `critical_plus`, `critical`,
    /// `sheddable_plus`, `sheddable`, in any case, `-` for `_`.
    pub fn parse(value: &str) -> Option<Self> {
        let value = value.trim().as_bytes();
        // Compared in place: a header on every request, no allocation.
        let same = |name: &str| {
            value.len() == name.len()
                && value.iter().zip(name.bytes()).all(|(&got, want)| {
                    got.to_ascii_lowercase() == want || (got == b'-' && want == b'_')
                })
        };
        LEVELS.into_iter().find(|level| same(level.as_str()))
    }

    /// The value as headers and the Charon API carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            Criticality::CriticalPlus => "critical_plus",
            Criticality::Critical => "critical",
            Criticality::SheddablePlus => "sheddable_plus",
            Criticality::Sheddable => "sheddable",
        }
    }
}

#[cfg(feature = "client")]
tokio::task_local! {
    static CURRENT: Criticality;
}

#[cfg(feature = "client")]
impl Criticality {
    /// The criticality of the request whose handler is running, when a
    /// `ThrottleLayer` admitted it: outgoing calls through an
    /// `AdaptiveThrottleLayer`, and reserves made with the Rust client,
    /// carry it on.
    pub fn current() -> Option<Self> {
        CURRENT.try_with(|level| *level).ok()
    }

    /// Runs `step` (a poll of a handler) as a request of this level.
    pub fn scope<T>(self, step: impl FnOnce() -> T) -> T {
        CURRENT.sync_scope(self, step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_parse_back() {
        for level in LEVELS {
            assert_eq!(Criticality::parse(level.as_str()), Some(level));
        }
        assert_eq!(
            Criticality::parse(" Critical-Plus "),
            Some(Criticality::CriticalPlus)
        );
        for bad in ["", "urgent", "critical plus", "é"] {
            assert_eq!(Criticality::parse(bad), None);
        }
    }
}
