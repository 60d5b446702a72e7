//! The YAML parser as every configuration source uses it (files, directories
//! and the configuration API's bodies): its options and caps
//! (docs/configuration.md#caps-on-input), and its errors said with a place and
//! in the words of a configuration's author.

use std::path::Path;

use super::{ConfigError, caps};

/// The YAML parser's options: locations without snippets, and the caps
/// (docs/configuration.md#caps-on-input).
pub(super) fn parser_options() -> serde_saphyr::options::Options {
    let mut options = serde_saphyr::options::Options::default();
    options.with_snippet = false;
    let mut budget = serde_saphyr::Budget::default();
    // Descriptor nesting takes two YAML levels (a list, then a map).
    budget.max_depth = 2 * caps::MAX_DESCRIPTOR_DEPTH + 4;
    budget.max_nodes = caps::MAX_YAML_NODES;
    budget.max_events = 2 * caps::MAX_YAML_NODES;
    options.budget = Some(budget);
    options
}

/// Parser messages that speak of Rust types or library options, said the way
/// a configuration's author would understand them.
fn plain_words(message: &str) -> String {
    let replacements: [(&str, &str); 10] = [
        (
            "missing field `domain`",
            "missing field `domain`: every config file needs a non-empty `domain`",
        ),
        (
            "missing field `key`",
            "missing field `key`: every descriptor needs a non-empty `key`",
        ),
        (
            "expected mapping start",
            "expected a mapping (`field: value` lines) here, not a single value or a list",
        ),
        (
            "expected sequence start",
            "expected a list (`- item` lines) here",
        ),
        ("expected string scalar", "expected a text value here"),
        (
            "invalid i64",
            "expected a whole number between 0 and 4294967295",
        ),
        (
            "invalid u32",
            "expected a whole number between 0 and 4294967295",
        ),
        (
            "cannot deserialize null into string; use Option<String>",
            "a value is required here",
        ),
        (", set DuplicateKeyPolicy in Options if acceptable", ""),
        (
            "; use from_str_multiple or from_str_multiple_with_options",
            "",
        ),
    ];
    let mut message = message.to_owned();
    for (from, to) in replacements {
        message = message.replace(from, to);
    }
    if message.starts_with("budget breached: Depth") {
        return format!(
            "nested deeper than the maximum depth of {} YAML levels ({} levels of descriptors)",
            2 * caps::MAX_DESCRIPTOR_DEPTH + 4,
            caps::MAX_DESCRIPTOR_DEPTH
        );
    }
    if message.starts_with("budget breached: Nodes")
        || message.starts_with("budget breached: Events")
    {
        return format!(
            "the file has too many YAML nodes (the limit is {})",
            caps::MAX_YAML_NODES
        );
    }
    message
}

pub(super) fn parse_error(file: &Path, error: &serde_saphyr::Error) -> ConfigError {
    let text = plain_words(&error.to_string());
    match error.location() {
        Some(at) => {
            // The parser appends " at line L, column C"; we print the location
            // first, compiler style, so strip it from the message.
            let message = text
                .rsplit_once(" at line ")
                .map_or(text.as_str(), |(message, _)| message)
                .to_owned();
            ConfigError {
                file: file.to_owned(),
                line: at.line(),
                column: at.column(),
                message,
            }
        }
        None => ConfigError::whole_file(file, text),
    }
}
