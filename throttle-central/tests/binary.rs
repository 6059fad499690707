//! The `throttle-central` program itself: it starts, says where it listens,
//! and shuts down cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn starts_logs_and_stops_on_sigterm() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_throttle-central"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--slot-ms",
            "200",
        ])
        .env("THROTTLE_CENTRAL_POLICY", "classic")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs");
    let stderr = child.stderr.take().expect("piped");
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        let Some(Ok(line)) = lines.next() else { break };
        let done = line.contains("monitor API listening");
        seen.push(line);
        if done {
            break;
        }
    }
    let log = seen.join("\n");
    assert!(log.contains("policy=classic"), "env var read: {log}");
    assert!(!log.contains('\x1b'), "no colours in a pipe: {log}");
    assert!(!log.contains("Some("), "addresses as text: {log}");
    assert!(log.contains("nobody is limited"), "{log}");
    assert!(log.contains("central node listening for nodes"), "{log}");
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let exit = child.wait().expect("it exits");
    assert!(exit.success(), "clean exit on SIGTERM: {exit:?}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|l| l.contains("shutting down")), "{rest:?}");
}

#[test]
fn refuses_bad_flags_and_bad_limits() {
    let out = Command::new(env!("CARGO_BIN_EXE_throttle-central"))
        .args([
            "--slot-ms",
            "0",
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
        ])
        .output()
        .expect("runs");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("slot"),
        "{out:?}"
    );
    let dir = std::env::temp_dir().join(format!("throttle-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("bad.toml");
    std::fs::write(
        &path,
        "[[limit]]\nservice = \"front\"\nuser = \"u\"\nper_second = { requests = -1 }\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_throttle-central"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--limits",
        ])
        .arg(&path)
        .output()
        .expect("runs");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line 1") && err.contains("requests"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    // Limits in etcd: the key's form, and the endpoints from --etcd.
    for (limits, says) in [
        ("etcd://10.0.0.1/throttle", "etcd:///KEY"),
        ("etcd:///throttle/limits", "needs --etcd"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_throttle-central"))
            .args(["--listen", "127.0.0.1:0", "--http", "127.0.0.1:0"])
            .args(["--limits", limits])
            .output()
            .expect("runs");
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{limits}: {err}");
    }
}
