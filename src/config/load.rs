//! Reading files: find them, read them (size-capped), parse the YAML, hand
//! it to the compiler (`compile`), and merge namespaces. Errors are collected
//! (not stopped at the first) so that one `charon check` shows them all.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_saphyr::Location;

use super::compile::Ctx;
use super::overlay::{Overlay, Write};
use super::raw::RawFile;
use super::{Config, ConfigError, ConfigErrors, Namespace, Note, caps};

/// A loaded configuration and what loading it changed.
#[derive(Debug)]
pub struct Loaded {
    pub config: Config,
    /// What normalization changed, file by file.
    pub notes: Vec<Note>,
    /// Each file as normalized, in YAML, for `charon check`.
    pub normalized: Vec<(PathBuf, String)>,
}

/// How files are combined into one configuration.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Files naming the same domain add their descriptors and resources to
    /// it (envoyproxy/ratelimit's `MERGE_DOMAIN_CONFIG`); without it, a
    /// second file for a domain is an error.
    pub merge_domains: bool,
}

/// Loads one file, or every `*.yaml`/`*.yml` file of a directory.
pub fn load_path(path: &Path) -> Result<Loaded, ConfigErrors> {
    load_path_with(path, LoadOptions::default())
}

/// [`load_path`], with files naming one domain merged if `options` say so.
pub fn load_path_with(path: &Path, options: LoadOptions) -> Result<Loaded, ConfigErrors> {
    assemble(read_sources(path)?, options, &Overlay::default(), None)
}

/// One namespace's text and where it came from.
pub(super) struct Source {
    pub origin: PathBuf,
    pub text: String,
    /// For a namespace the API owns: its name in the API's path.
    pub api_name: Option<String>,
}

/// Reads one file, or every `*.yaml`/`*.yml` file of a directory.
pub(super) fn read_sources(path: &Path) -> Result<Vec<Source>, ConfigErrors> {
    let files = if path.is_dir() {
        yaml_files_in(path)?
    } else {
        vec![path.to_owned()]
    };
    let mut errors = Vec::new();
    let mut sources = Vec::new();
    for file in files {
        match read_capped(&file) {
            Ok(text) => sources.push(Source {
                origin: file,
                text,
                api_name: None,
            }),
            Err(error) => errors.push(error),
        }
    }
    if errors.is_empty() {
        Ok(sources)
    } else {
        Err(ConfigErrors(errors))
    }
}

/// Compiles every source with `overlay` applied and merges namespaces.
/// `strict` is a write being checked: its override must apply, and its API
/// namespace must not collide with a file's.
pub(super) fn assemble(
    sources: Vec<Source>,
    options: LoadOptions,
    overlay: &Overlay,
    strict: Option<Write<'_>>,
) -> Result<Loaded, ConfigErrors> {
    let mut errors = Vec::new();
    let mut notes = Vec::new();
    let mut normalized = Vec::new();
    let mut namespaces: HashMap<String, Namespace> = HashMap::new();
    for Source {
        origin: file,
        text,
        api_name,
    } in sources
    {
        match compile_file(&text, &file, overlay, strict) {
            Ok(compiled) => {
                let name = compiled.namespace.name.clone();
                let error = |message: String| ConfigError {
                    file: file.clone(),
                    line: compiled.domain_at.line(),
                    column: compiled.domain_at.column(),
                    message,
                };
                if let Some(wanted) = &api_name {
                    if *wanted != name {
                        errors.push(error(format!(
                            "the body names domain `{name}`; it was sent for namespace `{wanted}`"
                        )));
                        continue;
                    }
                    if let Some(first) = namespaces.get(&name) {
                        let message = format!(
                            "namespace `{name}` is defined by the file {}; the API cannot also define it",
                            first.source.display()
                        );
                        if matches!(strict, Some(Write::Namespace(checked)) if checked == name) {
                            errors.push(ConfigError::whole_file(&file, message));
                        } else {
                            notes.push(Note {
                                file: file.clone(),
                                line: 0,
                                column: 0,
                                message: format!("skipped: {message}"),
                            });
                        }
                        continue;
                    }
                }
                if let Some(first) = namespaces.get_mut(&name) {
                    if !options.merge_domains {
                        errors.push(error(format!(
                            "domain `{name}` is already defined in {} (merging files of one domain is off)",
                            first.source.display()
                        )));
                        continue;
                    }
                    if let Err(message) = merge(first, compiled.namespace) {
                        errors.push(error(message));
                        continue;
                    }
                } else {
                    namespaces.insert(name, compiled.namespace);
                }
                notes.extend(compiled.notes);
                normalized.push((file, compiled.normalized));
            }
            Err(mut file_errors) => errors.append(&mut file_errors),
        }
    }
    if !errors.is_empty() {
        return Err(ConfigErrors(errors));
    }
    let config = Config {
        namespaces: namespaces
            .into_iter()
            .map(|(name, namespace)| (name, Arc::new(namespace)))
            .collect(),
    };
    Ok(Loaded {
        config,
        notes,
        normalized,
    })
}

