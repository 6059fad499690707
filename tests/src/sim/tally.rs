//! [`Tally`]: what a run offered and admitted.

/// The requests offered and admitted, as the run goes.
pub(super) struct Tally {
    /// Fractional arrivals carried between steps, per (user, node).
    pub(super) owed: Vec<Vec<f64>>,
    pub(super) rates: Vec<Vec<f64>>,
    /// The (user, node) pairs with demand, as of the last read of the rates.
    pub(super) active: Vec<(usize, usize)>,
    /// Whether each user offers less than their limit: only their refusals
    /// count against the policy.
    pub(super) under: Vec<bool>,
    /// Slots at the start whose refusals of others are not counted: a
    /// bucket that starts with one second's worth is split over the nodes
    /// until the users' first reports.
    pub(super) warm_up: usize,
    /// Per user, per slot (the measured user's is the first).
    pub(super) admitted: Vec<Vec<i64>>,
    pub(super) offered: Vec<i64>,
    /// Per user, per slot: what they offered.
    pub(super) offered_by: Vec<Vec<i64>>,
    pub(super) others_refused: u64,
    pub(super) deepest: f64,
}

impl Tally {
    /// Nothing yet, for `users` users at `nodes` nodes over `slots` slots.
    pub(super) fn new(users: usize, nodes: usize, slots: usize, warm_up: usize) -> Self {
        Self {
            warm_up,
            owed: vec![vec![0.0; nodes]; users],
            rates: vec![vec![0.0; nodes]; users],
            active: Vec::new(),
            under: vec![true; users],
            admitted: vec![vec![0; slots + 1]; users],
            offered: vec![0; slots + 1],
            offered_by: vec![vec![0; slots + 1]; users],
            others_refused: 0,
            deepest: f64::INFINITY,
        }
    }

    /// One request of user `u` in slot `index`, of `cost`, admitted or not.
    pub(super) fn count(&mut self, u: usize, index: usize, cost: i64, ok: bool) {
        if ok {
            self.admitted[u][index] += cost;
        }
        self.offered_by[u][index] += cost;
        if u == 0 {
            self.offered[index] += cost;
        } else if !ok && self.under[u] && index >= self.warm_up {
            self.others_refused += 1;
        }
    }
}
