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
use super::yaml::{parse_error, parser_options};
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
    /// The files may be absent: a control plane (xDS) pushes the
    /// namespaces, so a missing path or a directory without YAML is no
    /// namespace rather than an error.
    pub files_optional: bool,
}

/// A namespace a control plane pushed (xDS), in the file format: loaded
/// after the files and before the API's namespaces, by the same rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PushedNamespace {
    /// Where it came from, for errors: `xds:<resource name>`.
    pub origin: PathBuf,
    pub text: String,
}

/// Loads one file, or every `*.yaml`/`*.yml` file of a directory.
pub fn load_path(path: &Path) -> Result<Loaded, ConfigErrors> {
    load_path_with(path, LoadOptions::default())
}

/// [`load_path`], with files naming one domain merged if `options` say so.
pub fn load_path_with(path: &Path, options: LoadOptions) -> Result<Loaded, ConfigErrors> {
    assemble(
        read_sources(path, options)?,
        options,
        &Overlay::default(),
        None,
    )
}

/// One namespace's text and where it came from.
pub(super) struct Source {
    pub origin: PathBuf,
    pub text: String,
    /// For a namespace the API owns: its name in the API's path.
    pub api_name: Option<String>,
}

/// Reads one file, or every `*.yaml`/`*.yml` file of a directory (none,
/// when the files are optional and there are none).
pub(super) fn read_sources(path: &Path, options: LoadOptions) -> Result<Vec<Source>, ConfigErrors> {
    if options.files_optional && !path.exists() {
        return Ok(Vec::new());
    }
    let files = if path.is_dir() {
        yaml_files_in(path, options.files_optional)?
    } else {
        vec![path.to_owned()]
    };
    let mut errors = Vec::new();
    let mut sources = Vec::new();
    for file in files {
        let text = match read_capped(&file) {
            // A marker of Boulder's files: the namespace they describe.
            Ok(text) if super::boulder::is_marker(&text) => {
                super::boulder::translate(&text, &file, read_capped)
            }
            Ok(text) => Ok(text),
            Err(error) => Err(vec![error]),
        };
        match text {
            Ok(text) => sources.push(Source {
                origin: file,
                text,
                api_name: None,
            }),
            Err(found) => errors.extend(found),
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

/// The visible `*.yaml`/`*.yml` files of `dir`, sorted; none is an error
/// unless the files are optional.
fn yaml_files_in(dir: &Path, optional: bool) -> Result<Vec<PathBuf>, ConfigErrors> {
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
    if files.is_empty() && !optional {
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

/// The stack a file is parsed and compiled on: parsing, compiling,
/// printing and dropping a descriptor tree each recurse once per level, and
/// at the deepest nesting allowed that is more than a runtime worker's
/// 2 MiB in a debug build. Only the pages touched are ever resident.
const COMPILE_STACK_BYTES: usize = 32 << 20;

fn compile_file(
    text: &str,
    file: &Path,
    overlay: &Overlay,
    strict: Option<Write<'_>>,
) -> Result<Compiled, Vec<ConfigError>> {
    std::thread::scope(|scope| {
        let compiled = std::thread::Builder::new()
            .name("charon-config".into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn_scoped(scope, || compile_file_here(text, file, overlay, strict));
        match compiled {
            Ok(thread) => thread
                .join()
                .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
            // No thread to be had: on this one, as deep as it goes.
            Err(_) => compile_file_here(text, file, overlay, strict),
        }
    })
}

fn compile_file_here(
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

/// Loads `path` (a file or a directory) with `overlay` applied. API
/// namespaces whose name a file also defines are skipped with a note: the
/// file wins.
pub fn load_with_overlay(
    path: &Path,
    options: LoadOptions,
    pushed: &[PushedNamespace],
    overlay: &Overlay,
) -> Result<Loaded, ConfigErrors> {
    let mut sources = read_sources(path, options)?;
    add_pushed(&mut sources, pushed);
    add_api_namespaces(&mut sources, overlay);
    assemble(sources, options, overlay, None)
}

/// Loads `path` with `overlay`, which holds `write`, the change being made:
/// it must apply, or its errors (with line and column in the body) are
/// returned, and nothing else may fail either. The notes say what
/// normalization changed.
pub fn check_write(
    path: &Path,
    options: LoadOptions,
    pushed: &[PushedNamespace],
    overlay: &Overlay,
    write: Write<'_>,
) -> Result<Loaded, ConfigErrors> {
    let mut sources = read_sources(path, options)?;
    add_pushed(&mut sources, pushed);
    add_api_namespaces(&mut sources, overlay);
    let loaded = assemble(sources, options, overlay, Some(write))?;
    if let Write::Override { namespace, .. } = write
        && loaded.config.namespace(namespace).is_none()
    {
        return Err(ConfigErrors(vec![ConfigError::whole_file(
            &super::overlay::namespace_origin(namespace),
            format!("no namespace `{namespace}`"),
        )]));
    }
    Ok(loaded)
}

fn add_pushed(sources: &mut Vec<Source>, pushed: &[PushedNamespace]) {
    sources.extend(pushed.iter().map(|namespace| Source {
        origin: namespace.origin.clone(),
        text: namespace.text.clone(),
        api_name: None,
    }));
}

fn add_api_namespaces(sources: &mut Vec<Source>, overlay: &Overlay) {
    for (name, text) in &overlay.namespaces {
        sources.push(Source {
            origin: super::overlay::namespace_origin(name),
            text: text.clone(),
            api_name: Some(name.clone()),
        });
    }
}