/// Adds a later file's namespace to the first one of the same domain: its
/// descriptors and resources must be new, and its settings the same.
fn merge(first: &mut Namespace, later: Namespace) -> Result<(), String> {
    let domain = &first.name;
    let source = first.source.display();
    if first.settings != later.settings {
        return Err(format!(
            "domain `{domain}`: these `settings` differ from those in {source}; files merged into one domain must agree"
        ));
    }
    if let Some(name) = later
        .resources
        .keys()
        .find(|name| first.resources.contains_key(*name))
    {
        return Err(format!(
            "domain `{domain}`: resource `{name}` is also defined in {source}"
        ));
    }
    first.descriptors.merge(later.descriptors).map_err(|key| {
        format!("duplicate descriptor composite key '{domain}.{key}': also defined in {source}")
    })?;
    first.resources.extend(later.resources);
    Ok(())
}

/// Loads one file's text; `origin` names it in errors.
pub fn load_str(text: &str, origin: impl AsRef<Path>) -> Result<Loaded, ConfigErrors> {
    let origin = origin.as_ref();
    let compiled = compile_file(text, origin, &Overlay::default(), None).map_err(ConfigErrors)?;
    let mut config = Config::default();
    config.namespaces.insert(
        compiled.namespace.name.clone(),
        Arc::new(compiled.namespace),
    );
    Ok(Loaded {
        config,
        notes: compiled.notes,
        normalized: vec![(origin.to_owned(), compiled.normalized)],
    })
}

fn yaml_files_in(dir: &Path) -> Result<Vec<PathBuf>, ConfigErrors> {
    let entries = std::fs::read_dir(dir).map_err(|e| {
        ConfigErrors(vec![ConfigError::whole_file(
            dir,
            format!("cannot read directory: {e}"),
        )])
    })?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| {
            // Kubernetes ConfigMap mounts keep their data under hidden `..data`
            // directories and expose it through symlinks: skip hidden names.
            let visible = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.'));
            let yaml = path
                .extension()
                .and_then(|e| e.to_str())
                .is_some_and(|e| e == "yaml" || e == "yml");
            visible && yaml && path.is_file()
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ConfigErrors(vec![ConfigError::whole_file(
            dir,
            "no *.yaml or *.yml file in this directory",
        )]));
    }
    Ok(files)
}

fn read_capped(file: &Path) -> Result<String, ConfigError> {
    let meta = std::fs::metadata(file)
        .map_err(|e| ConfigError::whole_file(file, format!("cannot read file: {e}")))?;
    if meta.len() > caps::MAX_FILE_BYTES {
        return Err(ConfigError::whole_file(
            file,
            format!(
                "file is {} bytes; the limit is {} bytes",
                meta.len(),
                caps::MAX_FILE_BYTES
            ),
        ));
    }
    // The file may grow between the size check and the read: read no more
    // than the cap allows.
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .and_then(|f| {
            std::io::Read::read_to_end(
                &mut std::io::Read::take(f, caps::MAX_FILE_BYTES + 1),
                &mut bytes,
            )
        })
        .map_err(|e| ConfigError::whole_file(file, format!("cannot read file: {e}")))?;
    if bytes.len() as u64 > caps::MAX_FILE_BYTES {
        return Err(ConfigError::whole_file(
            file,
            format!(
                "file is larger than the limit of {} bytes",
                caps::MAX_FILE_BYTES
            ),
        ));
    }
    String::from_utf8(bytes)
        .map_err(|e| ConfigError::whole_file(file, format!("file is not UTF-8: {e}")))
}

struct Compiled {
    namespace: Namespace,
    notes: Vec<Note>,
    normalized: String,
    domain_at: Location,
}

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

fn compile_file(
    text: &str,
    file: &Path,
    overlay: &Overlay,
    strict: Option<Write<'_>>,
) -> Result<Compiled, Vec<ConfigError>> {
    let options = parser_options();
    // Like envoyproxy/ratelimit, tolerate `---` separators around the one
    // document (empty documents are skipped).
    let documents: Vec<Option<RawFile>> =
        serde_saphyr::from_str_multiple_with_options(text, options)
            .map_err(|e| vec![parse_error(file, &e)])?;
    let mut documents: Vec<RawFile> = documents.into_iter().flatten().collect();
    if documents.len() > 1 {
        return Err(vec![ConfigError::whole_file(
            file,
            format!(
                "{} YAML documents in one file; a file holds one namespace (split them into files of a directory)",
                documents.len()
            ),
        )]);
    }
    let Some(mut raw) = documents.pop() else {
        return Err(vec![ConfigError::whole_file(
            file,
            "the file is empty; it needs at least `domain:`",
        )]);
    };
    let mut ctx = Ctx {
        file: file.to_owned(),
        errors: Vec::new(),
        notes: Vec::new(),
    };
    let strict_override = match strict {
        Some(Write::Override {
            namespace,
            resource,
            domain,
        }) if namespace == raw.domain.value => Some((resource, domain)),
        _ => None,
    };
    overlay.apply(&mut raw, strict_override, &mut ctx.notes, &mut ctx.errors);
    if !ctx.errors.is_empty() {
        return Err(ctx.errors);
    }
    let namespace = ctx.namespace(&mut raw);
    if !ctx.errors.is_empty() {
        return Err(ctx.errors);
    }
    let normalized =
        serde_saphyr::to_string(&raw).unwrap_or_else(|e| format!("# cannot print: {e}\n"));
    Ok(Compiled {
        namespace,
        notes: ctx.notes,
        normalized,
        domain_at: raw.domain.referenced,
    })
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
