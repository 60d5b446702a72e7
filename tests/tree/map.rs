//! ARCHITECTURE.md is the map of the tree: every path it names exists,
//! every file under `src/`, `scripts/` and `examples/` is on it, and every
//! `Type` a row of `src/` names is used by that row's files (or is a name
//! of the wire), so the map cannot drift from the house. `src/lib.rs`'s doc comment is the map of the
//! library: it names every public module.
//!
//! A file counts as named when its path is written out, or when a line of
//! the map names a path in its folder and, on the same line, the file's
//! bare name (`src/store/redis/connection.rs`, `url.rs`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn map() -> String {
    std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md")
}

/// The text between backticks on `line`.
fn quoted(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// Where the tree's own paths start; anything else in backticks is code.
const TOP: &[&str] = &[
    "src/",
    "tests/",
    "benches/",
    "examples/",
    "scripts/",
    "deploy/",
    "docs/",
    "proto/",
];

fn is_path(text: &str) -> bool {
    TOP.iter().any(|top| text.starts_with(top))
        && !text.contains(char::is_whitespace)
        && !text.contains(['<', '*', '{'])
}

/// Markdown link targets on `line` that are files of the tree.
fn links(line: &str) -> Vec<&str> {
    line.split("](")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
        .map(|target| target.split('#').next().unwrap_or(target))
        .filter(|target| !target.is_empty() && !target.contains("://"))
        .collect()
}

fn files_under(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable directory") {
        let path = entry.expect("readable entry").path();
        if path.is_dir() {
            files_under(&path, found);
        } else {
            found.push(path);
        }
    }
}

