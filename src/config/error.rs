use std::fmt;
use std::path::{Path, PathBuf};

/// One problem in a configuration file, with where it is.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", Location(file, *line, *column))]
pub struct ConfigError {
    pub file: PathBuf,
    /// One-based; 0 when the problem is about the file as a whole.
    pub line: u64,
    pub column: u64,
    pub message: String,
}

impl ConfigError {
    pub fn whole_file(file: &Path, message: impl Into<String>) -> Self {
        Self {
            file: file.to_owned(),
            line: 0,
            column: 0,
            message: message.into(),
        }
    }
}

/// Every error found; a configuration with any is rejected whole.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, error) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{error}")?;
        }
        Ok(())
    }
}

/// A change normalization made, with where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub file: PathBuf,
    pub line: u64,
    pub column: u64,
    pub message: String,
}

impl fmt::Display for Note {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}",
            Location(&self.file, self.line, self.column),
            self.message
        )
    }
}

/// `file:line:column`, or just `file` when the problem is the whole file.
struct Location<'a>(&'a Path, u64, u64);

impl fmt::Display for Location<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Location(file, line, column) = *self;
        if line == 0 {
            write!(f, "{}", file.display())
        } else {
            write!(f, "{}:{line}:{column}", file.display())
        }
    }
}
