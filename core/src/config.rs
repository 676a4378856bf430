//! Validated configuration. Every bad input is a distinct [`ConfigError`]; a value of
//! [`LeaseConfig`] or [`VvmConfig`] is valid by construction, so the machines never re-check it.

use core::time::Duration;

/// The shortest lease accepted. Below it the renewal, retry and store-call intervals get so short
/// that ordinary scheduling jitter would eat the safety margin.
pub const LEASE_MIN: Duration = Duration::from_secs(2);
/// The longest lease accepted; a bound so that deadline arithmetic can never approach overflow.
pub const LEASE_MAX: Duration = Duration::from_secs(24 * 60 * 60);
/// The most slots one VVM may walk during acquisition.
pub const SLOTS_MAX: u32 = 1024;
/// The longest address, in bytes. Stores keep it inside every lease record.
pub const ADDRESS_MAX_BYTES: usize = 255;
/// The longest acquisition duration accepted.
pub const ACQUISITION_MAX: Duration = Duration::from_secs(7 * 24 * 60 * 60);
/// How many times the pause before retrying a failed renewal doubles: `L/20`, `L/10`, then `L/5`
/// for every later retry. Retries go on while an answer could still arrive before the kill
/// deadline, so the cap bounds the store calls per lease period, not the number of attempts.
pub const RETRY_DOUBLINGS_MAX: u32 = 2;
/// Most store calls the renewal path sends per lease period: consecutive attempts are sent at
/// least `L/20` apart (so at most 21 start within any span of `L`), and each costs at most two
/// calls (the compare-and-swap and, for an unknown outcome, one read).
pub const RENEWAL_CALLS_PER_LEASE_MAX: u32 = 42;

/// Default lease duration `L`.
pub const LEASE_DEFAULT: Duration = Duration::from_secs(20);
/// The acquisition window of a standby that waits as long as it lives
/// ([`VvmConfigBuilder::acquire_forever`]): the end of acquisition saturates at
/// [`Instant::MAX`](crate::Instant::MAX), which no clock reaches, so acquisition never fails.
pub const ACQUISITION_FOREVER: Duration = Duration::MAX;

/// Default time during which acquisition keeps trying.
pub const ACQUISITION_DEFAULT: Duration = Duration::from_secs(120);
/// Default pause between two acquisition rounds over all slots.
pub const ROUND_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// Checks an address the way every entry point does ([`VvmConfigBuilder::build`] and the
/// runtime's `Elections::start`): a record written with an address that fails here would read
/// back as corrupt for its holder, `status` and every candidate.
///
/// ```
/// use vvm_core::{validate_address, ConfigError};
/// assert_eq!(validate_address("10.0.0.7:8080"), Ok(()));
/// assert_eq!(validate_address(""), Err(ConfigError::EmptyAddress));
/// assert_eq!(validate_address("a\nb"), Err(ConfigError::AddressHasControlCharacter));
/// ```
pub fn validate_address(address: &str) -> Result<(), ConfigError> {
    if address.is_empty() {
        return Err(ConfigError::EmptyAddress);
    }
    if address.len() > ADDRESS_MAX_BYTES {
        return Err(ConfigError::AddressTooLong {
            len: address.len(),
            max: ADDRESS_MAX_BYTES,
        });
    }
    if address.chars().any(char::is_control) {
        return Err(ConfigError::AddressHasControlCharacter);
    }
    Ok(())
}

