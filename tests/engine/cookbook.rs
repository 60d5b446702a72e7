//! Every rate-limited cookbook pattern (docs/design.md#cookbook-patterns),
//! loaded from `examples/cookbook/` and driven through the limiter on a
//! manual clock: each behaves as its comment says.

use charon::clock::ManualClock;
use charon::config;
use charon::limiter::{Descriptor, DescriptorStatus, Limiter, RateLimitRequest};
use charon::store::MemoryStore;

const START: u64 = 1_700_000_000_000;

struct Cookbook {
    limiter: Limiter<MemoryStore<ManualClock>>,
    clock: ManualClock,
    namespace: String,
}

impl Cookbook {
    fn load(file: &str) -> Self {
        let path = format!("{}/examples/cookbook/{file}", env!("CARGO_MANIFEST_DIR"));
        let loaded = config::load_path(path.as_ref()).expect("cookbook example loads");
        let namespace = loaded
            .config
            .namespaces()
            .next()
            .expect("one namespace")
            .name
            .clone();
        let clock = ManualClock::new(START);
        let limiter = Limiter::new(loaded.config, MemoryStore::with_clock(clock.clone()));
        Self {
            limiter,
            clock,
            namespace,
        }
    }

    fn at(&self, ms_since_start: u64) {
        self.clock.set(START + ms_since_start);
    }

    async fn hits(&self, tenant: &str, hits: u64) -> DescriptorStatus {
        let mut request = RateLimitRequest::new(
            self.namespace.clone(),
            vec![Descriptor::new([("tenant", tenant)])],
        );
        request.hits_addend = hits;
        let answer = self
            .limiter
            .should_rate_limit(request)
            .await
            .expect("answer");
        assert_eq!(answer.over_limit, answer.statuses[0].over_limit);
        answer.statuses.into_iter().next().expect("one status")
    }

    async fn hit(&self, tenant: &str) -> DescriptorStatus {
        self.hits(tenant, 1).await
    }

    /// Sends one hit at a time until one is rejected; returns the grants.
    async fn grants_until_rejected(&self, tenant: &str) -> u64 {
        let mut granted = 0;
        while !self.hit(tenant).await.over_limit {
            granted += 1;
            assert!(granted < 100_000, "never rejected");
        }
        granted
    }
}

/// The exact retry-after in ms: a resource's own (the Charon API's
/// precision); for a fixed window, the status's reset. (A resource's
/// status reset is that wait in the whole seconds Envoy reads.)
fn retry_after(status: &DescriptorStatus) -> u64 {
    assert!(status.over_limit);
    match &status.tiers {
        Some(tiers) => {
            let exact = tiers.retry_after.expect("a rejection says when to retry");
            let reset = status.reset_after_ms.expect("a rejection says when");
            assert_eq!(reset, exact.div_ceil(1_000).max(1) * 1_000);
            exact
        }
        None => status
            .reset_after_ms
            .expect("a rejection says when to retry"),
    }
}

#[tokio::test]
async fn simple_five_per_second() {
    let book = Cookbook::load("simple.yaml");
    book.at(0);
    assert_eq!(book.grants_until_rejected("acme").await, 5);
    let rejected = book.hit("acme").await;
    assert_eq!(retry_after(&rejected), 1_001);
    // Another tenant has its own history.
    assert_eq!(book.grants_until_rejected("globex").await, 5);
    book.at(1_000);
    assert!(book.hit("acme").await.over_limit);
    book.at(1_001);
    assert_eq!(book.grants_until_rejected("acme").await, 5);
}

