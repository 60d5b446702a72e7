//! The `charon check` binary.

use super::helpers::*;

// ---------------------------------------------------------------------------
// 6. charon check
// ---------------------------------------------------------------------------

#[test]
fn check_prints_the_normalized_file_and_notes() {
    let file = fixture("charon/normalize.yaml");
    let out = charon(&[&file]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains(&format!("# {}", file.display())),
        "{stdout}"
    );
    assert!(stdout.contains("domain: norm"), "{stdout}");
    assert!(stdout.contains("active: 20s"), "{stdout}");
    assert!(stdout.contains("domain_limit: 10"), "{stdout}");
    assert!(!stdout.contains("active: 0s"), "{stdout}");
    for (line, column) in [
        (12, 11),
        (13, 11),
        (14, 11),
        (18, 15),
        (21, 21),
        (23, 23),
        (25, 30),
    ] {
        let place = format!("{}:{line}:{column}: ", file.display());
        assert!(
            stderr.contains(&place),
            "stderr should have {place}:\n{stderr}"
        );
    }
    // The YAML printed (without the `# file` line) is the normalized file.
    let loaded = normalize_fixture();
    assert!(stdout.contains(&loaded.normalized[0].1));
}

#[test]
fn check_of_an_envoy_file_is_quiet_on_stderr() {
    let file = fixture("envoy/mongo_cps.yaml");
    let out = charon(&[&file]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("domain: mongo_cps"));
    assert_eq!(text(&out.stderr), "");
}

#[test]
fn check_of_a_bad_file_fails_with_locations() {
    let file = fixture("charon/bad.yaml");
    let out = charon(&[&file]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!(
            "{}:5:13: invalid rate limit unit `fortnight`",
            file.display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "{}:8:15: resource `missing` is not defined",
            file.display()
        )),
        "{stderr}"
    );
    assert!(
        !text(&out.stdout).contains("domain:"),
        "nothing is printed as loaded"
    );
}

#[test]
fn check_of_a_directory() {
    let dir = fixture("envoy");
    let out = charon(&[&dir]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for (file, domain) in ENVOY_FIXTURES {
        assert!(
            stdout.contains(&format!("# {}", dir.join(file).display())),
            "{stdout}"
        );
        assert!(stdout.contains(&format!("domain: {domain}\n")), "{stdout}");
    }

    // A directory with a bad file fails.
    let temp = tempfile::tempdir().unwrap();
    write(&temp.path().join("ok.yaml"), "domain: ok\n");
    write(&temp.path().join("dup.yaml"), "domain: ok\n");
    let out = charon(&[temp.path()]);
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    // Files load in name order: dup.yaml first, so ok.yaml is the duplicate.
    assert!(stderr.contains("dup.yaml"), "{stderr}");
    assert!(stderr.contains("ok.yaml:1:9: "), "{stderr}");
}

#[test]
fn check_of_a_missing_path_fails() {
    let temp = tempfile::tempdir().unwrap();
    let out = charon(&[&temp.path().join("nope.yaml")]);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("nope.yaml"));
    let out = charon(&[temp.path()]);
    assert!(!out.status.success(), "an empty directory is an error");
}
