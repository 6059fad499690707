//! Logging for the example programs: to stderr (stdout is theirs to
//! print), coloured only when stderr is a terminal, filtered by `--log`.

use anyhow::Context;

/// Installs the subscriber with `filter` in tracing's syntax, e.g. `info`
/// or `throttle_layer=debug`.
///
/// # Errors
///
/// A filter that does not parse.
pub fn init(filter: &str) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .with_context(|| format!("invalid --log filter {filter:?}"))?;
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(filter)
        .init();
    Ok(())
}
