//! The library's modules import each other in one direction only
//! (ARCHITECTURE.md, "Floor plan"): no two top-level modules, and no two
//! files that are not each other's ancestors, reach each other, directly or
//! round a longer circle. A circle is two pieces that can only be read,
//! changed and tested together; the next capability would have to enter
//! through both. And the configuration never reaches the engine: the engine
//! decides on a compiled configuration, which must load without it; and the
//! service never reaches a wire type (`api`) or a face (`server`); and no
//! program's room (`server`, `throttle`, `inject`) reaches another's: what
//! they share is the process kit (`kit`).
//!
//! Imports are read from the source text: every path that starts with
//! `crate::`, `super::` or `self::` (in `use` trees too), comments and
//! literals left out. A path names the file of the longest module prefix
//! it has.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A module's path from the crate root: `["store", "copies"]`.
type Module = Vec<String>;

/// Top-level modules that must never import the other one: the
/// configuration loads without the engine, and the service knows no wire
/// (the faces and `api` translate to and from its domain types).
const FORBIDDEN: &[(&str, &str)] = &[
    ("config", "engine"),
    ("service", "api"),
    ("service", "server"),
    // No program's room imports another's: what they share is the kit.
    ("server", "throttle"),
    ("server", "inject"),
    ("throttle", "server"),
    ("throttle", "inject"),
    ("inject", "server"),
    ("inject", "throttle"),
];

struct Library {
    /// Every module that is a file, and that file (relative to `src/`).
    files: BTreeMap<Module, PathBuf>,
}

impl Library {
    fn read() -> Self {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files = BTreeMap::new();
        for file in rust_files(&src) {
            let relative = file.strip_prefix(&src).expect("under src/").to_path_buf();
            // The binaries are crates of their own.
            if relative.starts_with("bin") {
                continue;
            }
            let mut module: Module = relative
                .with_extension("")
                .iter()
                .map(|part| part.to_string_lossy().into_owned())
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            files.insert(module, relative);
        }
        Self { files }
    }

    /// Which file-modules each file-module names.
    fn edges(&self) -> BTreeMap<Module, BTreeSet<Module>> {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
        for (module, file) in &self.files {
            let text = std::fs::read_to_string(src.join(file)).expect("readable source");
            let named = edges.entry(module.clone()).or_default();
            for path in paths_in(&code_only(&text), module) {
                if let Some(target) = self.resolve(&path)
                    && target != *module
                {
                    named.insert(target);
                }
            }
        }
        edges
    }

    /// The file-module of the longest prefix of `path`.
    fn resolve(&self, path: &[String]) -> Option<Module> {
        (0..=path.len())
            .rev()
            .map(|len| path[..len].to_vec())
            .find(|prefix| self.files.contains_key(prefix))
    }

    fn file(&self, module: &Module) -> String {
        format!("src/{}", self.files[module].display())
    }
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("readable directory")
        .map(|entry| entry.expect("readable entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            found.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
    found
}

/// `text` with comments, string literals and character literals blanked.
fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            i += 2;
            while i + 1 < chars.len() && !(chars[i] == '*' && chars[i + 1] == '/') {
                i += 1;
            }
            i += 2;
            out.push(' ');
        } else if c == 'r' && matches!(next, Some('"' | '#')) && !ident_char(before(&chars, i)) {
            // A raw string: r"…" or r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                if j >= chars.len() {
                    break;
                }
                if chars[j] == '"' && (0..hashes).all(|k| chars.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                j += 1;
            }
            i = j;
            out.push_str("\"\"");
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), or a lifetime.
            if next == Some('\\') {
                i += 2;
                while i < chars.len() && chars[i] != '\'' {
                    i += 1;
                }
                i += 1;
                out.push_str("' '");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn before(chars: &[char], i: usize) -> char {
    if i == 0 { ' ' } else { chars[i - 1] }
}

fn ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Every module path named in `code` (of module `here`), `use` trees
/// expanded.
fn paths_in(code: &str, here: &Module) -> Vec<Module> {
    let chars: Vec<char> = code.chars().collect();
    let mut paths = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        if !ident_char(chars[i]) || ident_char(before(&chars, i)) {
            i += 1;
            continue;
        }
        let (word, end) = ident(&chars, i);
        let start: Option<Module> = match word.as_str() {
            "crate" => Some(Vec::new()),
            "self" => Some(here.clone()),
            "super" => Some(here[..here.len().saturating_sub(1)].to_vec()),
            _ => None,
        };
        match start {
            Some(start) if chars.get(end) == Some(&':') && chars.get(end + 1) == Some(&':') => {
                let (found, after) = tree(&chars, end + 2, start);
                paths.extend(found);
                i = after;
            }
            _ => i = end,
        }
    }
    paths
}

fn ident(chars: &[char], mut i: usize) -> (String, usize) {
    let start = i;
    while i < chars.len() && ident_char(chars[i]) {
        i += 1;
    }
    (chars[start..i].iter().collect(), i)
}

fn skip_space(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() && chars[i].is_whitespace() {
        i += 1;
    }
    i
}

