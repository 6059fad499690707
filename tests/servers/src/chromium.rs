//! [`Chromium`]: headless Chromium from `PATH`, run once per page, for
//! the tests that look at what a page draws.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::{TempDir, available};

/// Headless `chromium` with a fresh profile in a temporary directory.
#[derive(Debug)]
pub struct Chromium {
    profile: TempDir,
}

impl Chromium {
    /// One, or `None` (skipped) if the binary is missing.
    pub fn start(test: &str) -> Option<Self> {
        available("chromium", test).then(|| Self {
            profile: TempDir::new("chromium"),
        })
    }

    /// The flags of every run: headless, no sandbox (tests may run as
    /// root), nothing fetched from the network but the page's own origin.
    fn command(&self, settle: Duration) -> Command {
        let mut c = Command::new("chromium");
        c.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", self.profile.path().display()))
        // Scripts run this long in the page's own (virtual) time; it
        // stands still while a request is out, so the page's fetches
        // complete whatever the machine's load.
        .arg(format!("--virtual-time-budget={}", settle.as_millis()));
        c
    }

    /// The page's DOM, serialised, after its scripts ran for `settle`.
    ///
    /// # Panics
    ///
    /// When Chromium does not run or fails.
    pub fn dom(&self, url: &str, settle: Duration) -> String {
        let out = self
            .command(settle)
            .arg("--dump-dom")
            .arg(url)
            .output()
            .expect("chromium runs");
        assert!(out.status.success(), "chromium: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Saves a PNG of the page, `width` x `height`, to `path`, after its
    /// scripts ran for `settle`.
    ///
    /// # Panics
    ///
    /// When Chromium does not run or writes no file.
    pub fn screenshot(&self, url: &str, settle: Duration, size: (u32, u32), path: &Path) {
        let out = self
            .command(settle)
            .arg(format!("--window-size={},{}", size.0, size.1))
            .arg(format!("--screenshot={}", path.display()))
            .arg(url)
            .output()
            .expect("chromium runs");
        assert!(
            out.status.success() && path.is_file(),
            "chromium screenshot: {out:?}"
        );
    }
}
