//! Errors about the command line in one line that names the input at fault — the flag, or the
//! environment variable when that is where the value came from — and says what to do.

use std::ffi::OsString;
use std::time::Duration;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use vvm::config::ConfigError;

/// The spellings a boolean flag's environment variable accepts (also on the command line as
/// `--flag=VALUE`), as systemd and most tools read them.
pub const BOOLEAN_SPELLINGS: &str = "1/0, true/false, yes/no, on/off";

/// One line for a command-line error of clap's: its first line without the `error: ` prefix,
/// rewritten to name the environment variable when the bad value came from one.
pub fn explain(error: &clap::Error, command: &clap::Command, argv: &[OsString]) -> String {
    let text = error.to_string();
    let first = text
        .lines()
        .next()
        .unwrap_or("bad arguments")
        .trim_start_matches("error: ")
        .to_owned();
    if !matches!(
        error.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return first;
    }
    let Some(ContextValue::String(flag)) = error.get(ContextKind::InvalidArg) else {
        return first;
    };
    // `--lease <LEASE>` → `lease`.
    let long = flag
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .trim_start_matches('-');
    let Some(arg) = find_arg(command, long) else {
        return first;
    };
    let Some(variable) = from_environment(arg, argv) else {
        return first;
    };
    let value = error
        .get(ContextKind::InvalidValue)
        .map(ToString::to_string)
        .unwrap_or_default();
    let reason = first
        .split_once("': ")
        .map(|(_, reason)| format!(": {reason}"))
        .unwrap_or_default();
    let expected = if matches!(arg.get_action(), clap::ArgAction::SetTrue) {
        format!(" (expected one of {BOOLEAN_SPELLINGS})")
    } else {
        String::new()
    };
    format!(
        "invalid value '{value}' in the environment variable {variable} (for --{long}){reason}{expected}; \
         fix or unset {variable}"
    )
}

/// The environment variable `arg`'s value came from: `None` when the flag is on the command
/// line (which wins) or its variable is not set.
fn from_environment(arg: &clap::Arg, argv: &[OsString]) -> Option<String> {
    let long = arg.get_long()?;
    let on_command_line = argv.iter().skip(1).any(|word| {
        let word = word.to_string_lossy();
        word == format!("--{long}")
            || word.starts_with(&format!("--{long}="))
            || arg
                .get_short()
                .is_some_and(|short| is_short_use(&word, short))
    });
    let variable = arg.get_env()?;
    if on_command_line || std::env::var_os(variable).is_none() {
        return None;
    }
    Some(variable.to_string_lossy().into_owned())
}

/// How to name the input `--long` in a message: the flag, or `VARIABLE (for --long)` when the
/// value came from the environment.
pub fn source(command: &clap::Command, argv: &[OsString], long: &str) -> String {
    match find_arg(command, long).and_then(|arg| from_environment(arg, argv)) {
        Some(variable) => format!("{variable} (for --{long})"),
        None => format!("--{long}"),
    }
}

/// `word` is a cluster of short flags that uses `short` (`-w`, `-wj`, `-lVALUE` for the last).
fn is_short_use(word: &str, short: char) -> bool {
    word.strip_prefix('-')
        .is_some_and(|rest| !rest.starts_with('-') && rest.starts_with(short))
}

/// The argument whose long name is `long` in `command` or, depth first, its subcommands.
fn find_arg<'a>(command: &'a clap::Command, long: &str) -> Option<&'a clap::Arg> {
    command
        .get_arguments()
        .find(|arg| arg.get_long() == Some(long))
        .or_else(|| {
            command
                .get_subcommands()
                .find_map(|sub| find_arg(sub, long))
        })
}

/// One line for a configuration value the library refused, naming the flag it came from.
///
/// `name` turns a long flag name into the way the message names it (see [`source`]).
pub fn config_error(error: &ConfigError, name: impl Fn(&str) -> String) -> String {
    let secs = |d: &Duration| humantime::format_duration(*d).to_string();
    match error {
        ConfigError::LeaseTooShort { lease, min } => format!(
            "{}: {} is shorter than the minimum of {}; give a lease between {} and 24h",
            name("lease"),
            secs(lease),
            secs(min),
            secs(min)
        ),
        ConfigError::LeaseTooLong { lease, max } => format!(
            "{}: {} is longer than the maximum of {}; give a lease between 2s and {}",
            name("lease"),
            secs(lease),
            secs(max),
            secs(max)
        ),
        ConfigError::DerivedIntervalZero { .. } | ConfigError::StoreTimeoutOutOfRange { .. } => {
            format!("{}: {error}; give a longer lease", name("lease"))
        }
        ConfigError::NoSlots | ConfigError::TooManySlots { .. } => format!(
            "{}: {error}; give a number between 1 and {}",
            name("slots"),
            vvm_core::SLOTS_MAX
        ),
        ConfigError::EmptyAddress
        | ConfigError::AddressTooLong { .. }
        | ConfigError::AddressHasControlCharacter => {
            format!(
                "{}: {error}; give a printable name, e.g. host:port",
                name("address")
            )
        }
        ConfigError::AcquisitionTooLong { .. } => format!(
            "{}: {error}; give a duration up to 7 days, 0 to try once, or `forever`",
            name("acquire")
        ),
        ConfigError::RoundIntervalZero => format!("{}: {error}; give e.g. 1s", name("round")),
        _ => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_flag_clusters() {
        assert!(is_short_use("-w", 'w'));
        assert!(is_short_use("-l4s", 'l'));
        assert!(!is_short_use("--watch", 'w'));
        assert!(!is_short_use("-x", 'w'));
    }

    #[test]
    fn config_errors_name_their_flag() {
        let long = ConfigError::LeaseTooLong {
            lease: Duration::from_secs(30 * 86_400),
            max: Duration::from_secs(86_400),
        };
        let flag = |long: &str| format!("--{long}");
        let text = config_error(&long, flag);
        assert!(text.starts_with("--lease: 30days is longer"), "{text}");
        assert!(text.contains("maximum of 1day"), "{text}");
        assert!(config_error(&ConfigError::NoSlots, flag).starts_with("--slots:"));
        assert!(config_error(&ConfigError::EmptyAddress, flag).starts_with("--address:"));
    }
}