#[test]
fn every_path_on_the_map_exists() {
    let mut missing = Vec::new();
    for (number, line) in map().lines().enumerate() {
        let named = quoted(line)
            .into_iter()
            .filter(|text| is_path(text))
            .chain(links(line));
        for path in named {
            if !root().join(path).exists() {
                missing.push(format!("ARCHITECTURE.md:{}: `{path}`", number + 1));
            }
        }
        // Bare names in a table row are files of the row's folders (or of
        // the root: `build.rs`).
        if line.starts_with('|') {
            let folders = folders_of(line);
            for name in quoted(line).into_iter().filter(|text| is_file_name(text)) {
                let found = root().join(name).exists()
                    || folders
                        .iter()
                        .any(|dir| root().join(dir).join(name).exists());
                if !folders.is_empty() && !found {
                    missing.push(format!(
                        "ARCHITECTURE.md:{}: `{name}` in none of {folders:?}",
                        number + 1
                    ));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "the map names what does not exist:\n{}",
        missing.join("\n")
    );
}

/// Every file the map names: a path written out, or a bare name beside a
/// path of its folder on one line.
fn named_on_the_map() -> BTreeSet<PathBuf> {
    let mut named: BTreeSet<PathBuf> = BTreeSet::new();
    for line in map().lines() {
        let folders = folders_of(line);
        for text in quoted(line) {
            if is_path(text) {
                named.insert(PathBuf::from(text));
            } else if is_file_name(text) {
                for dir in &folders {
                    named.insert(dir.join(text));
                }
            }
        }
    }
    named
}

/// The files under `top` (a folder of the root) that the map does not
/// name, sorted.
fn unnamed_under(top: &str) -> Vec<String> {
    let named = named_on_the_map();
    let mut files = Vec::new();
    files_under(&root().join(top), &mut files);
    assert!(!files.is_empty(), "no file under `{top}`");
    let mut missing: Vec<String> = files
        .iter()
        .map(|file| {
            file.strip_prefix(root())
                .expect("under the root")
                .to_path_buf()
        })
        .filter(|file| !named.contains(file))
        .map(|file| file.display().to_string())
        .collect();
    missing.sort();
    missing
}

#[test]
fn every_file_under_src_is_on_the_map() {
    let missing = unnamed_under("src");
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name these files (add them to the floor plan):\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_file_under_scripts_is_on_the_map() {
    let missing = unnamed_under("scripts");
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name these scripts (add them to the `scripts/` row):\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_file_under_examples_is_on_the_map() {
    let missing = unnamed_under("examples");
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md does not name these examples (add them to an `examples/` row):\n{}",
        missing.join("\n")
    );
}

/// The modules `src/lib.rs` declares `pub mod`, whatever their `cfg`.
fn public_modules(lib: &str) -> Vec<&str> {
    lib.lines()
        .filter_map(|line| line.trim().strip_prefix("pub mod "))
        .filter_map(|rest| rest.strip_suffix(';'))
        .map(str::trim)
        .collect()
}

/// The text of `src/lib.rs`'s inner doc comment (`//!` lines).
fn crate_doc(lib: &str) -> String {
    lib.lines()
        .filter_map(|line| line.trim_start().strip_prefix("//!"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_crate_doc_names_every_public_module() {
    let lib = std::fs::read_to_string(root().join("src/lib.rs")).expect("src/lib.rs");
    let modules = public_modules(&lib);
    assert!(!modules.is_empty(), "src/lib.rs declares no `pub mod`");
    let doc = crate_doc(&lib);
    // `[`name`]` (a link) contains `` `name` `` (a module behind a feature).
    let missing: Vec<&str> = modules
        .into_iter()
        .filter(|name| !doc.contains(&format!("`{name}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "src/lib.rs's doc comment does not name these modules (a line each, as [`name`] or `name`): {missing:?}"
    );
}

/// The folders of the paths a line names: a folder itself, or a file's.
fn folders_of(line: &str) -> Vec<PathBuf> {
    quoted(line)
        .into_iter()
        .filter(|text| is_path(text))
        .map(|text| {
            if text.ends_with('/') {
                PathBuf::from(text)
            } else {
                Path::new(text)
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_default()
            }
        })
        .collect()
}

/// A bare file name such as `url.rs`, `decide.lua`, `soak.sh` or
/// `simple.yaml`.
fn is_file_name(text: &str) -> bool {
    !text.contains('/')
        && !text.contains(char::is_whitespace)
        && !text.contains(['<', '*', '{'])
        && [".rs", ".lua", ".html", ".js", ".css", ".sh", ".yaml"]
            .iter()
            .any(|ext| text.ends_with(ext) && text.len() > ext.len())
}

#[test]
fn the_map_reader_finds_bare_names_in_a_rows_folder() {
    let line = "| `src/store/redis/connection.rs`, `url.rs` | what `Config::namespace` owns |";
    assert_eq!(folders_of(line), vec![PathBuf::from("src/store/redis")]);
    let names: Vec<&str> = quoted(line)
        .into_iter()
        .filter(|t| is_file_name(t))
        .collect();
    assert_eq!(names, ["url.rs"]);
    let line = "| `scripts/` | `test.sh` (the one test command), `*.yaml` files, `cargo test` |";
    assert_eq!(folders_of(line), vec![PathBuf::from("scripts/")]);
    let names: Vec<&str> = quoted(line)
        .into_iter()
        .filter(|t| is_file_name(t))
        .collect();
    assert_eq!(names, ["test.sh"]);
    assert_eq!(
        links("see [the design](docs/design.md#stores) and [x](https://e.org)"),
        ["docs/design.md"]
    );
}

#[test]
fn the_crate_doc_reader_finds_public_modules_and_the_doc() {
    let lib = "//! - [`clock`]: time.\n//! - `server` (feature `server`).\n\npub mod clock;\n#[cfg(feature = \"server\")]\npub mod server;\nmod private;\n";
    assert_eq!(public_modules(lib), ["clock", "server"]);
    assert_eq!(
        crate_doc(lib),
        " - [`clock`]: time.\n - `server` (feature `server`)."
    );
}

/// Wire names the map may name that no file of the tree defines: Envoy's
/// RPCs and messages, and HTTP headers.
const WIRE_NAMES: &[&str] = &[
    "Accept",
    "ShouldRateLimit",
    "RateLimitService",
    "RateLimitConfig",
    "RateLimitQuotaService",
    "StreamRateLimitQuotas",
];

/// A type (or a type's item) in backticks: `GlobalShare`,
/// `Config::namespace`, `Stores::open`, `Client::watch_capacity`.
fn type_name(text: &str) -> Option<&str> {
    let name = text.split("::").next()?.split('(').next()?;
    let mut chars = name.chars();
    let first = chars.next()?;
    let second = chars.next()?;
    (first.is_ascii_uppercase()
        && second.is_ascii_lowercase()
        && name.chars().all(|c| c.is_ascii_alphanumeric()))
    .then_some(name)
}

/// `text` with `//` comments cut: the map's types must be in code.
fn code_of(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|line| line.split("//").next().unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Whether `word` stands alone somewhere in `text`.
fn mentions(text: &str, word: &str) -> bool {
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices(word).any(|(at, _)| {
        let before = text[..at].chars().next_back();
        let after = text[at + word.len()..].chars().next();
        !before.is_some_and(is_ident) && !after.is_some_and(is_ident)
    })
}

/// The names each keyword in `keywords` declares in `text`.
fn declared<'a>(text: &'a str, keywords: &[&str]) -> Vec<&'a str> {
    let mut names = Vec::new();
    for keyword in keywords {
        for (at, _) in text.match_indices(keyword) {
            let rest = &text[at + keyword.len()..];
            let name: &str = rest
                .split(|c: char| !c.is_ascii_alphanumeric() && c != '_')
                .next()
                .unwrap_or("");
            let starts_word = text[..at]
                .chars()
                .next_back()
                .is_none_or(|c| !c.is_ascii_alphanumeric() && c != '_');
            if starts_word && !name.is_empty() {
                names.push(name);
            }
        }
    }
    names
}

/// Every file under the paths a row names (folders whole), with its bare
/// names resolved in the row's folders.
fn row_files(line: &str) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let folders = folders_of(line);
    for text in quoted(line) {
        let path = if is_path(text) {
            root().join(text)
        } else if is_file_name(text) {
            match folders
                .iter()
                .map(|dir| root().join(dir).join(text))
                .find(|p| p.exists())
            {
                Some(path) => path,
                None => continue,
            }
        } else {
            continue;
        };
        if path.is_dir() {
            files_under(&path, &mut files);
        } else {
            files.push(path);
        }
    }
    files
}

#[test]
fn every_type_on_the_map_is_where_its_row_says() {
    let mut sources = Vec::new();
    files_under(&root().join("src"), &mut sources);
    let mut defined: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for file in sources
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
    {
        let code = code_of(file);
        for name in declared(&code, &["struct ", "enum ", "trait ", "type "]) {
            let relative = file.strip_prefix(root()).unwrap_or(file);
            defined
                .entry(name.to_owned())
                .or_default()
                .push(relative.display().to_string());
        }
    }
    let mut protos = Vec::new();
    files_under(&root().join("proto"), &mut protos);
    let wire: BTreeSet<String> = protos
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "proto"))
        .flat_map(|f| {
            let text = std::fs::read_to_string(f).unwrap_or_default();
            declared(&text, &["message ", "rpc ", "service ", "enum "])
                .into_iter()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .collect();
    let mut wrong = Vec::new();
    for (number, line) in map().lines().enumerate() {
        if !line.starts_with("| `src/") {
            continue;
        }
        let files = row_files(line);
        let code: Vec<String> = files.iter().map(|file| code_of(file)).collect();
        for name in quoted(line).into_iter().filter_map(type_name) {
            if wire.contains(name) || WIRE_NAMES.contains(&name) {
                continue;
            }
            let Some(homes) = defined.get(name) else {
                wrong.push(format!(
                    "ARCHITECTURE.md:{}: `{name}` is defined nowhere",
                    number + 1
                ));
                continue;
            };
            if !code.iter().any(|text| mentions(text, name)) {
                wrong.push(format!(
                    "ARCHITECTURE.md:{}: `{name}` is in {homes:?}, and no file of its row uses it",
                    number + 1
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "the map puts types where they are not:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_type_reader_takes_types_and_their_items_only() {
    assert_eq!(type_name("GlobalShare"), Some("GlobalShare"));
    assert_eq!(type_name("Stores::open"), Some("Stores"));
    assert_eq!(type_name("Client::watch_capacity"), Some("Client"));
    assert_eq!(type_name("CANCELLED"), None);
    assert_eq!(type_name("src/lib.rs"), None);
    assert_eq!(type_name("max_hold"), None);
    assert!(mentions("use x::GlobalShare;", "GlobalShare"));
    assert!(!mentions("GlobalShares::new()", "GlobalShare"));
    assert_eq!(
        declared(
            "pub struct A<T>; enum Bee { } structure",
            &["struct ", "enum "]
        ),
        ["A", "Bee"]
    );
}
