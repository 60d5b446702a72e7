//! The tree keeps its own rules: modules import each other in one direction
//! (`imports`), and ARCHITECTURE.md's map names every file under `src/` and
//! nothing that does not exist (`map`).

mod imports;
mod map;