/// A configuration value that cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The lease is shorter than [`LEASE_MIN`].
    #[error("lease of {lease:?} is shorter than the minimum of {min:?}")]
    LeaseTooShort {
        /// The lease asked for.
        lease: Duration,
        /// [`LEASE_MIN`].
        min: Duration,
    },
    /// The lease is longer than [`LEASE_MAX`].
    #[error("lease of {lease:?} is longer than the maximum of {max:?}")]
    LeaseTooLong {
        /// The lease asked for.
        lease: Duration,
        /// [`LEASE_MAX`].
        max: Duration,
    },
    /// A derived interval (renewal, retry, store-call timeout) would be zero.
    #[error("the {name} derived from the lease rounds to zero")]
    DerivedIntervalZero {
        /// Which interval.
        name: &'static str,
    },
    /// The store-call timeout is zero or not shorter than the retry interval.
    #[error("store-call timeout of {timeout:?} must be above zero and below the retry interval of {retry_interval:?}")]
    StoreTimeoutOutOfRange {
        /// The timeout asked for.
        timeout: Duration,
        /// The retry interval it must stay below.
        retry_interval: Duration,
    },
    /// The number of slots is zero.
    #[error("the number of slots must be at least 1")]
    NoSlots,
    /// The number of slots is above [`SLOTS_MAX`].
    #[error("{slots} slots is more than the maximum of {max}")]
    TooManySlots {
        /// The number asked for.
        slots: u32,
        /// [`SLOTS_MAX`].
        max: u32,
    },
    /// The address is empty.
    #[error("the address must not be empty")]
    EmptyAddress,
    /// The address is longer than [`ADDRESS_MAX_BYTES`].
    #[error("the address is {len} bytes long, more than the maximum of {max}")]
    AddressTooLong {
        /// Its length in bytes.
        len: usize,
        /// [`ADDRESS_MAX_BYTES`].
        max: usize,
    },
    /// The address contains a control character (it is shown in logs and status tables).
    #[error("the address contains a control character")]
    AddressHasControlCharacter,
    /// The acquisition duration is above [`ACQUISITION_MAX`].
    #[error("acquisition duration of {acquisition:?} is longer than the maximum of {max:?}")]
    AcquisitionTooLong {
        /// The duration asked for.
        acquisition: Duration,
        /// [`ACQUISITION_MAX`].
        max: Duration,
    },
    /// The pause between acquisition rounds is zero (the rounds would spin on the store).
    #[error("the interval between acquisition rounds must be above zero")]
    RoundIntervalZero,
}

/// Timing of one lease, all derived from the lease duration `L`.
///
/// | what | value |
/// |---|---|
/// | renew interval | `L/4` |
/// | retry after a failed renewal | `L/20`, doubling to at most `L/5` ([`RETRY_DOUBLINGS_MAX`]), while an answer could still arrive before the kill deadline |
/// | kill deadline after a confirmed write | send time + `0.8·L` |
/// | pre-renewal guard (may only move the deadline earlier) | tick time + `0.75·L` |
/// | store-call timeout | `L/40` unless set, always below the retry interval |
///
/// ```
/// use core::time::Duration;
/// use vvm_core::LeaseConfig;
///
/// let lease = LeaseConfig::new(Duration::from_secs(20)).unwrap();
/// assert_eq!(lease.renew_interval(), Duration::from_secs(5));
/// assert_eq!(lease.kill_after(), Duration::from_secs(16));
/// assert!(LeaseConfig::new(Duration::from_secs(1)).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseConfig {
    lease: Duration,
    renew_interval: Duration,
    retry_interval: Duration,
    store_timeout: Duration,
    kill_after: Duration,
    guard_after: Duration,
    // The three intervals the hot path adds to instants, in nanoseconds (no conversion per event).
    renew_ns: u64,
    kill_ns: u64,
    guard_ns: u64,
}

/// `duration · numerator / denominator`, exact to the nanosecond (no float truncation).
const fn fraction(duration: Duration, numerator: u128, denominator: u128) -> Duration {
    let ns = duration.as_nanos() * numerator / denominator;
    // LEASE_MAX keeps every fraction far below u64::MAX nanoseconds.
    Duration::from_nanos(ns as u64)
}

impl LeaseConfig {
    /// A lease of duration `lease` with every interval derived from it.
    pub fn new(lease: Duration) -> Result<Self, ConfigError> {
        if lease < LEASE_MIN {
            return Err(ConfigError::LeaseTooShort {
                lease,
                min: LEASE_MIN,
            });
        }
        if lease > LEASE_MAX {
            return Err(ConfigError::LeaseTooLong {
                lease,
                max: LEASE_MAX,
            });
        }
        let config = LeaseConfig {
            lease,
            renew_interval: fraction(lease, 1, 4),
            retry_interval: fraction(lease, 1, 20),
            store_timeout: fraction(lease, 1, 40),
            kill_after: fraction(lease, 4, 5),
            guard_after: fraction(lease, 3, 4),
            renew_ns: fraction(lease, 1, 4).as_nanos() as u64,
            kill_ns: fraction(lease, 4, 5).as_nanos() as u64,
            guard_ns: fraction(lease, 3, 4).as_nanos() as u64,
        };
        for (name, value) in [
            ("renew interval", config.renew_interval),
            ("retry interval", config.retry_interval),
            ("store-call timeout", config.store_timeout),
        ] {
            if value.is_zero() {
                return Err(ConfigError::DerivedIntervalZero { name });
            }
        }
        debug_assert!(config.guard_after < config.kill_after);
        debug_assert!(config.kill_after < config.lease);
        debug_assert!(config.store_timeout < config.retry_interval);
        Ok(config)
    }

