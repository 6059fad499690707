//! [`Binaries`]: the `throttle-central` and `axum-node` a live case runs.

use std::path::PathBuf;

/// The binaries a live case runs.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `throttle-central`.
    pub central: String,
    /// `axum-node`.
    pub node: String,
}

impl Binaries {
    /// The binaries of the build the running program belongs to (`cargo
    /// test --workspace` builds both), or `None` where they are missing.
    pub fn of_this_build() -> Option<Self> {
        let exe = std::env::current_exe().ok()?;
        let mut dir = exe.parent()?.to_path_buf();
        if dir.ends_with("deps") {
            dir.pop();
        }
        let find = |name: &str| -> Option<String> {
            let path: PathBuf = dir.join(name);
            path.exists().then(|| path.display().to_string())
        };
        Some(Self {
            central: find("throttle-central")?,
            node: find("axum-node")?,
        })
    }
}
