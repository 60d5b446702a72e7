//! Directories, including a Kubernetes ConfigMap mount.

use super::helpers::*;

// ---------------------------------------------------------------------------
// 5. Directories
// ---------------------------------------------------------------------------

fn names(loaded: &Loaded) -> Vec<String> {
    let mut names: Vec<String> = loaded.config.namespaces().map(|n| n.name.clone()).collect();
    names.sort();
    names
}

#[test]
fn directory_loads_yaml_and_yml_only() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(&d.join("a.yaml"), "domain: a\n");
    write(&d.join("b.yml"), "domain: b\n");
    // Ignored: other extensions, hidden names, subdirectories, and a
    // directory that looks like a file.
    write(&d.join("c.json"), "domain: c\n");
    write(&d.join("d.yaml.bak"), "domain: d\n");
    write(&d.join("README.md"), "not yaml: [\n");
    write(&d.join(".hidden.yaml"), "domain: hidden\n");
    write(&d.join("sub/e.yaml"), "domain: e\n");
    std::fs::create_dir_all(d.join("f.yaml")).unwrap();
    let loaded = load_path(d).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names(&loaded), ["a", "b"]);
    let files: Vec<&PathBuf> = loaded.normalized.iter().map(|(f, _)| f).collect();
    assert_eq!(files, [&d.join("a.yaml"), &d.join("b.yml")]);
    assert_eq!(
        loaded.config.namespace("b").unwrap().source,
        d.join("b.yml")
    );
}

#[test]
fn directory_with_duplicate_domains_names_both_files() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(&d.join("first.yaml"), "domain: shop\n");
    write(&d.join("second.yaml"), "# again\ndomain:   shop\n");
    let errors = load_path(d).unwrap_err().0;
    assert_eq!(errors.len(), 1, "{errors:?}");
    let error = &errors[0];
    let shown = error.to_string();
    assert!(shown.contains("first.yaml"), "{shown}");
    assert!(shown.contains("second.yaml"), "{shown}");
    assert!(shown.contains("`shop`"), "{shown}");
    assert_eq!(error.file, d.join("second.yaml"));
    assert_eq!((error.line, error.column), (2, 11));
}

#[test]
fn empty_directory_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let errors = load_path(dir.path()).unwrap_err().0;
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0].file, dir.path());
    assert!(errors[0].message.contains("*.yaml"), "{errors:?}");
    // Only ignored files: still empty.
    write(&dir.path().join("notes.txt"), "domain: a\n");
    write(&dir.path().join(".x.yaml"), "domain: a\n");
    assert!(load_path(dir.path()).is_err());
}

#[test]
fn directory_with_one_bad_file_is_rejected_whole() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    write(&d.join("good.yaml"), "domain: good\n");
    write(
        &d.join("bad1.yaml"),
        "domain: bad1\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    write(&d.join("bad2.yaml"), "domain: bad2\nnope: 1\n");
    let errors = load_path(d).unwrap_err().0;
    let places: Vec<(PathBuf, u64, u64)> = errors
        .iter()
        .map(|e| (e.file.clone(), e.line, e.column))
        .collect();
    assert_eq!(
        places,
        vec![(d.join("bad1.yaml"), 4, 24), (d.join("bad2.yaml"), 2, 1)]
    );
}

#[cfg(unix)]
#[test]
fn kubernetes_configmap_layout_loads_once() {
    use std::os::unix::fs::symlink;
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let data = d.join("..2026_01_01_00_00_00.000000000");
    write(&data.join("shop.yaml"), "domain: shop\n");
    write(&data.join("edge.yml"), "domain: edge\n");
    symlink("..2026_01_01_00_00_00.000000000", d.join("..data")).unwrap();
    symlink("..data/shop.yaml", d.join("shop.yaml")).unwrap();
    symlink("..data/edge.yml", d.join("edge.yml")).unwrap();
    let loaded = load_path(d).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(names(&loaded), ["edge", "shop"]);
    assert_eq!(loaded.normalized.len(), 2);
    assert_eq!(
        loaded.config.namespace("shop").unwrap().source,
        d.join("shop.yaml")
    );
    // The mount point itself may be a symlink too.
    let link = tempfile::tempdir().unwrap();
    let mount = link.path().join("config");
    symlink(d, &mount).unwrap();
    assert_eq!(names(&load_path(&mount).unwrap()), ["edge", "shop"]);
}