/// The paths of a use tree (or a plain path) at `i` under `prefix`, and
/// where it ends.
fn tree(chars: &[char], i: usize, mut prefix: Module) -> (Vec<Module>, usize) {
    let mut i = skip_space(chars, i);
    loop {
        if chars.get(i) == Some(&'{') {
            let mut found = Vec::new();
            i += 1;
            loop {
                i = skip_space(chars, i);
                match chars.get(i) {
                    None => return (found, i),
                    Some('}') => return (found, i + 1),
                    Some(',') => i += 1,
                    Some(c) if ident_char(*c) => {
                        let (paths, after) = tree(chars, i, prefix.clone());
                        found.extend(paths);
                        i = after;
                    }
                    Some(_) => i += 1,
                }
            }
        }
        if !chars.get(i).is_some_and(|c| ident_char(*c)) {
            return (vec![prefix], i);
        }
        let (word, end) = ident(chars, i);
        match word.as_str() {
            "super" => {
                prefix.pop();
            }
            "self" => {}
            _ => prefix.push(word),
        }
        i = end;
        if chars.get(i) == Some(&':') && chars.get(i + 1) == Some(&':') {
            i = skip_space(chars, i + 2);
        } else {
            return (vec![prefix], i);
        }
    }
}

fn related(a: &Module, b: &Module) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// The circles of `graph`: its strongly connected parts of more than one
/// node (Tarjan's algorithm).
fn circles<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    struct Walk<'g, N> {
        graph: &'g BTreeMap<N, BTreeSet<N>>,
        index: BTreeMap<N, usize>,
        low: BTreeMap<N, usize>,
        stack: Vec<N>,
        found: Vec<Vec<N>>,
    }
    impl<N: Ord + Clone> Walk<'_, N> {
        fn visit(&mut self, node: &N) {
            let n = self.index.len();
            self.index.insert(node.clone(), n);
            self.low.insert(node.clone(), n);
            self.stack.push(node.clone());
            for next in self.graph.get(node).into_iter().flatten() {
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[node].min(self.low[next]);
                    self.low.insert(node.clone(), low);
                } else if self.stack.contains(next) {
                    let low = self.low[node].min(self.index[next]);
                    self.low.insert(node.clone(), low);
                }
            }
            if self.low[node] == self.index[node] {
                let mut part = Vec::new();
                while let Some(top) = self.stack.pop() {
                    let done = top == *node;
                    part.push(top);
                    if done {
                        break;
                    }
                }
                if part.len() > 1 {
                    part.sort();
                    self.found.push(part);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node) {
            walk.visit(node);
        }
    }
    walk.found
}

#[test]
fn no_two_top_level_modules_import_each_other() {
    let library = Library::read();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut forbidden = Vec::new();
    for (from, targets) in library.edges() {
        let Some(top) = from.first() else { continue };
        for target in targets {
            let Some(other) = target.first() else {
                continue;
            };
            if other != top {
                graph.entry(top.clone()).or_default().insert(other.clone());
                if FORBIDDEN.contains(&(top.as_str(), other.as_str())) {
                    forbidden.push(format!("{} names crate::{other}", library.file(&from)));
                }
            }
        }
    }
    assert!(
        forbidden.is_empty(),
        "imports across a line the layers keep:\n{}",
        forbidden.join("\n")
    );
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "top-level modules in a circle of imports: {found:?}\n(edges: {graph:#?})"
    );
    // The check sees what it must: the service builds on the engine.
    assert!(graph["service"].contains("engine"), "{graph:#?}");
}

/// The descent of the layers, top first: a module may import those below
/// it, never one above (the binaries, above them all, are crates of their
/// own).
const DESCENT: &[&str] = &[
    "server", "layer", "client", "api", "service", "limiter", "store", "engine", "config",
];

#[test]
fn no_layer_imports_one_above_it() {
    let library = Library::read();
    let rank = |module: &str| DESCENT.iter().position(|layer| *layer == module);
    let mut upward = Vec::new();
    for (from, targets) in library.edges() {
        let Some(from_rank) = from.first().and_then(|top| rank(top)) else {
            continue;
        };
        for target in targets {
            if let Some(to_rank) = target.first().and_then(|top| rank(top))
                && to_rank < from_rank
            {
                upward.push(format!(
                    "{} names crate::{}",
                    library.file(&from),
                    target.join("::")
                ));
            }
        }
    }
    assert!(
        upward.is_empty(),
        "imports up the descent {DESCENT:?}:\n{}",
        upward.join("\n")
    );
}

#[test]
fn no_two_files_import_each_other() {
    let library = Library::read();
    let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (from, targets) in library.edges() {
        let unrelated: Vec<Module> = targets
            .into_iter()
            .filter(|to| !related(&from, to))
            .collect();
        graph.entry(from).or_default().extend(unrelated);
    }
    let found: Vec<Vec<String>> = circles(&graph)
        .iter()
        .map(|part| part.iter().map(|module| library.file(module)).collect())
        .collect();
    assert!(found.is_empty(), "files in a circle of imports: {found:#?}");
}

#[test]
fn use_trees_and_relative_paths_are_read() {
    let here: Module = vec!["server".into(), "rls".into(), "wire".into()];
    let code = code_only(
        "use crate::{config::Unit, limiter::{self, LimitOverride}};\n\
         use super::headers::{self, header}; // crate::engine\n\
         let s = \"crate::store\"; let c = '\"'; fn f<'a>() { self::g(); super::super::api::h() }",
    );
    let names: BTreeSet<String> = paths_in(&code, &here)
        .iter()
        .map(|path| path.join("::"))
        .collect();
    let expected: BTreeSet<String> = [
        "config::Unit",
        "limiter",
        "limiter::LimitOverride",
        "server::rls::headers",
        "server::rls::headers::header",
        "server::rls::wire::g",
        "server::api::h",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(names, expected);
}
