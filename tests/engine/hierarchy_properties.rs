//! A hierarchy of servers (docs/design.md#a-hierarchy-of-servers), decided
//! by the engine alone over random trees: a root, regions, leaves and their
//! clients, each level asking its parent every refresh interval the parent
//! gives, links that go down, clients that change what they want or
//! leave. The engine's [`under_grant`] and [`request_want`] are what the
//! sidecar runs; this test only plays the rounds on one simulated clock.

use charon::engine::capacity::{
    Algorithm, CapacityConfig, Grant, LeaseState, Want, live_sum, live_wants, release, request,
    request_want, under_grant,
};
use proptest::prelude::*;

const TICK_MS: u64 = 50;
/// The link asks again no sooner than this, and this long after a failure.
const FASTEST_MS: u64 = 100;
const RETRY_MS: u64 = 1_000;
const CAPACITY: f64 = 100.0;

/// A server of the tree; `nodes[0]` is the root.
struct Node {
    id: String,
    parent: Option<usize>,
    config: CapacityConfig,
    /// The leases this node gave its children (levels or clients).
    state: LeaseState,
    /// What its parent granted it (never for the root).
    grant: Option<Grant>,
    next_round_ms: u64,
    link_down_until_ms: u64,
}

struct Client {
    id: String,
    leaf: usize,
    wants: f64,
    has: f64,
    next_renewal_ms: u64,
    gone: bool,
}

struct Tree {
    nodes: Vec<Node>,
    clients: Vec<Client>,
    now_ms: u64,
}

fn config(capacity: f64, algorithm: Algorithm, refresh_interval_ms: u64) -> CapacityConfig {
    lending(capacity, algorithm, refresh_interval_ms, false)
}

/// [`config`], lending the spare (as a global limit's levels do) or not.
fn lending(
    capacity: f64,
    algorithm: Algorithm,
    refresh_interval_ms: u64,
    lends_spare: bool,
) -> CapacityConfig {
    CapacityConfig {
        capacity,
        algorithm,
        lease_ms: 2_000,
        refresh_interval_ms,
        safe_capacity: None,
        learning_ms: 0,
        whole_units: false,
        lends_spare,
    }
}

impl Tree {
    /// `leaves[r]` leaves in region `r`, `clients[l]` clients on leaf `l`
    /// (counted over all leaves, cycling).
    fn new(algorithm: Algorithm, lends: bool, leaves: &[usize], clients: &[f64]) -> Self {
        let node = |id: String, parent, refresh_ms, offset_ms| Node {
            id,
            parent,
            // Below the root, the configured capacity only bounds: the
            // grant is what counts.
            config: lending(
                if parent.is_some() {
                    10.0 * CAPACITY
                } else {
                    CAPACITY
                },
                algorithm,
                refresh_ms,
                lends,
            ),
            state: LeaseState::new(0),
            grant: None,
            next_round_ms: offset_ms,
            link_down_until_ms: 0,
        };
        // Refresh intervals shrink going up: leaf 500, region 300, root 200.
        let mut nodes = vec![node("root".into(), None, 200, 0)];
        let mut leaf_ids = Vec::new();
        for (region, &count) in leaves.iter().enumerate() {
            let region_index = nodes.len();
            nodes.push(node(
                format!("region-{region}"),
                Some(0),
                300,
                (region as u64 * 70) % 200,
            ));
            for leaf in 0..count {
                leaf_ids.push(nodes.len());
                nodes.push(node(
                    format!("leaf-{region}-{leaf}"),
                    Some(region_index),
                    500,
                    (leaf as u64 * 110) % 300,
                ));
            }
        }
        let clients = clients
            .iter()
            .enumerate()
            .map(|(index, &wants)| Client {
                id: format!("client-{index}"),
                leaf: leaf_ids[index % leaf_ids.len()],
                wants,
                has: 0.0,
                next_renewal_ms: (index as u64 * 130) % 500,
                gone: false,
            })
            .collect();
        Self {
            nodes,
            clients,
            now_ms: 0,
        }
    }

    /// The configuration `node` apportions with now.
    fn effective(&self, node: usize) -> CapacityConfig {
        let node = &self.nodes[node];
        match node.parent {
            None => node.config,
            Some(_) => under_grant(&node.config, node.grant, self.now_ms),
        }
    }

