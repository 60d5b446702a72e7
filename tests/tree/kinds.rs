//! A kind of limit lives in a few places, and the tree says which: the one
//! list in `src/engine/item.rs` (`kinds!`), the algorithm's own file under
//! `src/engine/`, its Redis wire in `src/store/redis/kinds/<kind>.rs` beside
//! its Lua chunk `<kind>.lua`, and `src/limiter/batch.rs`, where the
//! configuration becomes items (CONTRIBUTING.md, "Adding an algorithm").
//! The compiler checks the Rust side's matches, which the list generates;
//! this reads the rest: every kind of state is decoded by a Lua chunk and
//! read back by the codec, no Lua file outgrows the size rule, and no other
//! module names a kind's item.

use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).expect(path)
}

/// Every `SlotKind` with its letter, as `SlotKind::letter` writes them.
fn state_kinds() -> Vec<(String, char)> {
    let slot = read("src/engine/slot.rs");
    let mut kinds = Vec::new();
    for line in slot.lines() {
        let line = line.trim();
        let Some(rest) = line.strip_prefix("SlotKind::") else {
            continue;
        };
        let Some((name, letter)) = rest.split_once(" => b'") else {
            continue;
        };
        if let Some(letter) = letter.chars().next() {
            kinds.push((name.to_owned(), letter));
        }
    }
    kinds
}

/// The kinds of item, as the list in `src/engine/item.rs` names them:
/// `(variant, item type)`.
fn item_kinds() -> Vec<(String, String)> {
    let item = read("src/engine/item.rs");
    let list = item
        .split_once("(@list $rule:ident")
        .and_then(|(_, rest)| rest.split_once('['))
        .and_then(|(_, rest)| rest.split_once(']'))
        .map(|(list, _)| list)
        .expect("the list of kinds in src/engine/item.rs");
    list.split(',')
        .filter_map(|entry| {
            let (variant, rest) = entry.trim().split_once('(')?;
            let ty = rest.split(['<', ')']).next()?;
            Some((variant.to_owned(), ty.to_owned()))
        })
        .collect()
}

/// `SlidingLog` as `sliding_log`, the name of its files.
fn snake(name: &str) -> String {
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_uppercase() && i > 0 {
            out.push('_');
        }
        out.extend(c.to_lowercase());
    }
    out
}

fn files(dir: &Path, extension: &str, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable directory") {
        let path = entry.expect("readable entry").path();
        if path.is_dir() {
            files(&path, extension, found);
        } else if path.extension().is_some_and(|ext| ext == extension) {
            found.push(path);
        }
    }
}

fn relative(path: &Path) -> String {
    path.strip_prefix(root())
        .expect("under the root")
        .display()
        .to_string()
}

