//! Every bad configuration input has its own error; defaults are the documented ones.

use core::time::Duration;

use vvm_core::*;

fn build(builder: VvmConfigBuilder) -> Result<VvmConfig, ConfigError> {
    builder.build()
}

// covers: VVMConfig.Orch, Config.Validation
#[test]
fn defaults_are_lease_20s_acquisition_120s_one_slot_one_second_rounds() {
    let config = VvmConfig::builder("10.0.0.1:7000").build().unwrap();
    assert_eq!(config.lease().lease(), Duration::from_secs(20));
    assert_eq!(config.acquisition(), Duration::from_secs(120));
    assert_eq!(config.slots(), 1);
    assert_eq!(config.round_interval(), Duration::from_secs(1));
    assert_eq!(config.address(), "10.0.0.1:7000");
}

// covers: VVMConfig.Orch, Config.Validation
#[test]
fn each_bad_input_is_its_own_error() {
    let ok = || VvmConfig::builder("a");
    let cases: Vec<(VvmConfigBuilder, ConfigError)> = vec![
        (VvmConfig::builder(""), ConfigError::EmptyAddress),
        (
            VvmConfig::builder("x".repeat(256)),
            ConfigError::AddressTooLong { len: 256, max: 255 },
        ),
        (
            VvmConfig::builder("a\nb"),
            ConfigError::AddressHasControlCharacter,
        ),
        (ok().slots(0), ConfigError::NoSlots),
        (
            ok().slots(1025),
            ConfigError::TooManySlots {
                slots: 1025,
                max: 1024,
            },
        ),
        (
            ok().lease(Duration::from_millis(1_999)),
            ConfigError::LeaseTooShort {
                lease: Duration::from_millis(1_999),
                min: LEASE_MIN,
            },
        ),
        (
            ok().lease(Duration::from_secs(86_401)),
            ConfigError::LeaseTooLong {
                lease: Duration::from_secs(86_401),
                max: LEASE_MAX,
            },
        ),
        (
            ok().lease(Duration::from_secs(20))
                .store_timeout(Duration::from_secs(1)),
            ConfigError::StoreTimeoutOutOfRange {
                timeout: Duration::from_secs(1),
                retry_interval: Duration::from_secs(1),
            },
        ),
        (
            ok().store_timeout(Duration::ZERO),
            ConfigError::StoreTimeoutOutOfRange {
                timeout: Duration::ZERO,
                retry_interval: Duration::from_secs(1),
            },
        ),
        (
            ok().acquisition(Duration::from_secs(7 * 86_400 + 1)),
            ConfigError::AcquisitionTooLong {
                acquisition: Duration::from_secs(7 * 86_400 + 1),
                max: ACQUISITION_MAX,
            },
        ),
        (
            ok().round_interval(Duration::ZERO),
            ConfigError::RoundIntervalZero,
        ),
    ];
    for (builder, expected) in cases {
        assert_eq!(build(builder), Err(expected.clone()), "{expected}");
    }
}

// covers: VVM.StandbyForever
#[test]
fn forever_is_the_only_acquisition_window_above_the_maximum() {
    let forever = build(VvmConfig::builder("a").acquire_forever()).unwrap();
    assert!(forever.acquires_forever());
    assert_eq!(forever.acquisition(), ACQUISITION_FOREVER);
    let explicit = build(VvmConfig::builder("a").acquisition(ACQUISITION_FOREVER)).unwrap();
    assert_eq!(explicit, forever);
    let longest = build(VvmConfig::builder("a").acquisition(ACQUISITION_MAX)).unwrap();
    assert!(!longest.acquires_forever());
    assert!(!build(VvmConfig::builder("a")).unwrap().acquires_forever());
    // Just below forever is still too long.
    let almost = ACQUISITION_FOREVER - Duration::from_nanos(1);
    assert_eq!(
        build(VvmConfig::builder("a").acquisition(almost)),
        Err(ConfigError::AcquisitionTooLong {
            acquisition: almost,
            max: ACQUISITION_MAX
        })
    );
}

// covers: Config.Validation, Lease.RenewInterval, Lease.Retry, processKillThreshold, Lease.PreRenewalGuard
#[test]
fn intervals_are_exact_fractions_of_the_lease() {
    let lease = LeaseConfig::new(Duration::from_millis(2_003)).unwrap();
    assert_eq!(lease.renew_interval(), Duration::from_nanos(500_750_000));
    assert_eq!(lease.retry_interval(), Duration::from_nanos(100_150_000));
    assert_eq!(lease.kill_after(), Duration::from_nanos(1_602_400_000));
    assert_eq!(lease.guard_after(), Duration::from_nanos(1_502_250_000));
    assert!(LeaseConfig::new(LEASE_MIN).is_ok());
    assert!(LeaseConfig::new(LEASE_MAX).is_ok());
}

// covers: Lease.StoreTimeout
#[test]
fn the_store_timeout_stays_below_the_retry_interval() {
    let lease = LeaseConfig::new(Duration::from_secs(20)).unwrap();
    assert_eq!(lease.store_timeout(), Duration::from_millis(500));
    assert!(lease.store_timeout() < lease.retry_interval());
    let custom = lease
        .with_store_timeout(Duration::from_millis(999))
        .unwrap();
    assert_eq!(custom.store_timeout(), Duration::from_millis(999));
    assert!(lease
        .with_store_timeout(Duration::from_millis(1_000))
        .is_err());
}
