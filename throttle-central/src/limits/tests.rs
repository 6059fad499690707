//! Limits read from a file: reloads, edits put back, empty files.

use throttle_test_servers::TempDir;

use super::*;

/// Two rules of service `front`.
const GOOD: &str = "[[limit]]\nservice = \"front\"\nuser = \"alice\"\n\
                    per_second = { requests = 100 }\n\n\
                    [[limit]]\nservice = \"front\"\nuser = \"bob\"\n\
                    per_second = { requests = 2.5 }\n";

/// A limits file holding [`GOOD`], in a directory of its own removed
/// when the first value is dropped, and that file opened.
fn good_file(what: &str) -> (TempDir, std::path::PathBuf, FileLimits) {
    let dir = TempDir::new(what);
    let path = dir.path().join("limits.toml");
    std::fs::write(&path, GOOD).unwrap();
    let file = FileLimits::open(&path).unwrap();
    (dir, path, file)
}

#[test]
fn file_reload_keeps_last_good_limits() {
    let (_dir, path, file) = good_file("limits");
    assert_eq!(file.list_limits("front").len(), 2);
    assert!(!file.reload().unwrap(), "unchanged file is not a change");

    std::fs::write(&path, "[[limit]]\nbroken").unwrap();
    assert!(file.reload().is_err());
    assert!(
        !file.reload().unwrap(),
        "the same broken file is reported once"
    );
    assert_eq!(file.list_limits("front").len(), 2);
    assert!(file.last_error().unwrap().contains("line"));

    std::fs::write(&path, "").unwrap();
    assert!(
        !file.poll().unwrap(),
        "a changed file waits for a second read"
    );
    std::fs::write(
        &path,
        "[[limit]]\nservice = \"s\"\nuser = \"u\"\nper_second = { r = 1 }\n",
    )
    .unwrap();
    assert!(
        !file.poll().unwrap(),
        "the truncated version was never applied"
    );
    assert_eq!(file.list_limits("front").len(), 2);
    assert!(file.poll().unwrap());
    assert!(!file.poll().unwrap());
    assert_eq!(file.services(), vec!["s".to_string()]);
    assert_eq!(file.last_error(), None);
}

#[test]
fn a_file_put_back_unchanged_clears_the_error_of_its_absence() {
    let (_dir, path, file) = good_file("back");
    std::fs::remove_file(&path).unwrap();
    assert!(file.poll().is_err());
    assert!(file.last_error().is_some(), "the absence is reported");
    std::fs::write(&path, GOOD).unwrap();
    assert!(!file.poll().unwrap(), "nothing changed");
    assert_eq!(file.last_error(), None, "and nothing is wrong any more");
    // A broken edit stays reported while it stays.
    std::fs::write(&path, "[[limit]]\nbroken").unwrap();
    assert!(file.reload().is_err());
    assert!(!file.poll().unwrap());
    assert!(file.last_error().is_some());
}

#[test]
fn an_empty_file_keeps_the_limits_and_one_without_entries_removes_them() {
    let dir = std::env::temp_dir().join(format!("throttle-limits-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("limits.toml");
    std::fs::write(&path, GOOD).unwrap();
    let file = FileLimits::open(&path).unwrap();
    std::fs::write(&path, "").unwrap();
    assert!(matches!(file.reload(), Err(LimitsError::Empty { .. })));
    assert_eq!(file.list_limits("front").len(), 2);
    assert!(file.last_error().unwrap().contains("empty"));
    std::fs::write(&path, "# nobody is limited\n").unwrap();
    assert!(file.reload().unwrap());
    assert!(file.services().is_empty());
    assert_eq!(file.last_error(), None);
    std::fs::remove_dir_all(&dir).unwrap();
}