#[tokio::test]
async fn penalty_burst_once_every_fifteen_seconds() {
    let book = Cookbook::load("penalty.yaml");
    book.at(0);
    // 5 in tier 1, then the burst tier allows 20 more within the second.
    assert_eq!(book.grants_until_rejected("acme").await, 25);
    // The burst tier stays current for its 5 s active period.
    book.at(1_001);
    let status = book.hit("acme").await;
    assert_eq!(status.tiers.expect("tiers").snapshot.tier, 2);
    assert_eq!(book.grants_until_rejected("acme").await, 19);
    // At 5 s the burst tier cools down: back to 5 per second, no new burst.
    book.at(5_000);
    let status = book.hit("acme").await;
    assert_eq!(status.tiers.expect("tiers").snapshot.tier, 1);
    // (The hit at 5 000 still counts at 6 000: a hit at t counts while
    // now <= t + window.)
    book.at(6_001);
    assert_eq!(book.grants_until_rejected("acme").await, 5);
    let rejected = book.hit("acme").await;
    // Tier 1's hits at 6 001 leave at 7 002; cooldown ends at 15 000.
    assert_eq!(retry_after(&rejected), 1_001);
    // Until the cooldown ends (at 15 s), never more than 5 per second.
    book.at(14_000);
    assert_eq!(book.grants_until_rejected("acme").await, 5);
    // After it (and once the hits of 14 000 have left), the tenant may burst again.
    book.at(15_001);
    assert_eq!(book.grants_until_rejected("acme").await, 25);
}

#[tokio::test]
async fn stacked_penalties_climb_and_fall_back_several_levels() {
    let book = Cookbook::load("penalty-stacked.yaml");
    book.at(0);
    assert_eq!(book.grants_until_rejected("acme").await, 10 + 20 + 40);
    let status = book.hit("acme").await;
    assert_eq!(status.tiers.expect("tiers").snapshot.tier, 3);
    // Tiers 2 and 3 both end at 10 s: fallback drops two levels at once.
    book.at(10_000);
    let status = book.hit("acme").await;
    assert!(!status.over_limit);
    assert_eq!(status.tiers.expect("tiers").snapshot.tier, 1);
    assert_eq!(book.grants_until_rejected("acme").await, 9);
}

#[tokio::test]
async fn punishment_prison_for_fifteen_seconds() {
    let book = Cookbook::load("punishment.yaml");
    book.at(0);
    // Five granted, the sixth bursts into the prison (granted: limit 1) ...
    assert_eq!(book.grants_until_rejected("mallory").await, 6);
    let rejected = book.hit("mallory").await;
    let tiers = rejected.tiers.expect("tiers");
    assert_eq!(tiers.snapshot.tier, 2);
    // ... then nothing until the prison's active period ends.
    assert_eq!(retry_after(&rejected), 15_000);
    book.at(14_999);
    assert!(book.hit("mallory").await.over_limit);
    book.at(15_000);
    assert_eq!(book.grants_until_rejected("mallory").await, 6);
    // Well-behaved tenants are never imprisoned.
    for second in 0..20 {
        book.at(20_000 + second * 1_001);
        for _ in 0..5 {
            assert!(!book.hit("alice").await.over_limit);
        }
    }
}

#[tokio::test]
async fn punishment_buffer_tier_absorbs_spills_then_captures() {
    let book = Cookbook::load("punishment-buffer.yaml");
    book.at(0);
    // A slight spill into the buffer is fine ...
    for _ in 0..12 {
        assert!(!book.hit("spiky").await.over_limit);
    }
    assert_eq!(
        book.hit("spiky").await.tiers.expect("tiers").snapshot.tier,
        2
    );
    // ... and after the buffer's 2 s the tenant is back in tier 1.
    book.at(2_000);
    let status = book.hit("spiky").await;
    assert_eq!(status.tiers.expect("tiers").snapshot.tier, 1);
    // Going through the whole buffer lands in prison for an hour.
    book.at(10_000);
    assert_eq!(book.grants_until_rejected("abuser").await, 10 + 5 + 1);
    let rejected = book.hit("abuser").await;
    assert_eq!(rejected.tiers.expect("tiers").snapshot.tier, 3);
    assert_eq!(retry_after(&rejected), 3_600_000);
}

