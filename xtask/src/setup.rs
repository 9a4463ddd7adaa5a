//! Toolchain and package set-up (being built).

pub fn setup() -> anyhow::Result<()> {
    super::tracer::build()?;
    anyhow::bail!("setup is not built yet")
}

pub fn run(_args: &[String]) -> anyhow::Result<()> {
    anyhow::bail!("run is not built yet")
}
