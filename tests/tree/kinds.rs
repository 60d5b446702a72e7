//! Every kind of state the engine keeps is handled wherever it is written
//! twice: once in Rust, once in the Redis script's Lua port. The compiler
//! checks the Rust side's matches; this reads the rest. A new kind that
//! `src/engine/slot.rs` names (see CONTRIBUTING.md, "Adding an
//! algorithm") must be decoded by `decide.lua` and read back by the codec.

use std::path::Path;

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).expect(path)
}

/// Every `SlotKind` with its letter, as `SlotKind::letter` writes them.
fn kinds() -> Vec<(String, char)> {
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

#[test]
fn every_kind_of_state_is_decoded_by_the_script_and_the_codec() {
    let kinds = kinds();
    assert!(kinds.len() >= 9, "the kinds were not read: {kinds:?}");
    let script = read("src/store/redis/decide.lua");
    let codec = read("src/store/redis/codec.rs");
    let mut missing = Vec::new();
    for (name, letter) in &kinds {
        if !script.contains(&format!("kind == '{letter}' then")) {
            missing.push(format!("decide.lua decodes no `{letter}` ({name})"));
        }
        if !codec.contains(&format!("SlotKind::{name} =>")) {
            missing.push(format!("codec.rs reads back no {name}"));
        }
    }
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn every_kind_has_a_letter_of_its_own() {
    let mut letters: Vec<char> = kinds().into_iter().map(|(_, letter)| letter).collect();
    let count = letters.len();
    letters.sort_unstable();
    letters.dedup();
    assert_eq!(
        letters.len(),
        count,
        "two kinds share a letter: {letters:?}"
    );
}