#[tokio::test]
async fn batch_fifty_in_fifteen_seconds_then_thirty_seconds_off() {
    let book = Cookbook::load("batch.yaml");
    book.at(0);
    assert_eq!(book.grants_until_rejected("nightly").await, 50);
    book.at(14_000);
    let rejected = book.hit("nightly").await;
    // The tier goes into cooldown at 15 s and is inactive again at 45 s.
    assert_eq!(retry_after(&rejected), 31_000);
    book.at(30_000);
    assert!(book.hit("nightly").await.over_limit);
    book.at(44_999);
    assert!(book.hit("nightly").await.over_limit);
    book.at(45_000);
    assert_eq!(book.grants_until_rejected("nightly").await, 50);
}

#[tokio::test]
async fn batch_daily_five_thousand_then_closed_for_the_day() {
    let book = Cookbook::load("batch-daily.yaml");
    book.at(0);
    // A bulk request takes the whole allowance at once.
    assert!(!book.hits("reporter", 4_000).await.over_limit);
    assert!(book.hits("reporter", 1_001).await.over_limit);
    assert!(!book.hits("reporter", 1_000).await.over_limit);
    book.at(60_000);
    let rejected = book.hit("reporter").await;
    assert_eq!(retry_after(&rejected), 86_400_000 - 60_000);
    book.at(86_400_000);
    assert!(!book.hit("reporter").await.over_limit);
}

#[tokio::test]
async fn ban_after_two_thousand_in_twenty_minutes_for_an_hour() {
    for file in ["ban.yaml", "ban-shorthand.yaml"] {
        ban_scenario(Cookbook::load(file)).await;
    }
}

async fn ban_scenario(book: Cookbook) {
    book.at(0);
    // 2 000 in the 1 200 s window, plus the request that trips the ban.
    assert_eq!(book.grants_until_rejected("scraper").await, 2_001);
    let banned = book.hit("scraper").await;
    assert_eq!(banned.tiers.expect("tiers").snapshot.tier, 2);
    assert_eq!(retry_after(&banned), 3_600_000);
    book.at(3_599_999);
    assert!(book.hit("scraper").await.over_limit, "still banned");
    book.at(3_600_000);
    assert!(!book.hit("scraper").await.over_limit, "the ban is over");
    // A client under 2 000 per 20 minutes (90 a minute: at most 21 minutes'
    // worth, 1 890, in any 1 200 s) is never banned.
    for minute in 0..60 {
        book.at(4_000_000 + minute * 60_000);
        for _ in 0..90 {
            assert!(!book.hit("polite").await.over_limit);
        }
    }
}

#[tokio::test]
async fn token_bucket_ten_per_second_bursts_of_twenty() {
    let book = Cookbook::load("token-bucket.yaml");
    book.at(0);
    // A quiet key spends its whole burst at once ...
    assert_eq!(book.grants_until_rejected("client").await, 20);
    let rejected = book.hit("client").await;
    // ... then one every 100 ms, exactly.
    assert_eq!(retry_after(&rejected), 100);
    for step in 1..=50 {
        book.at(step * 100);
        assert!(!book.hit("client").await.over_limit, "at {} ms", step * 100);
        assert!(book.hit("client").await.over_limit);
    }
    // After 2 s of quiet the bucket is full again.
    book.at(7_000);
    assert_eq!(book.grants_until_rejected("client").await, 20);
}

#[tokio::test]
async fn hybrid_bursts_once_then_holds_an_even_rate() {
    let book = Cookbook::load("hybrid.yaml");
    book.at(10_000);
    // A quiet client: its whole minute's quota at once.
    assert_eq!(book.grants_until_rejected("client").await, 60);
    // Having spent it, nothing more until its minute (from 10 000) ends ...
    assert_eq!(retry_after(&book.hit("client").await), 60_000);
    book.at(69_999);
    assert!(book.hit("client").await.over_limit);
    // ... then one a second: never a second burst.
    for second in 0..30 {
        book.at(70_000 + second * 1_000);
        assert!(!book.hit("client").await.over_limit, "second {second}");
        assert!(book.hit("client").await.over_limit);
    }
    // A minute without a request saves a whole quota: bursty again.
    book.at(70_000 + 29_000 + 60_000);
    assert_eq!(book.grants_until_rejected("client").await, 60);
}