    /// One round of `node`'s link to its parent.
    fn round(&mut self, node: usize) -> Result<(), TestCaseError> {
        let now = self.now_ms;
        let Some(parent) = self.nodes[node].parent else {
            return Ok(());
        };
        if now < self.nodes[node].link_down_until_ms {
            self.nodes[node].next_round_ms = now + RETRY_MS;
            return Ok(());
        }
        let own = &self.nodes[node];
        let want = Want {
            wants: live_wants(&own.state, now),
            has: own
                .grant
                .filter(|grant| now < grant.expiry_ms)
                .map_or(0.0, |grant| grant.capacity),
            held_below: Some(live_sum(&own.state, now)),
        };
        let id = own.id.clone();
        let parent_config = self.effective(parent);
        let lease = request_want(
            &parent_config,
            &mut self.nodes[parent].state,
            &id,
            want,
            now,
        )
        .map_err(|error| TestCaseError::fail(error.to_string()))?;
        // Nested expiry: a grant ends no later than the parent's own.
        if let Some(grant) = self.nodes[parent].grant.filter(|_| lease.capacity > 0.0) {
            prop_assert!(
                lease.expiry_ms <= grant.expiry_ms,
                "{id} outlives its parent"
            );
        }
        let own = &mut self.nodes[node];
        own.grant = Some(Grant {
            capacity: lease.capacity,
            expiry_ms: lease.expiry_ms,
            refresh_interval_ms: lease.refresh_interval_ms,
            moving: lease.refresh_interval_ms < parent_config.refresh_interval_ms,
            safe_capacity: lease.safe_capacity,
        });
        own.next_round_ms = now + lease.refresh_interval_ms.max(FASTEST_MS);
        Ok(())
    }

    fn renew(&mut self, client: usize) -> Result<(), TestCaseError> {
        let now = self.now_ms;
        let leaf = self.clients[client].leaf;
        let config = self.effective(leaf);
        let who = &self.clients[client];
        let lease = request(
            &config,
            &mut self.nodes[leaf].state,
            &who.id,
            who.wants,
            who.has,
            now,
        )
        .map_err(|error| TestCaseError::fail(error.to_string()))?;
        // Lent spare: a client that wants some may get up to the root's
        // whole capacity, one that wants none nothing.
        let most = if config.lends_spare && who.wants > 0.0 {
            CAPACITY
        } else {
            who.wants
        };
        prop_assert!(
            lease.capacity <= most + 1e-9,
            "{} got more than it wants",
            who.id
        );
        if let Some(grant) = self.nodes[leaf].grant.filter(|_| lease.capacity > 0.0) {
            prop_assert!(
                lease.expiry_ms <= grant.expiry_ms,
                "{} outlives its leaf",
                who.id
            );
        }
        let who = &mut self.clients[client];
        who.has = lease.capacity;
        who.next_renewal_ms = now + lease.refresh_interval_ms.max(TICK_MS);
        Ok(())
    }

    /// Everything due this tick, in an order drawn from `order`.
    fn tick(&mut self, order: &mut u64) -> Result<(), TestCaseError> {
        let now = self.now_ms;
        let mut due: Vec<(bool, usize)> = (0..self.nodes.len())
            .filter(|&node| self.nodes[node].next_round_ms <= now)
            .map(|node| (true, node))
            .chain(
                (0..self.clients.len())
                    .filter(|&client| {
                        !self.clients[client].gone && self.clients[client].next_renewal_ms <= now
                    })
                    .map(|client| (false, client)),
            )
            .collect();
        // A Fisher-Yates shuffle from a splitmix-like sequence.
        for index in (1..due.len()).rev() {
            *order = order.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = *order;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            due.swap(index, ((z ^ (z >> 31)) % (index as u64 + 1)) as usize);
        }
        for (is_node, index) in due {
            if is_node {
                self.round(index)?;
            } else {
                self.renew(index)?;
            }
            self.check()?;
        }
        Ok(())
    }

    /// What must hold at every instant.
    fn check(&self) -> Result<(), TestCaseError> {
        let now = self.now_ms;
        let slack = 1e-9 * CAPACITY;
        let root = live_sum(&self.nodes[0].state, now);
        prop_assert!(
            root <= CAPACITY + slack,
            "the root leased {root} of {CAPACITY}"
        );
        for node in &self.nodes {
            let Some(parent) = node.parent else { continue };
            let held = live_sum(&node.state, now);
            let counted = self.nodes[parent]
                .state
                .clients
                .get(&node.id)
                .filter(|lease| now < lease.expiry_ms)
                .map_or(0.0, |lease| lease.has);
            prop_assert!(
                held <= counted + slack,
                "at {now} ms {} leased {held} below, its parent counts {counted}",
                node.id
            );
        }
        Ok(())
    }

