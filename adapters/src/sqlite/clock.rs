//! The clock SQLite records expire by: the host's boot clock, never the wall clock.
//!
//! Every process on the host reads the same `CLOCK_BOOTTIME`, so an expiry written by one
//! process means the same moment to all the others. It counts time spent suspended (a lease
//! does not survive a laptop's sleep) and is not moved by NTP or an operator setting the date.
//! It restarts at zero on every boot, so each record also carries the boot id: a record written
//! during another boot is expired, whatever its number says.
//!
//! A process in a time namespace of its own (`unshare --time`, some containers) reads a
//! `CLOCK_BOOTTIME` shifted by that namespace's offset, with the same boot id: its records would
//! mean other moments to everybody else. So the clock is read through the offset published in
//! `/proc/self/timens_offsets`: every process of the host compares the host's boot clock.
//!
//! A boot id cannot tell another machine's boot from a reboot of this one, so a file also
//! records the machine it belongs to ([`host_machine_id`]): one clock, one machine. A file
//! opened from another machine is refused (SQLite leases are single-host).

use std::time::Duration;

/// Where Linux publishes the id of the current boot.
pub const BOOT_ID_PATH: &str = "/proc/sys/kernel/random/boot_id";

/// The longest boot id accepted (Linux writes a 36-character UUID).
pub const BOOT_ID_MAX_BYTES: usize = 64;

/// Where the machine id is read, in order: systemd's file, then D-Bus's older one.
pub const MACHINE_ID_PATHS: [&str; 2] = ["/etc/machine-id", "/var/lib/dbus/machine-id"];

/// The longest machine id accepted (systemd writes 32 hex digits).
pub const MACHINE_ID_MAX_BYTES: usize = 64;

/// The time source of a [`SqliteStore`](super::SqliteStore): which boot, and how long since it.
///
/// The default is [`BootClock`]. Tests may inject another one, e.g. to make records expire on
/// a paused clock; every process sharing a database file must use the same clock.
pub trait StoreClock: Send + Sync + 'static {
    /// The current boot of the host. Fixed for the life of the clock.
    fn boot_id(&self) -> &str;

    /// Time elapsed since that boot.
    fn since_boot(&self) -> Result<Duration, ClockError>;
}