#[tokio::test]
async fn cloud_armor_ban_refuses_the_tripping_request_and_bans_past_the_interval() {
    let book = Cookbook::load("ban-cloud-armor.yaml");
    book.at(10_000);
    // The interval starts at the first request: 2 000 granted in it.
    assert_eq!(book.grants_until_rejected("client").await, 2_000);
    // That refusal was the 2 001st request: it tripped the ban, which runs
    // to the interval's end (10 000 + 1 200 000) and 3 600 s beyond.
    book.at(600_000);
    let banned = book.hit("client").await;
    assert_eq!(retry_after(&banned), 4_810_000 - 600_000);
    book.at(1_210_000);
    assert!(
        book.hit("client").await.over_limit,
        "the interval ended; the ban goes on"
    );
    book.at(4_809_999);
    assert!(book.hit("client").await.over_limit);
    // Served: a new interval, a new quota.
    book.at(4_810_000);
    assert_eq!(book.grants_until_rejected("client").await, 2_000);
    // Another client is never affected.
    assert!(!book.hit("other").await.over_limit);
}

#[tokio::test]
async fn sliding_log_keeps_a_hammering_client_out() {
    let book = Cookbook::load("sliding-log.yaml");
    book.at(0);
    assert_eq!(book.grants_until_rejected("client").await, 10);
    // Asking every 100 ms keeps it out: each refusal is logged.
    for step in 1..=30 {
        book.at(step * 100);
        assert!(book.hit("client").await.over_limit, "at {} ms", step * 100);
    }
    // A whole second of quiet: the 10 newest hits have left.
    book.at(3_000 + 1_001);
    assert_eq!(book.grants_until_rejected("client").await, 10);
}

#[tokio::test]
async fn sliding_window_counts_the_last_minute_into_this_one() {
    let book = Cookbook::load("sliding-window.yaml");
    // 100 in the last second of a minute (the clock's minutes end at
    // 40 000 + k · 60 000 ms here).
    book.at(99_000);
    assert_eq!(book.grants_until_rejected("client").await, 100);
    // A fixed window would give 100 more at 100 000; here the last minute
    // still weighs 100 · (1 − elapsed/60 s): 15 s in, 75 of them count.
    book.at(115_000);
    assert_eq!(book.grants_until_rejected("client").await, 25);
}

#[tokio::test]
async fn token_bucket_on_a_resource_under_hard_and_global_limits() {
    let book = Cookbook::load("token-bucket-resource.yaml");
    book.at(0);
    // A burst of 20 is allowed by the bucket, but H = 15 per second caps it.
    assert_eq!(book.grants_until_rejected("client").await, 15);
    let rejected = book.hit("client").await;
    assert_eq!(retry_after(&rejected), 1_001, "H frees up after a second");
    // bigcorp has its own bucket (100 at once), but G = 100 per second
    // across tenants leaves it 85 now.
    assert_eq!(book.grants_until_rejected("bigcorp").await, 85);
    assert_eq!(retry_after(&book.hit("bigcorp").await), 1_001);
    // Later the bucket is what limits: one hit every 100 ms on average.
    book.at(60_000);
    assert_eq!(book.grants_until_rejected("client").await, 15);
    book.at(61_001);
    // 15 spent 1 s ago: the bucket has refilled 10 and had 5 left.
    assert_eq!(book.grants_until_rejected("client").await, 15);
    book.at(62_002);
    assert_eq!(book.grants_until_rejected("client").await, 10);
    let rejected = book.hit("client").await;
    // The next 100 ms slot opens at 62 100 ms: exactly 98 ms from now.
    assert_eq!(retry_after(&rejected), 98);
}

#[tokio::test]
async fn soft_limit_warns_past_eighty_percent_before_the_hard_limit() {
    let book = Cookbook::load("soft-limit.yaml");
    book.at(0);
    let mut seen = Vec::new();
    for _ in 0..11 {
        let status = book.hit("client").await;
        seen.push((status.over_limit, status.soft_limit_exceeded));
    }
    let quiet = (false, false);
    let warned = (false, true);
    let mut expected = vec![quiet; 8];
    expected.extend([warned, warned, (true, false)]);
    assert_eq!(
        seen, expected,
        "8 quiet, 2 warned, then refused (never warned)"
    );
}