    fn run_until(&mut self, end_ms: u64, order: &mut u64) -> Result<(), TestCaseError> {
        while self.now_ms < end_ms {
            self.tick(order)?;
            self.now_ms += TICK_MS;
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
enum Event {
    Wants { client: usize, wants: f64 },
    Leave { client: usize, release: bool },
    LinkDown { node: usize, for_ms: u64 },
}

fn event() -> impl Strategy<Value = (u64, Event)> {
    let event = prop_oneof![
        4 => (0usize..64, 0.0f64..120.0)
            .prop_map(|(client, wants)| Event::Wants { client, wants }),
        1 => (0usize..64, any::<bool>())
            .prop_map(|(client, release)| Event::Leave { client, release }),
        1 => (1usize..16, 100u64..4_000)
            .prop_map(|(node, for_ms)| Event::LinkDown { node, for_ms }),
    ];
    (0u64..200, event)
}

fn algorithm() -> impl Strategy<Value = Algorithm> {
    prop_oneof![
        Just(Algorithm::FairShare),
        Just(Algorithm::ProportionalShare),
        (1.0f64..60.0).prop_map(|per_client| Algorithm::Static {
            per_client: Some(per_client)
        }),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the tree, the demand and the outages: what a level's
    /// clients hold never exceeds what its parent counts it as holding,
    /// the root never leases more than its capacity, no lease outlives
    /// its parent's, and no client gets more than it wants (or, with the
    /// spare lent, more than the root has). Once nothing changes, the
    /// clients hold all of the capacity they want, up to the root's (with
    /// the spare lent, all of the root's): every level passes on what it is
    /// granted.
    #[test]
    fn a_tree_of_levels_never_leases_more_than_the_root_has(
        algorithm in algorithm(),
        lends in any::<bool>(),
        leaves in prop::collection::vec(1usize..=3, 1..=3),
        wants in prop::collection::vec(0.0f64..120.0, 1..=12),
        mut events in prop::collection::vec(event(), 0..24),
        mut order in any::<u64>(),
    ) {
        let mut tree = Tree::new(algorithm, lends, &leaves, &wants);
        events.sort_by_key(|(tick, _)| *tick);
        for (tick, event) in events {
            tree.run_until(tick * TICK_MS, &mut order)?;
            match event {
                Event::Wants { client, wants } => {
                    let count = tree.clients.len();
                    tree.clients[client % count].wants = wants;
                }
                Event::Leave { client, release: give_back } => {
                    let count = tree.clients.len();
                    let who = &mut tree.clients[client % count];
                    who.gone = true;
                    if give_back {
                        release(&mut tree.nodes[who.leaf].state, &who.id);
                    }
                }
                Event::LinkDown { node, for_ms } => {
                    let count = tree.nodes.len();
                    let index = 1 + node % (count - 1);
                    tree.nodes[index].link_down_until_ms = tree.now_ms + for_ms;
                }
            }
        }
        // Quiet: no change, and no outage after the last one ends (4 s at
        // most, then a retry), long enough for the shrunk shares to be given
        // back level by level and the grown ones handed down.
        tree.run_until(200 * TICK_MS + 4_000 + RETRY_MS + 8_000, &mut order)?;
        let now = tree.now_ms;
        let wanted: f64 = tree.clients.iter().filter(|c| !c.gone).map(|c| c.wants).sum();
        let held: f64 = tree.clients.iter().filter(|c| !c.gone).map(|c| c.has).sum();
        let root = &tree.nodes[0].state;
        prop_assert!(live_wants(root, now) <= wanted + 1e-6);
        if matches!(algorithm, Algorithm::FairShare | Algorithm::ProportionalShare) {
            // Lending, every level passes its spare down to the clients that
            // want some: they hold all of the root's capacity.
            let expected = match (lends, wanted > 0.0) {
                (true, true) => CAPACITY,
                _ => wanted.min(CAPACITY),
            };
            prop_assert!(
                (held - expected).abs() <= 1e-6 * CAPACITY,
                "the clients hold {held} of the {expected} they could"
            );
        }
    }
}

/// A level whose grant shrinks keeps being counted for what its clients
/// still hold, so its sibling gets the difference only once it is given
/// back — never while both would hold it.
#[test]
fn a_shrunk_grant_is_given_away_only_once_it_is_given_back() {
    let config = config(CAPACITY, Algorithm::FairShare, 200);
    let mut root = LeaseState::new(0);
    let level = |wants, has, held_below| Want {
        wants,
        has,
        held_below: Some(held_below),
    };
    let ask = |state: &mut LeaseState, id, want, now| {
        request_want(&config, state, id, want, now).map(|lease| lease.capacity)
    };
    assert_eq!(ask(&mut root, "a", level(100.0, 0.0, 0.0), 0), Ok(100.0));
    // b joins: a's share falls to 50, but its clients still hold 100.
    assert_eq!(ask(&mut root, "b", level(100.0, 0.0, 0.0), 100), Ok(0.0));
    assert_eq!(
        ask(&mut root, "a", level(100.0, 100.0, 100.0), 200),
        Ok(50.0)
    );
    assert_eq!(root.clients["a"].has, 100.0);
    assert_eq!(ask(&mut root, "b", level(100.0, 0.0, 0.0), 300), Ok(0.0));
    // A level cannot be counted for more than it was ever given.
    assert_eq!(
        ask(&mut root, "a", level(100.0, 50.0, 500.0), 400),
        Ok(50.0)
    );
    assert_eq!(root.clients["a"].has, 100.0);
    // Its clients renewed under 50: the rest goes to b.
    assert_eq!(ask(&mut root, "a", level(100.0, 50.0, 50.0), 500), Ok(50.0));
    assert_eq!(root.clients["a"].has, 50.0);
    assert_eq!(ask(&mut root, "b", level(100.0, 0.0, 0.0), 600), Ok(50.0));
    assert_eq!(live_sum(&root, 600), 100.0);
    // A level's word is checked like any amount.
    for bad in [f64::NAN, f64::INFINITY, -1.0] {
        assert!(ask(&mut root, "a", level(100.0, 50.0, bad), 700).is_err());
    }
    assert_eq!(root.clients["a"].has, 50.0);
}
