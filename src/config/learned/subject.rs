//! What use is recorded of: a resource of the Charon API, or a descriptor
//! limit in shadow mode, as the path of entries that reaches it. A subject
//! is kept as one string in the stores ([`Subject::encode`]), with every
//! part length-prefixed so that no two subjects share a string whatever
//! their names hold.

/// How a level of a descriptor limit's path matches a request's entry.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    /// `key` and `value` as written: one value.
    Value(String),
    /// `key` with a wildcard `value`, each matching value counted apart:
    /// the request's value varies.
    Pattern(String),
    /// `key` with a wildcard `value` and `share_threshold`: one count for
    /// every value it matches.
    Shared(String),
    /// `key` alone: the request's value varies.
    Any,
}

impl Level {
    /// Whether the request's value at this level tells apart whose use it
    /// is (the "domain" of a descriptor limit).
    pub fn varies(&self) -> bool {
        matches!(self, Level::Pattern(_) | Level::Any)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Subject {
    /// A resource of the namespace, by name.
    Resource(String),
    /// A descriptor limit, by its path: each level's key and how it
    /// matches.
    Limit(Vec<(String, Level)>),
}

impl Subject {
    pub fn encode(&self) -> String {
        let mut out = String::new();
        match self {
            Subject::Resource(name) => {
                out.push('r');
                part(&mut out, name);
            }
            Subject::Limit(path) => {
                out.push('d');
                for (key, level) in path {
                    part(&mut out, key);
                    match level {
                        Level::Value(value) => {
                            out.push('=');
                            part(&mut out, value);
                        }
                        Level::Pattern(pattern) => {
                            out.push('~');
                            part(&mut out, pattern);
                        }
                        Level::Shared(pattern) => {
                            out.push('^');
                            part(&mut out, pattern);
                        }
                        Level::Any => out.push('*'),
                    }
                }
            }
        }
        out
    }

    /// The subject [`encode`](Self::encode) wrote; `None` for a string it
    /// did not write.
    pub fn decode(text: &str) -> Option<Self> {
        let (kind, mut rest) = (text.get(..1)?, text.get(1..)?);
        match kind {
            "r" => {
                let (name, rest) = take_part(rest)?;
                rest.is_empty().then(|| Subject::Resource(name.to_owned()))
            }
            "d" => {
                let mut path = Vec::new();
                while !rest.is_empty() {
                    let (key, after) = take_part(rest)?;
                    let (how, after) = (after.get(..1)?, after.get(1..)?);
                    let (level, after) = match how {
                        "=" => take_part(after).map(|(v, a)| (Level::Value(v.to_owned()), a))?,
                        "~" => take_part(after).map(|(p, a)| (Level::Pattern(p.to_owned()), a))?,
                        "^" => take_part(after).map(|(p, a)| (Level::Shared(p.to_owned()), a))?,
                        "*" => (Level::Any, after),
                        _ => return None,
                    };
                    path.push((key.to_owned(), level));
                    rest = after;
                }
                (!path.is_empty()).then_some(Subject::Limit(path))
            }
            _ => None,
        }
    }
}

fn part(out: &mut String, text: &str) {
    out.push_str(&text.len().to_string());
    out.push(':');
    out.push_str(text);
}

fn take_part(text: &str) -> Option<(&str, &str)> {
    let (length, rest) = text.split_once(':')?;
    let length: usize = length.parse().ok()?;
    Some((rest.get(..length)?, rest.get(length..)?))
}

/// The "domain" of a descriptor limit's use: the request's values at the
/// levels that vary, joined by U+001F (which no written name holds, so a
/// joined pair is never mistaken for one value).
pub const VALUE_SEPARATOR: char = '\u{1f}';

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_subject_reads_back_as_written() {
        let subjects = [
            Subject::Resource("search".into()),
            Subject::Resource(String::new()),
            Subject::Resource("12:ü=*~".into()),
            Subject::Limit(vec![
                ("generic_key".into(), Level::Value("a:b".into())),
                ("path".into(), Level::Pattern("/api/*".into())),
                ("host".into(), Level::Shared("*.example.com".into())),
                ("user".into(), Level::Any),
            ]),
        ];
        for subject in subjects {
            assert_eq!(Subject::decode(&subject.encode()), Some(subject));
        }
        for garbage in ["", "x", "r3:ab", "d", "d1:k?", "r1:ab"] {
            assert_eq!(Subject::decode(garbage), None, "{garbage}");
        }
    }
}