impl Cookbook {
    /// One request with both descriptors of the quota-and-linear pair;
    /// whether it was refused.
    async fn paced(&self, tenant: &str) -> bool {
        let request = RateLimitRequest::new(
            self.namespace.clone(),
            vec![
                Descriptor::new([("tenant", tenant)]),
                Descriptor::new([("tenant", tenant), ("pace", "linear")]),
            ],
        );
        let answer = self
            .limiter
            .should_rate_limit(request)
            .await
            .expect("answer");
        answer.over_limit
    }

    async fn paced_until_refused(&self, tenant: &str) -> u64 {
        let mut granted = 0;
        while !self.paced(tenant).await {
            granted += 1;
            assert!(granted < 100_000, "never refused");
        }
        granted
    }
}

#[tokio::test]
async fn a_quota_and_a_linear_limiter_in_parallel_burst_once_then_pace() {
    let book = Cookbook::load("quota-and-linear.yaml");
    // The clock starts 20 s into a minute: minutes end at 40 s, 100 s, ...
    book.at(10_000);
    // A quiet client: its minute's quota at once (the linear limiter's
    // burst is as large).
    assert_eq!(book.paced_until_refused("client").await, 60);
    // Spent: nothing until the minute ends, though the linear limiter
    // saves one a second meanwhile.
    book.at(39_999);
    assert!(book.paced("client").await);
    // The next minute's quota is whole, but the linear limiter saved only
    // 30 since the burst (and the refusals cost it nothing): 30 at once,
    // then one a second until the quota's 60 are spent.
    book.at(40_000);
    assert_eq!(book.paced_until_refused("client").await, 30);
    for second in 1..=30 {
        book.at(40_000 + second * 1_000);
        assert!(!book.paced("client").await, "second {second}");
        assert!(book.paced("client").await, "second {second}");
    }
    book.at(71_000);
    assert!(book.paced("client").await, "the quota is spent");
    // A long quiet spell: both whole again, a burst of 60 (as with the
    // hybrid). Where they differ is above: what the linear limiter saved
    // while the quota was spent came as a burst of 30 when the minute
    // ended; the hybrid holds a client that spent its quota to one a second.
    book.at(400_000);
    assert_eq!(book.paced_until_refused("client").await, 60);
}

/// Milliseconds since the epoch of an RFC 3339 instant.
fn instant(text: &str) -> u64 {
    let at: jiff::Timestamp = text.parse().expect("an RFC 3339 instant");
    u64::try_from(at.as_millisecond()).expect("after the epoch")
}

/// The window the status reports, and its reset.
fn window_and_reset(status: &DescriptorStatus) -> (u64, u64) {
    let limit = status.limit.as_ref().expect("a limit");
    (limit.window_ms, status.reset_after_ms.expect("a reset"))
}

const HOUR: u64 = 3_600_000;
const DAY: u64 = 24 * HOUR;

#[tokio::test]
async fn a_calendar_month_ends_at_midnight_in_its_zone() {
    let book = Cookbook::load("calendar.yaml");
    // 23:59 on 29 February 2024 in Paris (UTC+1): a leap February.
    book.clock.set(instant("2024-02-29T22:59:00Z"));
    assert_eq!(book.grants_until_rejected("anyone").await, 3);
    let refused = book.hit("anyone").await;
    assert_eq!(window_and_reset(&refused), (29 * DAY, 60_000));
    // Midnight in Paris: March, its 31 days less the hour daylight saving
    // takes on its last Sunday.
    book.clock.set(instant("2024-02-29T23:00:00Z"));
    let granted = book.hit("anyone").await;
    assert!(!granted.over_limit);
    assert_eq!(
        window_and_reset(&granted),
        (31 * DAY - HOUR, 31 * DAY - HOUR)
    );
    assert_eq!(book.grants_until_rejected("anyone").await, 2);
}