    /// The same lease with a different store-call timeout, which must stay below the retry
    /// interval: a hung call has to count as failed before the next retry is due.
    pub fn with_store_timeout(mut self, timeout: Duration) -> Result<Self, ConfigError> {
        if timeout.is_zero() || timeout >= self.retry_interval {
            return Err(ConfigError::StoreTimeoutOutOfRange {
                timeout,
                retry_interval: self.retry_interval,
            });
        }
        self.store_timeout = timeout;
        Ok(self)
    }

    /// The lease duration `L`: how long a record lives in the store after a write.
    #[inline]
    pub const fn lease(&self) -> Duration {
        self.lease
    }

    /// `L/4`: time between renewals.
    #[inline]
    pub const fn renew_interval(&self) -> Duration {
        self.renew_interval
    }

    /// `L/20`: pause before the first retry of a renewal that failed (see
    /// [`retry_backoff`](Self::retry_backoff)).
    #[inline]
    pub const fn retry_interval(&self) -> Duration {
        self.retry_interval
    }

    /// The pause before retrying a renewal after `failures` failed attempts in a row (at least
    /// one): `L/20`, `L/10`, then `L/5` ([`RETRY_DOUBLINGS_MAX`] doublings).
    ///
    /// ```
    /// use core::time::Duration;
    /// use vvm_core::LeaseConfig;
    ///
    /// let lease = LeaseConfig::new(Duration::from_secs(20)).unwrap();
    /// let backoff: Vec<_> = (1..=4).map(|n| lease.retry_backoff(n).as_millis()).collect();
    /// assert_eq!(backoff, [1000, 2000, 4000, 4000]);
    /// ```
    #[inline]
    pub const fn retry_backoff(&self, failures: u8) -> Duration {
        let doublings = if failures == 0 {
            0
        } else if (failures as u32 - 1) < RETRY_DOUBLINGS_MAX {
            failures as u32 - 1
        } else {
            RETRY_DOUBLINGS_MAX
        };
        // At most L/5 ≤ 4.8 h: far from overflowing.
        Duration::from_nanos(self.retry_interval.as_nanos() as u64 * (1 << doublings))
    }

    /// How long one store call may take before it counts as failed (outcome unknown).
    #[inline]
    pub const fn store_timeout(&self) -> Duration {
        self.store_timeout
    }

    /// `0.8·L`: the kill deadline is this long after the send time of the last confirmed write.
    #[inline]
    pub const fn kill_after(&self) -> Duration {
        self.kill_after
    }

    /// [`renew_interval`](Self::renew_interval) in nanoseconds.
    #[inline]
    pub(crate) const fn renew_ns(&self) -> u64 {
        self.renew_ns
    }

    /// [`kill_after`](Self::kill_after) in nanoseconds.
    #[inline]
    pub(crate) const fn kill_ns(&self) -> u64 {
        self.kill_ns
    }

    /// [`guard_after`](Self::guard_after) in nanoseconds.
    #[inline]
    pub(crate) const fn guard_ns(&self) -> u64 {
        self.guard_ns
    }

    /// `0.75·L`: before each renewal the deadline is lowered to at most tick time + this.
    #[inline]
    pub const fn guard_after(&self) -> Duration {
        self.guard_after
    }
}

impl Default for LeaseConfig {
    fn default() -> Self {
        match LeaseConfig::new(LEASE_DEFAULT) {
            Ok(config) => config,
            Err(_) => unreachable!("the default lease is within bounds"),
        }
    }
}

/// Configuration of one VVM: its identity, how many slots exist, its lease and how long it tries
/// to acquire one. Built with [`VvmConfig::builder`].
///
/// ```
/// use core::time::Duration;
/// use vvm_core::{ConfigError, VvmConfig};
///
/// let config = VvmConfig::builder("10.0.0.7:7000")
///     .slots(3)
///     .lease(Duration::from_secs(10))
///     .build()
///     .unwrap();
/// assert_eq!(config.slots(), 3);
/// assert_eq!(config.acquisition(), Duration::from_secs(120));
///
/// let err = VvmConfig::builder("").build().unwrap_err();
/// assert_eq!(err, ConfigError::EmptyAddress);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct VvmConfig {
    address: String,
    slots: u32,
    lease: LeaseConfig,
    acquisition: Duration,
    round_interval: Duration,
}

