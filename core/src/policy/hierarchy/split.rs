//! One slot's capacity of one resource split between applications.

use super::fill::fill;

/// What an application asks of one slot's capacity, in units per slot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ask {
    /// 0 is served first.
    pub priority: u32,
    /// Given first, up to its demand.
    pub guaranteed: f64,
    /// The most it may be given: its burst ceiling while its burst
    /// allowance lasts, else its guarantee (never below it).
    pub ceiling: f64,
    /// What its users would use: their consumption and refusals, each
    /// user's capped by the user's own limits.
    pub demand: f64,
}

/// What an application is given of one slot's capacity.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Share {
    /// What serves its demand.
    pub served: f64,
    /// `served` and the headroom lent beside it: room to grow into
    /// that nobody else asked for.
    pub granted: f64,
}

/// Splits `capacity` between `asks` (the shares in the same order):
///
/// 1. guarantees, up to each demand, higher priorities first; within a
///    priority in proportion to what each asks, should they not all fit;
/// 2. what remains to applications demanding more, up to their ceilings,
///    higher priorities first and in proportion to demand within one;
/// 3. what still remains, as headroom: first up to each guarantee, so an
///    application below it can grow back to it at once, then up to each
///    ceiling in proportion to demand.
///
/// The shares never add up to more than `capacity`; capacity nobody
/// asked for is lent, never kept back, except beyond every ceiling.
pub fn split(capacity: f64, asks: &[Ask], scratch: &mut Scratch) -> Vec<Share> {
    let n = asks.len();
    let mut given = vec![0.0; n];
    let mut left = capacity.max(0.0);
    let guarantee = |a: &Ask| a.guaranteed.min(a.demand).max(0.0);
    let ceiling = |a: &Ask| a.ceiling.max(a.guaranteed).min(a.demand).max(0.0);
    // 1 and 2: demand.
    left = by_priority(left, asks, &mut given, scratch, guarantee, guarantee);
    left = by_priority(left, asks, &mut given, scratch, |a| a.demand, ceiling);
    let served = given.clone();
    // 3: headroom.
    left = by_priority(
        left,
        asks,
        &mut given,
        scratch,
        |a| a.guaranteed,
        |a| a.guaranteed,
    );
    by_priority(
        left,
        asks,
        &mut given,
        scratch,
        |a| a.demand,
        |a| a.ceiling.max(a.guaranteed),
    );
    served
        .into_iter()
        .zip(given)
        .map(|(served, granted)| Share { served, granted })
        .collect()
}

/// Scratch space for [`split`], kept between calls.
#[derive(Debug, Default)]
pub struct Scratch {
    order: Vec<usize>,
    fill: Vec<usize>,
    weights: Vec<f64>,
    room: Vec<f64>,
    part: Vec<f64>,
}

/// One pass: priority by priority, the applications of each share what
/// is left in proportion to `weight`, each up to `target` in all.
fn by_priority(
    mut left: f64,
    asks: &[Ask],
    given: &mut [f64],
    s: &mut Scratch,
    weight: impl Fn(&Ask) -> f64,
    target: impl Fn(&Ask) -> f64,
) -> f64 {
    s.order.clear();
    s.order.extend(0..asks.len());
    s.order.sort_by_key(|&i| asks[i].priority);
    let mut start = 0;
    while start < s.order.len() && left > 0.0 {
        let priority = asks[s.order[start]].priority;
        let end = start
            + s.order[start..]
                .iter()
                .take_while(|&&i| asks[i].priority == priority)
                .count();
        let group = &s.order[start..end];
        s.weights.clear();
        s.room.clear();
        for &i in group {
            s.weights.push(weight(&asks[i]));
            s.room.push((target(&asks[i]) - given[i]).max(0.0));
        }
        s.part.clear();
        s.part.resize(group.len(), 0.0);
        left = fill(left, &s.weights, &s.room, &mut s.part, &mut s.fill);
        for (&i, part) in group.iter().zip(&s.part) {
            given[i] += part;
        }
        start = end;
    }
    left
}