/// The boot clock or the identity of the host cannot be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClockError {
    /// None of [`MACHINE_ID_PATHS`] exists or has content.
    #[error(
        "cannot tell which machine this is: none of {tried:?} exists or has content; the SQLite \
         store records the machine a file belongs to: make one (`systemd-machine-id-setup`, or \
         `dbus-uuidgen > /etc/machine-id`), or in a container give it the host's \
         (`-v /etc/machine-id:/etc/machine-id:ro`)"
    )]
    MachineIdMissing {
        /// The files tried.
        tried: &'static [&'static str],
    },
    /// A machine id file exists but could not be read.
    #[error("cannot read the machine id from {path}")]
    MachineIdUnreadable {
        /// The file.
        path: &'static str,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The machine id is longer than [`MACHINE_ID_MAX_BYTES`] or has characters other than
    /// printable ASCII (injected ids) or hex digits (read from a file).
    #[error("machine id {found:?} is not a machine id")]
    MachineIdMalformed {
        /// What was found (cut to [`MACHINE_ID_MAX_BYTES`]).
        found: String,
    },
    /// The boot id file could not be read.
    #[error("cannot read the boot id from {path}")]
    BootIdUnreadable {
        /// The file.
        path: &'static str,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The boot id is empty, too long or has characters other than hex digits and dashes.
    #[error("boot id {found:?} is not a boot id")]
    BootIdMalformed {
        /// What was read (cut to [`BOOT_ID_MAX_BYTES`]).
        found: String,
    },
    /// `clock_gettime(CLOCK_BOOTTIME)` failed.
    #[error("cannot read CLOCK_BOOTTIME")]
    Read(#[source] std::io::Error),
    /// This platform has no boot clock with a boot id.
    #[error("the SQLite store needs CLOCK_BOOTTIME and a boot id, which only Linux provides")]
    Unsupported,
}

/// Checks what the kernel published as the boot id.
fn parse_boot_id(text: &str) -> Result<String, ClockError> {
    let id = text.trim();
    let well_formed = !id.is_empty()
        && id.len() <= BOOT_ID_MAX_BYTES
        && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    if !well_formed {
        let found = id.chars().take(BOOT_ID_MAX_BYTES).collect();
        return Err(ClockError::BootIdMalformed { found });
    }
    Ok(id.to_owned())
}

/// Checks a machine id given by the caller: non-empty printable ASCII, at most
/// [`MACHINE_ID_MAX_BYTES`].
pub(crate) fn check_machine_id(id: String) -> Result<String, ClockError> {
    let well_formed = !id.is_empty()
        && id.len() <= MACHINE_ID_MAX_BYTES
        && id.bytes().all(|b| b.is_ascii_graphic());
    if !well_formed {
        let found = id.chars().take(MACHINE_ID_MAX_BYTES).collect();
        return Err(ClockError::MachineIdMalformed { found });
    }
    Ok(id)
}

/// Checks what a machine id file holds: hex digits (systemd and D-Bus write 32).
fn parse_machine_id(text: &str) -> Result<String, ClockError> {
    let id = text.trim();
    if !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        let found = id.chars().take(MACHINE_ID_MAX_BYTES).collect();
        return Err(ClockError::MachineIdMalformed { found });
    }
    check_machine_id(id.to_owned())
}

/// The identity of this machine: the first of [`MACHINE_ID_PATHS`] that exists with content.
/// It survives reboots (unlike the boot id) and differs between machines, also between virtual
/// machines and containers made from one image when the image leaves it empty, as it should.
pub fn host_machine_id() -> Result<String, ClockError> {
    for path in MACHINE_ID_PATHS {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(source) => return Err(ClockError::MachineIdUnreadable { path, source }),
        };
        // An empty file is a machine id not yet generated: try the next place.
        if !text.trim().is_empty() {
            return parse_machine_id(&text);
        }
    }
    Err(ClockError::MachineIdMissing {
        tried: &MACHINE_ID_PATHS,
    })
}

/// Where Linux publishes the clock offsets of this process's time namespace.
pub const TIME_OFFSETS_PATH: &str = "/proc/self/timens_offsets";

/// The boot clock's offset in a `timens_offsets` text (`boottime <seconds> <nanoseconds>`), in
/// nanoseconds; 0 when the line is missing. `None` when the line cannot be read.
fn parse_boottime_offset(text: &str) -> Option<i64> {
    let Some(line) = text
        .lines()
        .find(|line| line.split_whitespace().next() == Some("boottime"))
    else {
        return Some(0);
    };
    let mut fields = line.split_whitespace().skip(1);
    let seconds: i64 = fields.next()?.parse().ok()?;
    let nanoseconds: i64 = fields.next()?.parse().ok()?;
    seconds.checked_mul(1_000_000_000)?.checked_add(nanoseconds)
}

/// The boot clock's offset of this process's time namespace, in nanoseconds (0 on the host's, or
/// on a kernel without time namespaces): what to take off `CLOCK_BOOTTIME` (or any time shown
/// on it, as `/proc` start times) to compare it with other processes of the host.
///
/// # Errors
/// When `/proc/self/timens_offsets` exists but cannot be read or has no readable boottime line.
pub fn boottime_offset_ns() -> Result<i64, ClockError> {
    match std::fs::read_to_string(TIME_OFFSETS_PATH) {
        Ok(offsets) => parse_boottime_offset(&offsets).ok_or_else(|| {
            ClockError::Read(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{TIME_OFFSETS_PATH} has no readable boottime offset"),
            ))
        }),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(0),
        Err(error) => Err(ClockError::Read(error)),
    }
}

/// The host's `CLOCK_BOOTTIME` together with the boot id from [`BOOT_ID_PATH`].
#[derive(Clone, Debug)]
pub struct BootClock {
    boot_id: String,
    /// The offset of this process's time namespace (0 on the host's): subtracted from what the
    /// clock reads, so that the host's boot clock is compared.
    offset_ns: i64,
}