#[test]
fn every_kind_of_state_is_decoded_by_a_chunk_and_the_codec() {
    let kinds = state_kinds();
    assert!(kinds.len() >= 9, "the kinds were not read: {kinds:?}");
    let mut chunks = Vec::new();
    files(&root().join("src/store/redis/kinds"), "lua", &mut chunks);
    let script: String = chunks
        .iter()
        .map(|path| std::fs::read_to_string(path).expect("readable chunk"))
        .collect();
    let codec = read("src/store/redis/codec.rs");
    let mut missing = Vec::new();
    for (name, letter) in &kinds {
        if !script.contains(&format!("DECODE.{letter} =")) {
            missing.push(format!("no chunk decodes `{letter}` ({name})"));
        }
        if !script.contains(&format!("ENCODE.{letter} =")) {
            missing.push(format!("no chunk writes `{letter}` ({name})"));
        }
        if !codec.contains(&format!("SlotKind::{name} =>")) {
            missing.push(format!("codec.rs reads back no {name}"));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn every_kind_has_a_letter_of_its_own() {
    let mut letters: Vec<char> = state_kinds()
        .into_iter()
        .map(|(_, letter)| letter)
        .collect();
    let count = letters.len();
    letters.sort_unstable();
    letters.dedup();
    assert_eq!(
        letters.len(),
        count,
        "two kinds share a letter: {letters:?}"
    );
}

#[test]
fn every_kind_of_item_has_its_wire_and_its_chunk_side_by_side() {
    let kinds = item_kinds();
    assert!(kinds.len() >= 9, "the list was not read: {kinds:?}");
    let mut missing = Vec::new();
    for (variant, _) in &kinds {
        let file = snake(variant);
        let wire = format!("src/store/redis/kinds/{file}.rs");
        let chunk = format!("src/store/redis/kinds/{file}.lua");
        if !root().join(&wire).exists() {
            missing.push(format!("{variant}: no {wire}"));
        }
        match std::fs::read_to_string(root().join(&chunk)) {
            Ok(text) if text.contains("ITEM.") => {}
            Ok(_) => missing.push(format!("{variant}: {chunk} registers no ITEM")),
            Err(_) => missing.push(format!("{variant}: no {chunk}")),
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn no_lua_file_is_over_500_lines() {
    let mut scripts = Vec::new();
    files(&root().join("src"), "lua", &mut scripts);
    assert!(scripts.len() >= 10, "the scripts were not found");
    let long: Vec<String> = scripts
        .iter()
        .filter_map(|path| {
            let lines = std::fs::read_to_string(path).ok()?.lines().count();
            (lines > 500).then(|| format!("{} has {lines} lines", relative(path)))
        })
        .collect();
    assert!(long.is_empty(), "{}", long.join("\n"));
}

/// Where a kind's item may be named (`Item::Window`, `WindowItem`), beyond
/// its own files: the list and its re-export, the limiter's batches, and
/// the few modules that build one kind on purpose.
fn allowed(variant: &str, file: &str) -> bool {
    let own = snake(variant);
    let shared = ["src/engine/item.rs", "src/limiter/batch.rs"];
    shared.contains(&file)
        || file == format!("src/engine/{own}.rs")
        || file.starts_with(&format!("src/engine/{own}/"))
        || file == format!("src/store/redis/kinds/{own}.rs")
        // Reservations on cost budgets are cost items by definition.
        || (variant == "Cost" && file == "src/limiter/cost.rs")
        // `charon simulate` plays burst tiers.
        || (variant == "Tiers" && file == "src/simulate/mod.rs")
}

#[test]
fn a_kind_is_named_only_where_it_is_allowed() {
    let kinds = item_kinds();
    let mut sources = Vec::new();
    files(&root().join("src"), "rs", &mut sources);
    let mut stray = Vec::new();
    for path in &sources {
        let name = relative(path);
        if name.ends_with("/tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(path).expect("readable file");
        // Unit tests at the end of a file build whatever they test.
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        for (variant, ty) in &kinds {
            let named = code.lines().any(|line| {
                let line = line.split("//").next().unwrap_or("");
                line.contains(&format!("Item::{variant}(")) || contains_word(line, ty)
            });
            if named && !allowed(variant, &name) {
                stray.push(format!("{name} names the kind {variant}"));
            }
        }
    }
    assert!(stray.is_empty(), "{}", stray.join("\n"));
}

fn contains_word(line: &str, word: &str) -> bool {
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + word.len()..].chars().next();
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
            && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// The measure of a kind's cost to a contributor: the source files that
/// name it. `SlidingLog` is the witness (a name no other word contains):
/// the configuration's enum and its checks, the list, its engine file, the
/// limiter's batches and its Redis wire.
#[test]
fn a_kind_is_named_in_at_most_six_files() {
    let mut sources = Vec::new();
    files(&root().join("src"), "rs", &mut sources);
    let naming: Vec<String> = sources
        .iter()
        .filter(|path| !relative(path).ends_with("/tests.rs"))
        .filter(|path| {
            let text = std::fs::read_to_string(path).expect("readable file");
            let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
            code.contains("SlidingLog")
        })
        .map(|path| relative(path))
        .collect();
    assert!(naming.len() >= 4, "the kind was not found: {naming:?}");
    assert!(
        naming.len() <= 6,
        "SlidingLog is named in {} files: {naming:#?}",
        naming.len()
    );
}
