//! `docs/commands.md` from the command table.
pub fn render() -> String {
    String::new()
}