impl BootClock {
    /// Reads the boot id once; the clock itself is read on every [`since_boot`](StoreClock::since_boot).
    pub fn new() -> Result<Self, ClockError> {
        if !cfg!(target_os = "linux") {
            return Err(ClockError::Unsupported);
        }
        let text = std::fs::read_to_string(BOOT_ID_PATH).map_err(|source| {
            ClockError::BootIdUnreadable {
                path: BOOT_ID_PATH,
                source,
            }
        })?;
        // No file: a kernel without time namespaces, where every process reads the host's clock.
        let offset_ns = boottime_offset_ns()?;
        let clock = BootClock {
            boot_id: parse_boot_id(&text)?,
            offset_ns,
        };
        // Fail here rather than on the first store call.
        clock.since_boot()?;
        Ok(clock)
    }
}

impl StoreClock for BootClock {
    fn boot_id(&self) -> &str {
        &self.boot_id
    }

    #[cfg(target_os = "linux")]
    fn since_boot(&self) -> Result<Duration, ClockError> {
        use rustix::time::{clock_gettime_dynamic, DynamicClockId};

        let now = clock_gettime_dynamic(DynamicClockId::Boottime)
            .map_err(|errno| ClockError::Read(errno.into()))?;
        let ns = i128::from(now.tv_sec) * 1_000_000_000 + i128::from(now.tv_nsec)
            - i128::from(self.offset_ns);
        let ns = u64::try_from(ns).map_err(|_| negative())?;
        Ok(Duration::from_nanos(ns))
    }

    #[cfg(not(target_os = "linux"))]
    fn since_boot(&self) -> Result<Duration, ClockError> {
        Err(ClockError::Unsupported)
    }
}

#[cfg(target_os = "linux")]
fn negative() -> ClockError {
    ClockError::Read(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "CLOCK_BOOTTIME returned a negative time",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    // covers: Sq.BootClock
    #[test]
    fn boot_ids_are_trimmed_and_checked() {
        let id = "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0";
        assert_eq!(parse_boot_id(&format!("{id}\n")).unwrap(), id);
        for bad in [
            "",
            "\n",
            "not a boot id",
            &"a".repeat(BOOT_ID_MAX_BYTES + 1),
        ] {
            assert!(
                matches!(parse_boot_id(bad), Err(ClockError::BootIdMalformed { .. })),
                "{bad:?} accepted"
            );
        }
    }

    // covers: Sq.OneMachine
    #[test]
    fn machine_ids_are_checked() {
        let id = "3d1219c7c4c5404aaa1f6d2a48adfda4";
        assert_eq!(parse_machine_id(&format!("{id}\n")).unwrap(), id);
        assert_eq!(check_machine_id("machine-a".into()).unwrap(), "machine-a");
        for bad in ["", "a b", "é", &"a".repeat(MACHINE_ID_MAX_BYTES + 1)] {
            assert!(
                matches!(
                    check_machine_id(bad.to_owned()),
                    Err(ClockError::MachineIdMalformed { .. })
                ),
                "{bad:?} accepted"
            );
        }
        assert!(
            parse_machine_id("machine-a").is_err(),
            "files hold hex only"
        );
    }

    // covers: Sq.TimeNamespace
    #[test]
    fn the_boottime_offset_is_read_from_the_namespace_offsets() {
        let text = "monotonic           0         0\nboottime         -300         5\n";
        assert_eq!(parse_boottime_offset(text), Some(-299_999_999_995));
        assert_eq!(parse_boottime_offset("monotonic 0 0\n"), Some(0));
        assert_eq!(parse_boottime_offset("boottime x 0\n"), None);
        assert_eq!(parse_boottime_offset("boottime 1\n"), None);
    }

    #[cfg(target_os = "linux")]
    // covers: Sq.BootClock
    #[test]
    fn the_boot_clock_reads_and_does_not_go_back() {
        let clock = BootClock::new().unwrap();
        let first = clock.since_boot().unwrap();
        let second = clock.since_boot().unwrap();
        assert!(second >= first);
        assert!(first > Duration::ZERO);
        assert_eq!(BootClock::new().unwrap().boot_id(), clock.boot_id());
    }
}
