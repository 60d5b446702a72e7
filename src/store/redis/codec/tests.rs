//! Unit tests of `codec`, beside it rather than inside it.

use super::*;
use redis::Value;

mod hostile {
    //! What Redis sends back is decoded without trusting it: a value
    //! another program wrote into our keys, a truncated or corrupted
    //! state, a reply of the wrong shape is an error, never a panic.
    //! `CHARON_FUZZ_CASES` sets the cases (the long run's knob, as in
    //! `tests/engine/fuzz.rs`).
    use super::*;
    use proptest::prelude::*;

    fn cases() -> u32 {
        std::env::var("CHARON_FUZZ_CASES")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(256)
    }

    /// Bytes shaped like stored state: its digits and separators, or
    /// anything.
    fn stored() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            "[0-9|:;,~tb.-]{0,40}".prop_map(String::into_bytes),
            "(18446744073709551615|99999999999999999999|-1|0)([|:;,~][0-9]{0,20}){0,6}"
                .prop_map(String::into_bytes),
            prop::collection::vec(any::<u8>(), 0..40),
        ]
    }

    fn value(depth: u32) -> BoxedStrategy<Value> {
        let leaf = prop_oneof![
            Just(Value::Nil),
            any::<i64>().prop_map(Value::Int),
            stored().prop_map(Value::BulkString),
            "\\PC{0,10}".prop_map(Value::SimpleString),
            Just(Value::Okay),
        ];
        if depth == 0 {
            return leaf.boxed();
        }
        prop_oneof![
            2 => leaf,
            1 => prop::collection::vec(value(depth - 1), 0..6).prop_map(Value::Array),
        ]
        .boxed()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(cases()))]

        #[test]
        fn stored_state_decodes_or_errs(raw in stored(), now in any::<u64>(), kind in 0..4usize) {
            let kind = [SlotKind::Window, SlotKind::Tiers, SlotKind::Log, SlotKind::Gcra][kind];
            let _ = slot(kind, Some(&raw), now);
        }

        #[test]
        fn script_replies_decode_or_err(reply_value in value(3), keys in 0usize..5) {
            if let Ok(decoded) = reply(reply_value, keys) {
                prop_assert_eq!(decoded.before.len(), keys);
            }
        }

        #[test]
        fn one_item_replies_decode_or_err(
            text in "[01 ]{0,2}[0-9.]{0,25}( [0-9,]{0,30})?|\\PC{0,40}",
        ) {
            if let Ok(decoded) = reply(Value::BulkString(text.into_bytes()), 1) {
                prop_assert_eq!(decoded.before.len(), 1);
            }
        }

        #[test]
        fn queue_replies_decode_or_err(
            text in "[01x]{0,70} [0-9.]{0,25}( [0-9,]{0,30})?|\\PC{0,80}",
        ) {
            if let Ok(decoded) = queue_reply(Value::BulkString(text.clone().into_bytes())) {
                prop_assert!(decoded.granted.len() <= text.len());
            }
        }
    }
}

#[test]
fn stored_values_decode_into_engine_state() {
    let Slot::Tiers(state) = slot(
        SlotKind::Tiers,
        Some(b"5000|1000:2,1500:1|1000;1000:2|;|1500;1500:1"),
        1_600,
    )
    .expect("valid") else {
        panic!("a tier state");
    };
    assert_eq!(state.expires_at, 5_000);
    assert_eq!(state.recent.count(1_600, 1_000), 3);
    assert_eq!(state.tiers.len(), 3);
    assert_eq!(state.tiers[1].entered_at, None);
    assert_eq!(state.tiers[2].entered_at, Some(1_500));

    let expired = slot(SlotKind::Window, Some(b"0,3,1000"), 1_000).expect("valid");
    assert_eq!(expired, Slot::new(SlotKind::Window));
    assert!(slot(SlotKind::Log, Some(b"12:x"), 0).is_err());
    assert!(slot(SlotKind::Tiers, Some(b"f||;"), 0).is_ok());

    // Logs carry their total; the older form without it reads the same.
    let with_total = slot(SlotKind::Log, Some(b"3~1000:2,1500:1"), 1_600).expect("valid");
    let without = slot(SlotKind::Log, Some(b"1000:2,1500:1"), 1_600).expect("valid");
    assert_eq!(with_total, without);
    assert!(slot(SlotKind::Log, Some(b"x~1000:2"), 0).is_err());
}

#[test]
fn a_one_item_reply_is_the_verdict_redis_time_and_the_value() {
    let reply = reply(
        Value::BulkString(b"1 1764265123.456789 1764265080000,3,1764265140000".to_vec()),
        1,
    )
    .expect("valid");
    assert!(reply.granted);
    assert_eq!(reply.now, 1_764_265_123_456);
    assert_eq!(
        reply.before,
        [Some(b"1764265080000,3,1764265140000".to_vec())]
    );

    // An injected time is milliseconds; an empty value is no value.
    let reply = super::reply(Value::BulkString(b"0 5000 ".to_vec()), 1).expect("valid");
    assert!(!reply.granted);
    assert_eq!(reply.now, 5_000);
    assert_eq!(reply.before, [None]);

    for malformed in [
        &b""[..],
        b"1 5000",
        b"2 5000 ",
        b"1 x ",
        b"1 5.x ",
        b"1 18446744073709551615.0 ",
    ] {
        assert!(
            super::reply(Value::BulkString(malformed.to_vec()), 1).is_err(),
            "{:?}",
            String::from_utf8_lossy(malformed)
        );
    }
}

#[test]
fn a_queue_reply_is_a_verdict_per_decision_redis_time_and_the_value() {
    let reply = queue_reply(Value::BulkString(
        b"1101 1764265123.456789 1764265080000,3,1764265140000".to_vec(),
    ))
    .expect("valid");
    assert_eq!(reply.granted, [true, true, false, true]);
    assert_eq!(reply.now, 1_764_265_123_456);
    assert_eq!(
        reply.before,
        Some(b"1764265080000,3,1764265140000".to_vec())
    );
    let reply = queue_reply(Value::BulkString(b"0 5000 ".to_vec())).expect("valid");
    assert_eq!(
        (reply.granted, reply.now, reply.before),
        (vec![false], 5_000, None)
    );

    for malformed in [&b""[..], b"11 5000", b"1x1 5000 ", b"1 x ", b"1 5.x "] {
        assert!(
            queue_reply(Value::BulkString(malformed.to_vec())).is_err(),
            "{:?}",
            String::from_utf8_lossy(malformed)
        );
    }
    assert!(queue_reply(Value::Int(1)).is_err());
}
