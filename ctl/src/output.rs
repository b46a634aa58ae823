//! How a command prints what it found: a table (or lines) for people, JSON or YAML for programs.

use serde::Serialize;

/// `-o`: the printed form.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Table,
    Json,
    Yaml,
}

impl Format {
    /// Whether the form is for programs (JSON or YAML), printed by [`Format::emit`].
    pub fn structured(self) -> bool {
        self != Format::Table
    }

    /// Prints `value` in this form; a table is the caller's to print.
    pub fn emit<T: Serialize>(self, value: &T) -> anyhow::Result<()> {
        match self {
            Format::Json => println!("{}", serde_json::to_string_pretty(value)?),
            Format::Yaml => print!("{}", serde_yaml_ng::to_string(value)?),
            Format::Table => anyhow::bail!("a table is printed by its command"),
        }
        Ok(())
    }
}