#[tokio::test]
async fn a_billing_month_from_the_31st_ends_on_a_short_months_last_day() {
    let book = Cookbook::load("calendar.yaml");
    // acme's month: 31 January to 28 February 2025 (28 days).
    book.clock.set(instant("2025-02-27T12:00:00Z"));
    assert_eq!(book.grants_until_rejected("acme").await, 2);
    let refused = book.hit("acme").await;
    assert_eq!(window_and_reset(&refused), (28 * DAY, 12 * HOUR));
    // From 28 February to 31 March.
    book.clock.set(instant("2025-02-28T00:00:00Z"));
    assert_eq!(book.grants_until_rejected("acme").await, 2);
    assert_eq!(
        window_and_reset(&book.hit("acme").await),
        (31 * DAY, 31 * DAY)
    );
}

#[tokio::test]
async fn a_calendar_day_across_a_dst_change_is_23_hours() {
    let book = Cookbook::load("calendar.yaml");
    // 9 March 2025 in New York: clocks go forward at 2:00, the day has 23
    // hours, from 05:00Z to 04:00Z the next day.
    book.clock.set(instant("2025-03-09T16:00:00Z"));
    assert_eq!(book.grants_until_rejected("night-owl").await, 1);
    let refused = book.hit("night-owl").await;
    assert_eq!(window_and_reset(&refused), (23 * HOUR, 12 * HOUR));
    book.clock.set(instant("2025-03-10T03:59:59.999Z"));
    assert!(book.hit("night-owl").await.over_limit);
    book.clock.set(instant("2025-03-10T04:00:00Z"));
    assert!(!book.hit("night-owl").await.over_limit);
}

#[tokio::test]
async fn learning_proposes_each_address_and_tenant_its_peak() {
    use charon::config::learned::Pick;
    use charon::limiter::Modes;
    use charon::service::ops::{RateRequest, ResourceKey};
    use charon::service::{Service, Unobserved};
    use charon::store::MemoryLearn;
    use charon::store::open::Stores;
    use std::sync::Arc;

    let path = format!(
        "{}/examples/cookbook/learn.yaml",
        env!("CARGO_MANIFEST_DIR")
    );
    let loaded = config::load_path(path.as_ref()).expect("cookbook example loads");
    let clock = ManualClock::new(START);
    let service = Service::new(
        loaded.config,
        Stores {
            learn: Arc::new(MemoryLearn::with_clock(Arc::new(clock.clone()))),
            ..Stores::memory(charon::store::DEFAULT_MAX_KEYS)
        },
        Modes::default(),
        Arc::new(Unobserved),
        Arc::new(clock.clone()),
    );
    for minute in 0..3u64 {
        clock.set(START + minute * 60_000);
        for hit in 0..(700 + minute) {
            let address = if hit % 7 == 0 { "10.0.0.2" } else { "10.0.0.1" };
            let request = RateLimitRequest::new(
                "cookbook-learn",
                vec![Descriptor::new([("remote_address", address)])],
            );
            let answer = service
                .limiter
                .should_rate_limit(request)
                .await
                .expect("decided");
            assert!(!answer.over_limit, "shadow mode refuses nothing");
        }
        let op = RateRequest::new(
            ResourceKey::new("cookbook-learn", "search", "acme"),
            Some(40),
            None,
        )
        .expect("valid");
        assert_eq!(service.request(&op).await.expect("unlimited").granted, 40);
    }
    clock.set(START + 3 * 60_000);
    let text = service
        .proposal("cookbook-learn", Pick::Peak)
        .await
        .expect("a proposal");
    config::load_str(&text, "proposal.yaml").unwrap_or_else(|errors| panic!("{errors}\n{text}"));
    for expected in [
        "value: \"10.0.0.1\"\n    rate_limit: {unit: minute, requests_per_unit: 601}",
        "value: \"10.0.0.2\"\n    rate_limit: {unit: minute, requests_per_unit: 101}",
        "\"acme\": {tiers: [{limit: 40, window: 1m, active: forever}]}",
    ] {
        assert!(text.contains(expected), "no {expected} in:\n{text}");
    }
}