impl VvmConfig {
    /// Starts a configuration for the VVM reachable at `address` (stored as the lease value).
    pub fn builder(address: impl Into<String>) -> VvmConfigBuilder {
        VvmConfigBuilder {
            address: address.into(),
            slots: 1,
            lease: LEASE_DEFAULT,
            store_timeout: None,
            acquisition: ACQUISITION_DEFAULT,
            round_interval: ROUND_INTERVAL_DEFAULT,
        }
    }

    /// This VVM's address, written into every lease it holds.
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Number of slots `N`; acquisition walks slots `1..=N`.
    pub const fn slots(&self) -> u32 {
        self.slots
    }

    /// The lease timing.
    #[inline]
    pub const fn lease(&self) -> &LeaseConfig {
        &self.lease
    }

    /// How long acquisition keeps trying before it raises a problem; [`ACQUISITION_FOREVER`]
    /// for a standby that never gives up.
    pub const fn acquisition(&self) -> Duration {
        self.acquisition
    }

    /// Whether acquisition goes on as long as the VVM lives (until it is stopped).
    pub fn acquires_forever(&self) -> bool {
        self.acquisition == ACQUISITION_FOREVER
    }

    /// Pause between two acquisition rounds over all slots.
    pub const fn round_interval(&self) -> Duration {
        self.round_interval
    }
}

/// Builder of [`VvmConfig`]; every setter is checked in [`build`](VvmConfigBuilder::build).
#[derive(Clone, Debug)]
pub struct VvmConfigBuilder {
    address: String,
    slots: u32,
    lease: Duration,
    store_timeout: Option<Duration>,
    acquisition: Duration,
    round_interval: Duration,
}

impl VvmConfigBuilder {
    /// Number of slots (default 1).
    pub fn slots(mut self, slots: u32) -> Self {
        self.slots = slots;
        self
    }

    /// Lease duration `L` (default 20 s).
    #[inline]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Store-call timeout (default `L/40`).
    #[inline]
    pub fn store_timeout(mut self, timeout: Duration) -> Self {
        self.store_timeout = Some(timeout);
        self
    }

    /// Acquisition duration (default 120 s): acquisition always completes the round over every
    /// slot it is in before it looks at the window, so zero tries each slot once and gives up
    /// (a try-lock, `flock -n`).
    pub fn acquisition(mut self, acquisition: Duration) -> Self {
        self.acquisition = acquisition;
        self
    }

    /// Acquisition never ends: a standby that waits for a slot as long as it lives, until it
    /// is stopped (shutdown, or a stop handle while launching). Same as
    /// `acquisition(ACQUISITION_FOREVER)`; the only duration above [`ACQUISITION_MAX`] accepted.
    pub fn acquire_forever(mut self) -> Self {
        self.acquisition = ACQUISITION_FOREVER;
        self
    }

    /// Pause between acquisition rounds (default 1 s).
    pub fn round_interval(mut self, interval: Duration) -> Self {
        self.round_interval = interval;
        self
    }

    /// Validates every field; the first bad one is the error.
    pub fn build(self) -> Result<VvmConfig, ConfigError> {
        validate_address(&self.address)?;
        if self.slots == 0 {
            return Err(ConfigError::NoSlots);
        }
        if self.slots > SLOTS_MAX {
            return Err(ConfigError::TooManySlots {
                slots: self.slots,
                max: SLOTS_MAX,
            });
        }
        let mut lease = LeaseConfig::new(self.lease)?;
        if let Some(timeout) = self.store_timeout {
            lease = lease.with_store_timeout(timeout)?;
        }
        if self.acquisition > ACQUISITION_MAX && self.acquisition != ACQUISITION_FOREVER {
            return Err(ConfigError::AcquisitionTooLong {
                acquisition: self.acquisition,
                max: ACQUISITION_MAX,
            });
        }
        if self.round_interval.is_zero() {
            return Err(ConfigError::RoundIntervalZero);
        }
        Ok(VvmConfig {
            address: self.address,
            slots: self.slots,
            lease,
            acquisition: self.acquisition,
            round_interval: self.round_interval,
        })
    }
}
